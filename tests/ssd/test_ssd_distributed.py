"""The SSD trainers on simulated devices (JAX: 8 simulated CPU devices; TF: logical CPU
devices), each layout equal to one device over several SGD steps: data parallel with global
batch norm and weight-update sharding, image rows split over a spatial axis (Google's v0.7 SSD
layout; XLA inserts the halo exchange), and batch norm over groups of replicas; the eval step
gives the same candidates on every layout, and the gathered eval counts each image once."""
import jax
import numpy as np
import pytest

from harness import config
from harness.workload import RunContext
from workloads.ssd import spec
from tests.trees import assert_trees_close

GBS = 16


def tiny_config(source="mini", **parallel):
  cfg = spec.tiny()
  config.apply_overrides(cfg, [f"data.source={source}", f"train.global_batch_size={GBS}",
                               "optimizer.warmup_steps=0"])
  for key, value in parallel.items():
    setattr(cfg.parallel, key, value)
  return cfg


def trained(framework, steps=3, source="mini", data_dir=None, **parallel):
  cfg = tiny_config(source, **parallel)
  trainer = spec.SPEC.make_trainer(framework, cfg, RunContext(seed=0, preset="tiny",
                                                              data_dir=data_dir))
  trainer.init()
  trainer.train(steps)
  return trainer


def jax_state(trainer):
  s = jax.device_get(trainer.state)
  return {"params": s.params, "batch_stats": s.batch_stats}


def assert_close(a, b, rtol=1e-5, atol=1e-6):
  assert_trees_close(a, b, rtol, atol)


@pytest.fixture(scope="module")
def jax_single():
  return trained("jax", mesh="data=1")


@pytest.fixture(scope="module")
def jax_spatial():
  return trained("jax", mesh="data=2,spatial=4")


def test_jax_data_parallel_with_weight_update_sharding_equals_one_device(jax_single):
  trainer = trained("jax", mesh="data=8", weight_update_sharding=True)
  assert trainer.num_devices == 8
  assert_close(jax_state(trainer), jax_state(jax_single))


def test_jax_spatial_partitioning_equals_one_device(jax_single, jax_spatial):
  assert jax_spatial.runtime.spatial == 4 and jax_spatial.mesh_description == "data=2,spatial=4"
  assert_close(jax_state(jax_spatial), jax_state(jax_single))


def test_jax_bn_groups_equal_that_many_samples_per_device():
  """8 devices x 2 samples in groups of 2 replicas normalise over the same four examples as
  4 devices x 4 samples each alone (model_bn_span 4 both)."""
  grouped = trained("jax", steps=2, mesh="data=8", bn_group_size=2)
  alone = trained("jax", steps=2, mesh="data=4", bn_group_size=1)
  assert grouped.runtime.grouped_bn and alone.runtime.grouped_bn
  span = lambda t: spec.SPEC.bn_span(t.cfg, t.data_replicas)
  assert span(grouped) == span(alone) == 4
  assert_close(jax_state(grouped), jax_state(alone), rtol=1e-4, atol=1e-5)


def _assert_same_candidates(ours, theirs, tol=1e-5):
  """Two layouts' eval outputs: per image and class, the k best anchors' scores (sorted) and
  decoded boxes. The layouts sum the convs in other orders: float32 rounding ~1e-7 per layer
  after two steps. Scores are probabilities (O(1)): 1e-5 absolute is ~100 ulps of 1.0. Decoded
  boxes of an untrained model reach |x| ~ 10 (exp of the size offsets; 7.16 differed by 1.6e-5
  on one CPU), so they get the same 1e-5 relative to their size, and 1e-5 absolute near 0 (a
  coordinate near 0 once differed by 1.5e-6). Two anchors whose scores differ by less than
  that rounding can come out in either order (two did, 8e-8 apart), or trade the k-th place:
  so each box must equal a box of the other layout with a score within tol, unless its score
  is within tol of the k-th (the last kept)."""
  np.testing.assert_allclose(ours["scores"], theirs["scores"], rtol=0, atol=tol)
  scores, other = ours["scores"][..., :, None], theirs["scores"][..., None, :]   # (N,C,k,k)
  a, b = ours["boxes"][..., :, None, :], theirs["boxes"][..., None, :, :]
  same = np.all(np.abs(a - b) <= tol + tol * np.abs(b), -1) & (np.abs(scores - other) <= tol)
  at_the_cut = np.abs(ours["scores"] - ours["scores"][..., -1:]) <= tol
  unmatched = ~(same.any(-1) | at_the_cut)
  assert not unmatched.any(), (np.argwhere(unmatched)[:5], ours["boxes"][unmatched][:5])


