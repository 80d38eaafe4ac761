"""parallel.remat_policy (workloads/parallel/jax_layers.remat_block): with each policy the
blocks are really rematerialised (a checkpoint with the policy in the loss's jaxpr) and
the loss, every gradient and the batch-norm statistics equal the run without, in float64:
ResNet (batch norm updated inside the block, the train flag static) and the Transformer
(per-example dropout drawn inside the block: the recomputed masks must be the ones the
forward used)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness.errors import UsageError
from tests.conftest import rel_err
from workloads.parallel import jax_layers
from workloads.resnet import jax_model as resnet_model
from workloads.resnet import spec as resnet_spec
from workloads.transformer import jax_model as transformer_model
from workloads.transformer import spec as transformer_spec

pytestmark = pytest.mark.usefixtures("jax_float64")     # tests/conftest.py
TOL = 1e-12


def resnet_loss(policy):
  cfg = resnet_spec.SPEC.configure("tiny", [f"parallel.remat_policy={policy}"])
  model = resnet_model.build(cfg, jnp.float64)
  images = np.random.default_rng(0).normal(
      size=(2, cfg.data.image_size, cfg.data.image_size, 3))
  variables = model.init(jax.random.PRNGKey(0), images, train=False)

  def loss(params):
    logits, updates = model.apply({"params": params, "batch_stats": variables["batch_stats"]},
                                  images, True, mutable=["batch_stats"])
    return jnp.sum(jnp.sin(logits)), updates["batch_stats"]
  return loss, variables["params"]


def transformer_loss(policy):
  cfg = transformer_spec.SPEC.configure("tiny", [f"parallel.remat_policy={policy}",
                                                 "model.vocab_size=23"])
  assert cfg.model.attention_dropout > 0 and cfg.model.dropout > 0
  model = transformer_model.build(cfg, jnp.float64)
  inputs = np.array([[5, 6, 7, 8, 1, 0], [9, 4, 1, 0, 0, 0]], np.int32)
  targets = np.array([[3, 4, 1, 0, 0], [7, 1, 0, 0, 0]], np.int32)
  params = model.init(jax.random.PRNGKey(0), inputs, targets)["params"]

  def loss(params):
    logits = model.apply({"params": params}, inputs, targets, True,
                         rngs={"dropout": jax.random.PRNGKey(3)})
    return jnp.sum(jnp.sin(logits)), ()
  return loss, params


def remat_policies(jaxpr):
  """The policies of the rematerialised calls (jax.checkpoint's primitive) in a jaxpr."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in ("checkpoint", "remat2"):
      found.append(eqn.params["policy"])
    for sub in jax.core.jaxprs_in_params(eqn.params):
      found += remat_policies(sub)
  return found


# One policy a model (each model's block under both showed nothing more; suite time): the
# convnet under 'matmuls' (batch-norm statistics and activations recomputed from the saved conv
# outputs), the Transformer under 'full' (its dropout masks drawn again in the recomputation).
@pytest.mark.parametrize("build,policy", [(resnet_loss, "matmuls"), (transformer_loss, "full")],
                         ids=["resnet-matmuls", "transformer-full"])
def test_remat_policies_change_memory_not_results(build, policy):
  loss, params = build("")
  (value, aux), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  assert not remat_policies(jax.make_jaxpr(loss)(params).jaxpr)
  loss_r, _ = build(policy)
  policies = remat_policies(jax.make_jaxpr(loss_r)(params).jaxpr)
  assert policies and all(p is jax_layers.REMAT_POLICIES[policy] for p in policies)
  (value_r, aux_r), grads_r = jax.jit(jax.value_and_grad(loss_r, has_aux=True))(params)
  assert rel_err(value_r, value) < TOL
  for tree, tree_r in ((grads, grads_r), (aux, aux_r)):
    for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(tree_r)):
      assert rel_err(b, a) < TOL


def test_unknown_policy_is_refused_before_a_framework_loads():
  with pytest.raises(UsageError, match=r"parallel.remat_policy='dots' is not a remat policy; "
                                       r"allowed: '', 'full', 'matmuls'"):
    resnet_spec.SPEC.configure("tiny", ["parallel.remat_policy=dots"])
  with pytest.raises(ValueError, match="allowed: '', full, matmuls"):
    jax_layers.remat_block(object, "dots")
