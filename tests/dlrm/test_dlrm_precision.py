"""DLRM-DCNv2's numerics: float32 as the reference, and under bf16 compute each bag summed in
float32 with its pooled vector rounded to bf16 once (both frameworks), not rows rounded to bf16
and summed in bf16 (which rounds at every add: what this test tells apart)."""
import jax
import jax.numpy as jnp
import numpy as np

from workloads.dlrm import input_pipeline, jax_model, spec, tf_model

BAG = 12                        # ids in the test's one wide bag: many adds to round


def _config():
  cfg = spec.SPEC.configure("tiny", ["data.source=synthetic"])
  cfg.model.multi_hot_sizes = (BAG,) + tuple(cfg.model.multi_hot_sizes[1:])
  return cfg


def _inputs(cfg):
  batch = input_pipeline.synthetic_batch(cfg, 16, 0)
  plan = spec.plan(cfg, 1)
  rng = np.random.default_rng(1)
  slab = rng.normal(0, 1, (plan.slab_rows, cfg.model.embedding_dim)).astype(np.float32)
  return plan, batch["sparse"], slab


def test_the_reference_preset_trains_in_float32():
  assert spec.SPEC.configure("reference").train.precision == "float32"
  bf16 = spec.SPEC.configure("reference", ["train.precision=bfloat16"])
  assert bf16.train.precision == "bfloat16"


def test_jax_bags_are_summed_in_float32_then_rounded_to_bf16_once():
  cfg = _config()
  plan, ids, slab = _inputs(cfg)
  m = cfg.model

  def pooled(dtype):
    emb = jax_model.Embedding(plan, tuple(m.multi_hot_sizes), m.embedding_dim, dtype)
    return np.asarray(emb.apply({"params": {"slab": jnp.asarray(slab)}}, jnp.asarray(ids)))

  f32, bf16 = pooled(jnp.float32), pooled(jnp.bfloat16)
  assert bf16.dtype == jnp.bfloat16
  np.testing.assert_array_equal(bf16, f32.astype(jnp.bfloat16))
  # the other order, rows rounded then summed in bf16, differs on this bag: the test can fail
  rows_bf16 = jnp.asarray(slab, jnp.bfloat16)[jnp.asarray(ids[:, :BAG])]
  summed_in_bf16 = np.asarray(jax.lax.reduce(rows_bf16, jnp.bfloat16(0), jax.lax.add, (1,)))
  assert (summed_in_bf16 != bf16[:, 0]).any()


def test_tf_bags_are_summed_in_float32_then_rounded_to_bf16_once():
  cfg = _config()
  _, ids, slab = _inputs(cfg)

  def pooled(dtype):
    model = tf_model.build(cfg, dtype)
    model.slab.assign(slab)
    return np.asarray(model.lookup(ids))

  f32, bf16 = pooled("float32"), pooled("mixed_bfloat16")
  assert str(bf16.dtype) == "bfloat16"
  np.testing.assert_array_equal(bf16, f32.astype(jnp.bfloat16))
