"""Expert parallelism in the JAX runtime (jax_moe.py), on 8 simulated CPU devices, in float64:
the Transformer with expert layers (4 experts, top-2, the random second policy, dropout on) on
data x expert meshes, and with a model axis too, gives the loss (router losses included),
every gradient, the parameters after two steps and the router's counts (dropped tokens,
per-expert load) of one device; the experts are split over `expert` and the compiled step
moves tokens with all-to-alls over that axis."""
import functools

import jax
import numpy as np
import pytest

from tests.parallel.test_jax_model_parallel import (RTOL, assert_trees_equal, float64_trainer,
                                                    transformer_config, transformer_loss)
from workloads.common import moe
from workloads.common.moe import MoEConfig
from workloads.parallel import jax_runtime
from workloads.transformer import jax_model, spec

pytestmark = pytest.mark.usefixtures("jax_float64")     # tests/conftest.py


def moe_config():
  # one layer a stack, an expert layer (every=1): the encoder's and the decoder's, 2 in all
  # (2 layers a stack with every=2 added two dense feed-forwards, the model-parallel tests'
  # layers, at twice the program)
  cfg = transformer_config(layers=1)
  # groups of one row (12 tokens): every layout here holds whole groups; capacity 4 of 12
  # tokens per expert, so tokens are dropped and the drops must match too
  cfg.model.moe = MoEConfig(num_experts=4, every=1, group_size=12)
  return cfg


def run(mesh):
  """(trainer, (loss, gradients at the initial state, parameters after two train steps), the
  router's counts of the first step): tests/parallel/test_jax_model_parallel.py's
  loss_grads_and_two_steps, keeping the first step's router metrics (they were read from a
  step of their own, then the trainer initialised and its step compiled again)."""
  trainer = float64_trainer(spec, jax_model, moe_config(), mesh)
  batch = trainer.synthetic_batch()
  state = trainer.state
  with trainer.runtime.tracing():
    loss, grads = jax.jit(jax.value_and_grad(functools.partial(transformer_loss, state, batch)))(
        state.params)
  loss, grads = jax.device_get((loss, grads))
  router = None
  for _ in range(2):
    trainer.state, metrics = trainer._train_step(trainer.state, batch)  # pylint: disable=protected-access
    if router is None:
      router = jax.tree.map(np.asarray, metrics["router"])
  return trainer, (loss, grads, jax.device_get(trainer.state.params)), router


@pytest.fixture(scope="module")
def one_device():
  return run("data=1")


# (data=2,expert=4, more experts a device pair, showed nothing these two do not: suite time)
@pytest.mark.parametrize("mesh", ["data=2,expert=2", "data=2,expert=2,model=2"])
def test_expert_parallel_equals_one_device(one_device, mesh):
  trainer, (loss, grads, params), router = run(mesh)
  _, (one_loss, one_grads, one_params), one_router = one_device
  np.testing.assert_allclose(loss, one_loss, rtol=RTOL)
  assert_trees_equal(grads, one_grads)                  # router losses' gradients included
  assert_trees_equal(params, one_params)
  for key in ("tokens", "dropped", "load"):
    np.testing.assert_array_equal(router[key], one_router[key], err_msg=key)
  assert router["dropped"] > 0                          # capacity 4 of 12: drops happen
  for key in ("z_loss", "balance_loss"):
    np.testing.assert_allclose(router[key], one_router[key], rtol=RTOL)
  # each device holds its experts only (and, with a model axis, its d_ff shard of them)
  rt = trainer.runtime
  kernel = trainer.state.params["encoder"]["layer_0"]["ffn"]["experts"]["filter"]["kernel"]
  assert kernel.addressable_shards[0].data.shape == (4 // rt.expert, 32, 64 // rt.model)
  # tokens go to their experts' devices and back: all-to-alls over `expert`
  by_axis = rt.collectives_by_axis(trainer._train_step.as_text())  # pylint: disable=protected-access
  ops, _, nbytes = by_axis[("all-to-all", "expert")]
  assert ops == 8                  # 2 expert layers x (dispatch, combine) x (forward, backward)
  # what describe predicts (moe.figures): a device's groups' E x capacity slots of 32 float64
  # values, 4 times per layer; and no other collective spans `expert` (no gathered tokens)
  figures = moe.figures(trainer.cfg.model.moe, 32, 64, 1, 2, 8 * 12)
  assert nbytes == figures["all_to_all_values_per_step"] * 8 // (rt.data * rt.expert)
  assert not [key for key in by_axis if "expert" in key[1] and key[0] != "all-to-all"
              and key[0] != "all-reduce"]


def test_the_one_device_step_has_no_all_to_all(one_device):
  trainer = one_device[0]
  text = trainer._train_step.as_text()                  # pylint: disable=protected-access
  assert "all-to-all" not in jax_runtime.count_collectives(text)
