"""BERT-large's bare step (workloads/common/jax_bare_step.py): sequence 512, 76 masked-LM
positions, AdamW in place of LAMB."""
import jax.numpy as jnp
import numpy as np
import optax

from workloads.common.jax_bare_step import Anchor

GPU_BATCH = 32
ANCHOR = Anchor(0.40, 0.49, "MLPerf v4.0 H200 (FP8 matmuls, packed rows of 512)")


def build(batch, dtype, rng, shapes):
  from workloads.bert import jax_model, spec  # pylint: disable=import-outside-toplevel
  cfg = spec.SPEC.configure(*shapes)
  model = jax_model.build(cfg, dtype)
  seq, preds = cfg.data.max_seq_length, cfg.data.max_predictions_per_seq
  vocab = cfg.model.vocab_size

  def init(key):
    ids = jnp.zeros((1, seq), jnp.int32)
    return model.init(key, ids, ids, ids, jnp.zeros((1, preds), jnp.int32))

  def loss(params, batch_stats, b, key):
    del batch_stats
    mlm_logits, nsp_logits = model.apply(
        {"params": params}, b["input_ids"], b["input_mask"], b["segment_ids"],
        b["masked_lm_positions"], train=True, rngs={"dropout": key})
    return jax_model.pretraining_loss(mlm_logits, nsp_logits, b), None

  # bert input_pipeline.synthetic_batch: every position real, two segments
  data = {"input_ids": rng.integers(0, vocab, (batch, seq)).astype(np.int32),
          "input_mask": np.ones((batch, seq), np.int32),
          "segment_ids": np.repeat((np.arange(seq) >= seq // 2).astype(np.int32)[None], batch, 0),
          "masked_lm_positions": np.sort(rng.integers(1, seq, (batch, preds)), 1).astype(np.int32),
          "masked_lm_ids": rng.integers(0, vocab, (batch, preds)).astype(np.int32),
          "masked_lm_weights": np.ones((batch, preds), np.float32),
          "next_sentence_labels": rng.integers(0, 2, (batch,)).astype(np.int32)}
  return dict(spec=spec, cfg=cfg, init=init, loss=loss, batch=data,
              tx=optax.adamw(1e-4, weight_decay=0.01),
              shapes=f"7 features: ids/mask/segments {batch}x{seq} i32, {preds} masked-LM slots")