def test_jax_eval_is_layout_independent_and_counts_every_image_once(jax_single, jax_spatial):
  one, split = jax_single, jax_spatial
  batch = next(one.pipeline.eval_dataset(one.cfg, one.eval_batch_size(), one.data_dir)
               .as_numpy_iterator())
  outputs = [jax.device_get(t._eval_step(t.state, t.runtime.shard_batch(batch, t.batch_axes(True))))
             for t in (one, split)]
  _assert_same_candidates(outputs[1], outputs[0])
  result = split.evaluate()
  assert result["count"] == split.cfg.data.eval_examples


def test_tf_spatial_rows_pad_the_reference_image_to_split_at_every_level():
  """The reference's 300 rows over 2 slabs: 150 -> 75 -> 38 rows do not halve, so TF pads the
  image to 304 rows (152, 76, 38 at the backbone's levels, each a multiple of 2); the real
  extents the layers keep are the unpadded image's; JAX needs no padding rows."""
  cfg = spec.reference()
  cfg.parallel.mesh = "data=1,spatial=2"
  assert spec.spatial_rows(cfg, 2) == 304 and spec.spatial_rows(cfg, 4) == 320
  assert spec.real_rows(300, cfg.model) == [150, 75, 75, 38, 38]
  assert spec.real_rows(304, cfg.model) == [152, 76, 76, 38, 38]
  assert spec.backbone_size(cfg.model, 300) == 38
  cfg.data.image_size = 64                             # the mini size splits as it is
  assert spec.spatial_rows(cfg, 2) == 64


def tf_state(trainer):
  return {v.path: v.numpy() for v in trainer.model.weights}


def tf_float64(evaluates=False, **parallel):
  """Three SGD steps in float64 (the layouts differ only by summation order, ~1e-15) on 56-px
  images; `evaluates`: init (the eval loop traced too), else build (the train loop is traced
  at the first train())."""
  cfg = tiny_config(**parallel)
  cfg.data.image_size = 56
  trainer = spec.SPEC.make_trainer("tf", cfg, RunContext(seed=0, preset="tiny"))
  trainer.dtype = "float64"
  trainer.init() if evaluates else trainer.build()
  trainer.train(3)
  return trainer


@pytest.fixture(scope="module")
def tf_single():
  """One replica's weights and batch-norm statistics: both TF layouts' reference."""
  return tf_state(tf_float64(mesh="data=1"))


@pytest.mark.slow
def test_tf_spatial_partitioning_equals_one_replica(tf_single):
  """Row slabs with halo exchange in the backbone, its map gathered for the extra layers and
  heads (Google's v0.7 SSD split 4 and 8 ways), on 56-px images that do not split (28, 14, 7
  rows): padded to 64 rows, each level's padding rows zeroed and left out of batch norm's
  statistics, the gathered map cropped to 7 rows: the same weights and batch-norm statistics
  after three SGD steps as one replica on the unpadded image, and the same eval. Two slabs
  and no data axis: slabs beside data replicas (batch norm over both) is ResNet's TF spatial
  test in tests/parallel/test_tf_distributed.py; on data=2,spatial=2 here it cost 51 CPU s."""
  split = tf_float64(evaluates=True, mesh="data=1,spatial=2")
  assert split.num_devices == 2 and split.runtime.spatial == 2
  assert split.model.input_shape == (None, 32, 56, 3)          # a slab of the 64 padded rows
  assert_close(tf_state(split), tf_single, rtol=1e-9, atol=1e-12)
  assert split.evaluate()["count"] == split.cfg.data.eval_examples


@pytest.mark.slow
def test_tf_two_replicas_with_weight_update_sharding_equal_one(tf_single):
  """Data parallel with global batch norm and each replica updating half the weights (their
  slots split too): the same weights and statistics as one replica, in float64."""
  two = tf_float64(mesh="data=2", weight_update_sharding=True)
  assert two.num_devices == 2 and two.sharded is not None
  assert_close(tf_state(two), tf_single, rtol=1e-9, atol=1e-12)
