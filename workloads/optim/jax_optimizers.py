"""Optimizers for the JAX side, as optax transformations.

LARS as MLPerf defines it (the reference ResNet's LARS, logged with the `lars_*` keys):

  for a weight w with gradient g (kernels only):
    trust = eta * ||w|| / (||g|| + wd * ||w|| + eps)     (1 where ||w|| or ||g|| is 0)
    v     = momentum * v + lr * trust * (g + wd * w)
  for bias and batch-norm parameters: no weight decay and no trust ratio:
    v     = momentum * v + lr * g
  w = w - v

Why not `optax.lars`: it chains add_decayed_weights -> scale_by_trust_ratio, so its trust ratio
divides by ||g + wd * w|| rather than ||g|| + wd * ||w||, and its `eps` sits in a different place.
The two differ whenever g and w are not parallel, so this file implements the MLPerf formula.
"""
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax


def decay_mask(params) -> Any:
  """True for parameters that get weight decay and a trust ratio: the conv/dense kernels.

  The role comes from flax's leaf names: `kernel` for weights, `bias`/`scale` for biases and
  batch-norm parameters (AlgoPerf's parameter types, read off the flax convention).
  """
  def is_kernel(path, _):
    return getattr(path[-1], "key", None) == "kernel"
  return jax.tree_util.tree_map_with_path(is_kernel, params)


class LarsState(NamedTuple):
  count: jax.Array
  momentum: Any


def mlperf_lars(learning_rate: Callable, weight_decay: float, momentum: float = 0.9,
                eta: float = 0.001, epsilon: float = 0.0, mask=decay_mask
                ) -> optax.GradientTransformation:
  def init(params):
    return LarsState(count=jnp.zeros([], jnp.int32),
                     momentum=jax.tree.map(jnp.zeros_like, params))

  def update(grads, state, params):
    lr = learning_rate(state.count)
    decayed = mask(params) if callable(mask) else mask

    def scaled_grad(g, w, use_lars):
      if not use_lars:
        return lr * g
      w_norm = jnp.linalg.norm(w)
      g_norm = jnp.linalg.norm(g)
      trust = jnp.where((w_norm > 0) & (g_norm > 0),
                        eta * w_norm / (g_norm + weight_decay * w_norm + epsilon), 1.0)
      return lr * trust * (g + weight_decay * w)

    scaled = jax.tree.map(scaled_grad, grads, params, decayed)
    new_momentum = jax.tree.map(lambda v, s: momentum * v + s, state.momentum, scaled)
    updates = jax.tree.map(jnp.negative, new_momentum)
    return updates, LarsState(count=state.count + 1, momentum=new_momentum)

  return optax.GradientTransformation(init, update)


def sgd_momentum(learning_rate: Callable, weight_decay: float, momentum: float = 0.9,
                 mask=decay_mask) -> optax.GradientTransformation:
  """SGD with momentum as the MLPerf reference's tf.compat.v1 MomentumOptimizer does it:
  v = m * v + (g + wd * w); w = w - lr * v, with weight decay on kernels only."""
  return optax.chain(optax.add_decayed_weights(weight_decay, mask=mask),
                     optax.sgd(learning_rate, momentum=momentum))


def make_optimizer(opt_cfg, schedule) -> optax.GradientTransformation:
  lr = lambda step: schedule(step, ops=jnp)
  if opt_cfg.name == "lars":
    return mlperf_lars(lr, opt_cfg.weight_decay, opt_cfg.momentum, opt_cfg.lars_eta,
                       opt_cfg.lars_epsilon)
  return sgd_momentum(lr, opt_cfg.weight_decay, opt_cfg.momentum)
