"""Layers the JAX models share (tf_layers.py is TensorFlow's side).

ExampleDropout: dropout whose mask for one example depends on (step, layer, call site,
example), never on how the batch is cut. flax's nn.Dropout draws one mask for the whole array
from the module's key, so the same example gets another mask when it is in another
micro-batch or at another row; a GPipe run (jax_pipeline.py) would then differ with K and M.
Here each example's mask comes from the module's key folded with the example's index in the
global batch: the step's key and the module path (the layer) are flax's, the index is the
one `examples(ids)` set around the apply (a pipeline stage sets its micro-batch's rows), or
0..B-1 for a whole batch.

remat_block: a model's repeated block (a ResNet bottleneck, an MBConv, a transformer layer)
wrapped in flax's nn.remat under `parallel.remat_policy` (harness/mesh.py REMAT_POLICIES):
'full' keeps only each block's input for the backward pass and recomputes the rest (the
least memory: a batch that does not fit otherwise); 'matmuls' keeps the outputs of the
matmuls and convolutions and recomputes what lies between them (normalisation, activations,
dropout, residual adds), which on a bandwidth-bound convnet also saves the memory traffic of
writing and reading those elementwise results. Without a policy the block is left as it is.
Gradients are the same either way (tests/parallel/test_jax_remat.py).

FlatDense: nn.Dense on the rows of [..., features] folded into one dimension. The math and the
parameters are nn.Dense's; what changes is the dot XLA is given: the kernel's gradient of a
3-D activation contracts two dimensions (batch and length), which XLA:CPU (jax 0.10.2) runs 4
to 5x slower than the same product on the folded rows (a SwiGLU block's gradient at [32, 64,
64]: 17.6 ms against 4.0 ms, bench/jax_flat_dense.py). The fold is a reshape of a row-major
array (a bitcast: nothing moves), and a sharding of the leading dimension carries over to the
folded one.
"""
import contextlib
import contextvars
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

_EXAMPLES = contextvars.ContextVar("jax_layers_examples", default=None)

_SAVED_BY_MATMULS = ("dot_general", "conv_general_dilated")
REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "matmuls": lambda prim, *_, **__: prim.name in _SAVED_BY_MATMULS,
}


def remat_block(block_cls, policy: str, static_argnums=()):
  """`block_cls`, or with a policy (see above) it wrapped in nn.remat; `static_argnums` are
  the positions (self = 0) of its call's Python arguments (train flags)."""
  if not policy:
    return block_cls
  if policy not in REMAT_POLICIES:
    raise ValueError(f"parallel.remat_policy={policy!r}; allowed: '', "
                     + ", ".join(REMAT_POLICIES))
  return nn.remat(block_cls, policy=REMAT_POLICIES[policy], static_argnums=static_argnums)


@contextlib.contextmanager
def examples(ids):
  """While a model is applied: `ids` [b] are the global batch indices of its rows."""
  token = _EXAMPLES.set(ids)
  try:
    yield
  finally:
    _EXAMPLES.reset(token)


class ExampleDropout(nn.Module):
  rate: float
  dtype: Any = None

  @nn.compact
  def __call__(self, x, deterministic: bool):
    if deterministic or self.rate == 0.0:
      return x
    key = self.make_rng("dropout")
    ids = _EXAMPLES.get()
    if ids is None:
      ids = jnp.arange(x.shape[0])
    keep_prob = 1.0 - self.rate
    keep = jax.vmap(lambda i: jax.random.bernoulli(jax.random.fold_in(key, i), keep_prob,
                                                   x.shape[1:]))(ids)
    return jax.lax.select(keep, x / keep_prob, jnp.zeros_like(x))


class FlatDense(nn.Dense):
  """nn.Dense computed on the leading dimensions folded into one (see the module note)."""

  def __call__(self, inputs):
    lead = inputs.shape[:-1]
    out = super().__call__(inputs.reshape((-1, inputs.shape[-1])))
    return out.reshape(lead + out.shape[-1:])
