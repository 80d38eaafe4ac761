"""The TF distributed runtime (tf.distribute) on logical CPU devices (8 made, 4 used: each
replica is traced separately, so 4 halve the time of 8 and exercise the same collectives):
each feature against the single-replica run (or a hand-computed reference), over several
optimizer steps."""
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from harness import config
from harness.workload import RunContext
from tests.conftest import free_port, run_workers, start_dying_run, start_worker
from workloads.resnet import input_pipeline, spec
from tests.trees import assert_trees_close


def tiny_config(image_size=16, **parallel):
  cfg = spec.mini()
  # tf.distribute's replicated steps never XLA-compile, so the one-replica reference does not
  # either: the same kernels on both sides and no XLA compile this test does not test (TF's
  # XLA path is the contract and end-to-end tests'); JAX ignores the key.
  config.apply_overrides(cfg, ["train.jit_compile=false", "model.stage_sizes=1,1", "model.width=4",
                               f"data.image_size={image_size}", "data.train_examples=64",
                               "data.eval_examples=40", "data.eval_batch_size=16",
                               "train.global_batch_size=16"])
  for key, value in parallel.items():
    setattr(cfg.parallel, key, value)
  return cfg


def trained(steps=3, optimizer="lars", image_size=16, evaluates=True, **parallel):
  """`evaluates`: init (the train and eval loops traced); else build, for a trainer whose eval
  is never run (its train loop is traced at its first train(): the same steps)."""
  cfg = tiny_config(image_size, **parallel)
  cfg.optimizer.name = optimizer
  trainer = spec.SPEC.make_trainer("tf", cfg, RunContext(seed=0, preset="mini"))
  trainer.init() if evaluates else trainer.build()
  if steps:
    trainer.train(steps)
  return trainer


def weights_of(trainer):
  return {v.path: v.numpy() for v in trainer.model.variables}


def assert_weights_close(a, b, rtol=1e-5, atol=1e-6):
  assert_trees_close(a, b, rtol, atol)


@pytest.fixture(scope="module")
def single_replica():
  return trained(mesh="data=1")


@pytest.fixture(scope="module")
def data_parallel():
  return trained(mesh="data=4")


def test_eight_logical_devices():
  assert len(tf.config.list_logical_devices("CPU")) == 8


def test_data_parallel_global_bn_matches_one_replica(single_replica, data_parallel):
  assert data_parallel.num_devices == 4 and data_parallel.runtime.bn_group_size == 4
  assert_weights_close(weights_of(data_parallel), weights_of(single_replica))
  mirrored = data_parallel.model.get_layer("stem_bn").moving_mean.value
  replicas = [v.numpy() for v in mirrored.values]       # every replica keeps the same stats
  assert len(replicas) == 4 and all(np.array_equal(r, replicas[0]) for r in replicas)


def test_distributed_eval_counts_every_example_once(single_replica, data_parallel):
  result = data_parallel.evaluate()
  assert result["count"] == 40                     # 40 examples in padded batches of 16
  assert result["top1_accuracy"] == pytest.approx(single_replica.evaluate()["top1_accuracy"])


def test_weight_update_sharding_matches_unsharded_and_cuts_state_4x(single_replica,
                                                                   data_parallel):
  sharded = trained(mesh="data=4", weight_update_sharding=True, evaluates=False)
  assert_weights_close(weights_of(sharded), weights_of(single_replica))
  ratio = (sharded.describe().optimizer_state_bytes_per_device
           / data_parallel.describe().optimizer_state_bytes_per_device)
  assert abs(ratio - 1 / 4) < 0.01 / 4, ratio
  slot = sharded.sharded.slots["velocity"]
  assert [v.shape[0] for v in slot.values] == [sharded.sharded.shard] * 4
  assert not np.array_equal(slot.values[0].numpy(), slot.values[1].numpy())  # own slices


def test_grouped_bn_matches_a_hand_computed_reference():
  """Groups of 2 replicas x 4 examples on 4 replicas: batch norm over each group of 8
  examples, gradients summed over the 2 groups, running statistics averaged over them, LARS
  steps: computed here on one replica, group by group."""
  grouped = trained(steps=3, mesh="data=4", bn_group_size=2, evaluates=False)
  assert grouped.num_devices == 4 and grouped.runtime.bn_group_size == 2
  ref = trained(steps=0, mesh="data=1", evaluates=False)      # its loss_and_grads alone
  batches = input_pipeline.train_dataset(ref.cfg, 16, seed=0).as_numpy_iterator()
  bns = [l for l in ref.model.layers if isinstance(l, keras.layers.BatchNormalization)]
  loss_and_grads = tf.function(ref.loss_and_grads)       # one trace for the 6 group steps
  for _ in range(3):
    batch = next(batches)
    old = [(l.moving_mean.numpy(), l.moving_variance.numpy()) for l in bns]
    grads, new = None, []
    for i in range(2):
      for layer, (mean, var) in zip(bns, old):
        layer.moving_mean.assign(mean)
        layer.moving_variance.assign(var)
      _, g = loss_and_grads({k: v[i * 8:(i + 1) * 8] for k, v in batch.items()})
      grads = g if grads is None else [a + b for a, b in zip(grads, g)]
      new.append([(l.moving_mean.numpy(), l.moving_variance.numpy()) for l in bns])
    for j, layer in enumerate(bns):
      layer.moving_mean.assign(np.mean([n[j][0] for n in new], axis=0))
      layer.moving_variance.assign(np.mean([n[j][1] for n in new], axis=0))
    ref.optimizer.apply(grads, ref.model.trainable_variables)
  assert_weights_close(weights_of(grouped), weights_of(ref))


