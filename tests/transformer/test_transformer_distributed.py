"""The Transformer trainers on simulated devices (JAX: 8 simulated CPU devices; TF: logical CPU
devices), on the mini set: the distributed BLEU eval translates every sentence exactly once and
scores what one device scores, and data parallel with weight-update sharding equals one device
over several Adam steps, on packed rows (their segment and position features split over the
devices with the tokens). Dropout is off (its masks are drawn per device). One trainer pair
per framework does both: building and tracing them is most of the time."""
import jax
import numpy as np
import pytest

from harness.workload import RunContext
from workloads.transformer import spec
from tests.trees import assert_trees_close

GBS = 16


def tiny_config(source="synthetic", **parallel):
  # tf.distribute's replicated steps never XLA-compile, so the one-replica reference does not
  # either: the same kernels on both sides and no XLA compile this test does not test (TF's
  # XLA path is the contract and end-to-end tests'); JAX ignores the key.
  overrides = ["train.jit_compile=false", f"data.source={source}", "data.packing=true",
               "model.dropout=0",
               "model.attention_dropout=0",
               "model.relu_dropout=0", f"train.global_batch_size={GBS}",
               "optimizer.warmup_steps=2", "data.max_length=12", "data.eval_max_length=12"]
  if source == "synthetic":
    overrides.append("model.vocab_size=40")
  cfg = spec.SPEC.configure("tiny", overrides)
  for key, value in parallel.items():
    setattr(cfg.parallel, key, value)
  return cfg


def trainer_for(framework, source="synthetic", data_dir=None, **parallel):
  cfg = tiny_config(source, **parallel)
  trainer = spec.SPEC.make_trainer(framework, cfg, RunContext(seed=0, preset="tiny",
                                                              data_dir=data_dir))
  trainer.init()
  return trainer


def eval_statistics(trainer):
  """The run's summed BLEU statistics (host_bleu's accumulator) and its result."""
  seen = []
  finalize = trainer.finalize
  trainer.finalize = lambda acc: seen.append(acc) or finalize(acc)
  result = trainer.evaluate()
  (stats, count), = seen
  return stats, count, result


def assert_same_eval(one, many):
  """Every sentence translated once, to the same words: identical statistics, hypotheses not
  empty (the untrained model writes words until EOS or the length limit)."""
  stats_one, count_one, result_one = eval_statistics(one)
  stats_many, count_many, result_many = eval_statistics(many)
  assert count_one == count_many == result_many["count"] == one.cfg.data.eval_examples
  hypothesis_length = stats_one[-2]
  assert hypothesis_length > 0
  np.testing.assert_array_equal(stats_many, stats_one)
  assert result_many["bleu"] == result_one["bleu"]


def assert_close(a, b, rtol, atol):
  assert_trees_close(a, b, rtol, atol)


# Adam divides each update by sqrt(v), so an element whose gradient is at float32 rounding
# level (a ReLU unit that is nearly dead) moves by up to ~lr x 1e-3 when the cross-device sum
# rounds differently (seen: 8e-5 at lr ~0.18); a missing shard or a wrong gradient moves
# weights by ~lr. Adam is blind to a constant factor on the gradient, so the loss, which is
# the sum of every replica's share, is compared too: a replica normalising by its own token
# count instead of the global one would change it.
WEIGHTS = dict(rtol=1e-3, atol=3e-4)


def assert_same_run(a_losses, b_losses):
  np.testing.assert_allclose(a_losses, b_losses, rtol=1e-5)


# ----------------------------------------------------------------------------------- JAX

def test_jax_data_parallel_with_weight_update_sharding_equals_one_device(tmp_path):
  """The same initial weights (same seed) translate the eval set identically on 1 and 8
  devices; then 3 Adam steps on the same mini batches (8 devices x 2 pairs) stay equal."""
  one = trainer_for("jax", "mini", str(tmp_path), mesh="data=1")
  eight = trainer_for("jax", "mini", str(tmp_path), mesh="data=8", weight_update_sharding=True)
  assert eight.num_devices == 8
  assert_same_eval(one, eight)
  assert_same_run([one.train(1)["loss"] for _ in range(3)],
                  [eight.train(1)["loss"] for _ in range(3)])
  assert_close(jax.device_get(eight.state.params), jax.device_get(one.state.params), **WEIGHTS)


# ------------------------------------------------------------------------------------ TF

def tf_weights(trainer):
  return {v.path: v.numpy() for v in trainer.model.trainable_variables}


@pytest.mark.slow
def test_tf_two_replicas_with_weight_update_sharding_equal_one(tmp_path):
  one = trainer_for("tf", "mini", str(tmp_path), mesh="data=1")
  two = trainer_for("tf", "mini", str(tmp_path), mesh="data=2", weight_update_sharding=True)
  assert two.num_devices == 2 and two.sharded is not None
  assert_close(tf_weights(two), tf_weights(one), rtol=0, atol=0)       # same seed, same init
  assert_same_eval(one, two)
  assert_same_run([one.train(1)["loss"] for _ in range(3)],
                  [two.train(1)["loss"] for _ in range(3)])
  assert_close(tf_weights(two), tf_weights(one), **WEIGHTS)
