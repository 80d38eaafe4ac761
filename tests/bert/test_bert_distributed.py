"""The BERT trainers on 8 simulated CPU devices (JAX) and 8 logical CPU devices (TF): data
parallel and weight-update sharding (LAMB's trust ratio over the whole layer, clipping by the
global norm) equal the single-device run over several steps."""
import jax
import numpy as np
import pytest

from harness import config
from harness.workload import RunContext
from workloads.bert import spec
from workloads.parallel import jax_runtime
from tests.trees import assert_trees_close


def tiny_config(**parallel):
  cfg = spec.mini()
  # tf.distribute's replicated steps never XLA-compile, so the one-replica reference does not
  # either: the same kernels on both sides and no XLA compile this test does not test (TF's
  # XLA path is the contract and end-to-end tests'); JAX ignores the key.
  config.apply_overrides(cfg, ["train.jit_compile=false", "data.source=synthetic",
                               "model.hidden_size=32",
                               "model.intermediate_size=64", "train.global_batch_size=16",
                               "optimizer.base_learning_rate=0.01", "optimizer.warmup_steps=0"])
  for key, value in parallel.items():
    setattr(cfg.parallel, key, value)
  return cfg


def trained(steps=3, **parallel):
  cfg = tiny_config(**parallel)
  trainer = spec.SPEC.make_trainer("jax", cfg, RunContext(seed=0, preset="synthetic"))
  trainer.init()
  trainer.train(steps)
  return trainer


def params_of(trainer):
  return jax.tree.map(np.asarray, jax.device_get(trainer.state.params))


@pytest.fixture(scope="module")
def single_trainer():
  return trained(mesh="data=1")


@pytest.fixture(scope="module")
def single_device(single_trainer):
  return params_of(single_trainer)


def assert_params_close(a, b):
  # the key projections' bias: zero gradient in exact arithmetic, and Adam amplifies float32
  # noise in it (the parity test)
  assert_trees_close(a, b, 1e-5, 1e-6, skip=("['key']['bias']",))


def test_data_parallel_equals_one_device(single_device):
  trainer = trained(mesh="data=8")
  assert trainer.num_devices == 8
  assert_params_close(params_of(trainer), single_device)


def test_weight_update_sharding_equals_unsharded_and_shards_lamb_state(single_trainer,
                                                                      single_device):
  sharded = trained(mesh="data=8", weight_update_sharding=True)
  assert_params_close(params_of(sharded), single_device)
  ratio = (jax_runtime.per_device_bytes(sharded.state.opt_state)
           / jax_runtime.per_device_bytes(single_trainer.state.opt_state))
  assert ratio < 0.2, ratio                 # every BERT matrix and vector here splits 8 ways
  kernel = sharded.state.params["layer_0"]["query"]["kernel"]
  assert kernel.addressable_shards[0].data.shape == kernel.shape      # weights whole again


# ------------------------------------------------------------------ TF (tf.distribute)

def tf_trained(steps=3, **parallel):
  cfg = tiny_config(**parallel)
  cfg.optimizer.clip_norm = 0.05      # clipping active: it must see the summed gradient
  trainer = spec.SPEC.make_trainer("tf", cfg, RunContext(seed=0, preset="synthetic"))
  trainer.init()
  trainer.train(steps)
  return trainer


def tf_weights(trainer):
  return {v.path: v.numpy() for v in trainer.model.trainable_variables}


def test_tf_data_parallel_and_weight_update_sharding_equal_one_replica():
  """2 replicas (MirroredStrategy over logical CPUs), with and without weight-update sharding,
  3 LAMB steps with global-norm clipping of the summed gradient, against one replica. (2: what
  is BERT's here, the clipping and LAMB's whole-layer trust ratio over a sharded update, needs
  a cross-replica sum, not many replicas; each replica is traced separately, and 4 took ~20 s
  more on 2 CPU cores. The 4-replica runtime is tested on ResNet, tests/parallel.)"""
  single = tf_weights(tf_trained(mesh="data=1"))
  for parallel in (dict(mesh="data=2"), dict(mesh="data=2", weight_update_sharding=True)):
    trainer = tf_trained(**parallel)
    assert trainer.num_devices == 2
    # key/bias: zero gradient in exact arithmetic, and Adam amplifies float32 noise in it
    assert_trees_close(tf_weights(trainer), single, 1e-5, 1e-6, skip=("key/bias']",))
  assert trainer.describe().optimizer_state_bytes_per_device * 2 < 1.01 * sum(
      2 * 4 * v.size for v in single.values())               # m and v, one half each
