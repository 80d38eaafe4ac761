"""The EfficientNet trainers on simulated devices (JAX: 8 simulated CPU devices; TF: logical
CPU devices): data parallel with global batch norm and weight-update sharding equal a run that
computes the same thing on fewer devices, over several optimizer steps, moving averages (EMA
weights and statistics, which eval uses) included; groups of a set number of samples (the
large-batch recipe's distributed BN) resolve to replicas as TensorFlow's TPU code does. Dropout
and stochastic depth are off: their masks are drawn per device. (Grouped batch norm itself:
JAX's is tests/ssd's, on the shared image trainer; TF's is tests/parallel's, on ResNet.)"""
import jax
import numpy as np
import pytest

from harness import config, mesh
from harness.workload import RunContext
from workloads.efficientnet import spec
from workloads.optim.configs import LarsPolyConfig
from tests.trees import assert_trees_close

GBS = 16


def tiny_config(framework, recipe, image_size=16, **parallel):
  cfg = spec.tiny()
  # tf.distribute's replicated steps never XLA-compile, so the one-replica reference does not
  # either: the same kernels on both sides and no XLA compile this test does not test (TF's
  # XLA path is the contract and end-to-end tests'); JAX ignores the key.
  config.apply_overrides(cfg, ["train.jit_compile=false", "data.source=synthetic",
                               "model.dropout_rate=0",
                               f"data.image_size={image_size}",
                               "model.drop_connect_rate=0", f"train.global_batch_size={GBS}",
                               "optimizer.warmup_epochs=0"])
  if recipe == "large_batch":
    cfg.optimizer = LarsPolyConfig(base_learning_rate_per_256=2.0, warmup_epochs=0.0,
                                   end_learning_rate=0.0, ema_decay=0.5)
  for key, value in parallel.items():
    setattr(cfg.parallel, key, value)
  return cfg


def trained(framework, recipe="reference", steps=3, image_size=16, **parallel):
  cfg = tiny_config(framework, recipe, image_size, **parallel)
  trainer = spec.SPEC.make_trainer(framework, cfg, RunContext(seed=0, preset="tiny"))
  trainer.init()
  trainer.train(steps)
  return trainer


def jax_state(trainer):
  s = jax.device_get(trainer.state)
  return {"params": s.params, "batch_stats": s.batch_stats, "ema_params": s.ema_params,
          "ema_batch_stats": s.ema_batch_stats}


def tf_state(trainer):
  return {f"{tag}/{v.path}": v.numpy() for tag, model in (("model", trainer.model),
                                                          ("ema", trainer.ema_model))
          for v in model.weights if "seed_generator" not in v.path}


def assert_close(a, b, rtol=1e-5, atol=1e-6):
  assert_trees_close(a, b, rtol, atol)


def test_groups_by_samples_resolve_to_replicas_as_tensorflow_tpu():
  parallel = mesh.ParallelConfig(bn_group_samples=128)
  assert mesh.bn_group_replicas(parallel, 1024, 65536) == 2        # 64 per replica
  assert mesh.bn_span(parallel, 1024, 65536) == 128
  assert mesh.bn_group_replicas(parallel, 8, 2048) == 1            # 256 per replica > 128
  assert mesh.bn_group_replicas(parallel, 8, 64) == 8              # capped at all replicas
  with pytest.raises(ValueError, match="groups of 4 replicas, which does not divide"):
    mesh.bn_group_replicas(mesh.ParallelConfig(bn_group_samples=8), 6, 12)


def test_both_group_flags_are_refused_in_one_line(cli):
  proc = cli("run", "efficientnet", "--preset", "tiny", "--bn-group-size", "2",
             "--bn-group-samples", "8", "--results", "unused.csv")
  assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
  assert "--bn-group-samples" in proc.stderr and "one of them" in proc.stderr


# ----------------------------------------------------------------------------------- JAX

@pytest.fixture(scope="module")
def jax_single():
  return jax_state(trained("jax", mesh="data=1"))


def test_jax_data_parallel_equals_one_device(jax_single):
  trainer = trained("jax", mesh="data=8")
  assert trainer.num_devices == 8
  assert_close(jax_state(trainer), jax_single)


# Grouped batch norm by samples in JAX (8 devices x 2 samples in groups of 4 samples against 4
# devices x 4 samples, 30 CPU s) was here: the groups are the shared image trainer's
# (workloads/parallel/jax_batch_norm.py), whose 8-device grouping tests/ssd/
# test_ssd_distributed.py checks the same way, and bn_group_samples -> replicas is
# test_groups_by_samples_resolve_to_replicas_as_tensorflow_tpu above.


# ------------------------------------------------------------------------------------ TF

@pytest.mark.slow
def test_tf_two_replicas_with_weight_update_sharding_equal_one():
  """The LARS recipe: its L2 term is in each replica's share of the loss, once in the sum."""
  one = tf_state(trained("tf", "large_batch", mesh="data=1"))
  two = trained("tf", "large_batch", mesh="data=2", weight_update_sharding=True)
  assert two.num_devices == 2 and two.sharded is not None
  # the gradient is a cross-replica sum here: float32 rounding, ~5e-6 on the EMA after 3 steps
  assert_close(tf_state(two), one, rtol=1e-4, atol=1e-5)


def test_tf_runtime_resolves_groups_of_samples():
  from workloads.parallel import tf_runtime
  runtime = tf_runtime.StrategyRuntime(mesh.ParallelConfig(mesh="data=4", bn_group_samples=8),
                                       GBS)
  assert runtime.bn_group_size == 2 and runtime.data == 4