def test_spatial_partitioning_matches_one_replica(single_replica):
  """Also the eval through the host (tests/host_eval.py): per-example outputs gathered from the
  4 replicas, a spatial group's duplicate rows dropped, the same accuracy as on-device counts."""
  from tests.host_eval import tf_trainer_class
  spatial = tf_trainer_class()(tiny_config(mesh="data=2,spatial=2"),
                               RunContext(seed=0, preset="mini"))
  spatial.init()
  spatial.train(3)
  assert spatial.num_devices == 4 and spatial.model.input_shape[1] == 8   # 16 rows in 2 slabs
  assert_weights_close(weights_of(spatial), weights_of(single_replica), rtol=2e-5)
  assert spatial.runtime.collective_calls["all_gather"] > 0               # the halo exchange
  result = spatial.evaluate()
  assert result["count"] == 40 and result["rows_seen"] == 48
  assert result["top1_accuracy"] == pytest.approx(single_replica.evaluate()["top1_accuracy"],
                                                  abs=1 / 40 + 1e-9)


@pytest.mark.parametrize("parallel, message", [
    (dict(mesh="data=16"), "needs 16 devices; 8 available"),
    (dict(mesh="data=3"), "not divisible by the 3 data replicas"),
    (dict(mesh="data=8", bn_group_size=3), "does not divide the data axis"),
    (dict(mesh="data=4,spatial=2", image_size=8), "must be a multiple of 16"),
])
def test_impossible_meshes_are_refused(parallel, message):
  with pytest.raises(ValueError, match=message):
    image_size = parallel.pop("image_size", 16)
    spec.SPEC.make_trainer("tf", tiny_config(image_size, **parallel),
                           RunContext(seed=0, preset="mini"))


@pytest.mark.slow
def test_two_workers_equal_one_process_with_two_replicas(tmp_path):
  """2 workers x 1 replica against 1 process x 2 replicas, run side by side."""
  multi = run_workers("tf_multiworker_worker.py", tmp_path, 2, 1, 2, timeout=400)
  # host-side eval: each worker gathered all 48 padded rows of the 3 global batches
  assert int(multi["rows_seen"]) == 48


@pytest.mark.slow
def test_a_model_axis_across_two_workers_equals_one_process(tmp_path):
  """--mesh data=1,model=2 over 2 workers x 1 replica (each worker holds one shard of every
  split weight, both read the same batches) against 1 process x 2 replicas, float64: the losses
  of two Adam steps and every weight after them, shard by shard (rtol 1e-9)."""
  port = free_port(2)
  procs = [start_worker("tf_model_multiworker_worker.py", tmp_path / "multi", 2, i, port, 1)
           for i in range(2)]
  procs.append(start_worker("tf_model_multiworker_worker.py", tmp_path / "single", 1, 0,
                            free_port(), 2))
  outputs = [p.communicate(timeout=400)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(o[-3000:] for o in outputs)
  single = dict(np.load(tmp_path / "single.0.npz"))
  workers = [dict(np.load(tmp_path / f"multi.{i}.npz")) for i in range(2)]
  shards = [{k for k in w if "#" in k} for w in workers]
  assert shards[0] and not shards[0] & shards[1]           # each worker holds its own shards
  assert {k[-1] for k in shards[0]} == {"0"} and {k[-1] for k in shards[1]} == {"1"}
  for worker in workers:
    for key, value in worker.items():
      np.testing.assert_allclose(value, single[key], rtol=1e-9, atol=1e-12, err_msg=key)
  assert shards[0] | shards[1] == {k for k in single if "#" in k}


@pytest.mark.slow
def test_a_dead_worker_ends_the_other_with_an_error(tmp_path):
  start = time.time()
  (survivor,), dying = start_dying_run("tf_multiworker_worker.py", tmp_path / "x.npz", 2, 1)
  dying.communicate(timeout=400)
  out = survivor.communicate(timeout=300)[0]
  assert dying.returncode == 3
  assert survivor.returncode != 0, out[-2000:]
  assert "worker done" not in out
  print(f"survivor exited after {time.time() - start:.0f}s")
  assert time.time() - start < 240
