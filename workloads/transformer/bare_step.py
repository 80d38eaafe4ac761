"""Transformer-big's bare step (workloads/common/jax_bare_step.py): packed rows of 256 tokens,
vocabulary 33,708, AdamW."""
import jax.numpy as jnp
import numpy as np
import optax

from workloads.common.jax_bare_step import Anchor

GPU_BATCH = 64
ANCHOR = Anchor(0.40, 0.34, "DeepLearningExamples Transformer-big, PyTorch, A100 "
                            "(MaxText Llama2-7B 8x H100: 0.497)")


def build(batch, dtype, rng, shapes):
  from workloads.transformer import jax_model, mini_corpus, spec  # pylint: disable=import-outside-toplevel
  cfg = spec.SPEC.configure(*shapes)
  model = jax_model.build(cfg, dtype)
  length, smoothing = cfg.data.max_length, cfg.optimizer.label_smoothing

  def init(key):
    ids = jnp.zeros((1, length), jnp.int32)
    return model.init(key, ids, ids)

  def loss(params, batch_stats, b, key):
    del batch_stats
    logits = model.apply({"params": params}, b["inputs"], b["targets"], train=True,
                         packed=spec.packed_features(b), rngs={"dropout": key})
    total, count = jax_model.smoothed_cross_entropy(logits, b["targets"], smoothing)
    return total / jnp.maximum(count, 1.0), None

  if cfg.data.packing:
    data = mini_corpus.synthetic_packed(rng, cfg.model.vocab_size, batch, length)
  else:
    ids = lambda: rng.integers(2, cfg.model.vocab_size, (batch, length)).astype(np.int32)
    data = {"inputs": ids(), "targets": ids()}
  kind = "packed rows" if cfg.data.packing else "rows"
  return dict(spec=spec, cfg=cfg, init=init, loss=loss, batch=data,
              tx=optax.adamw(1e-4, weight_decay=0.01),
              shapes=f"{batch} {kind} x {length} tokens ({len(data)} i32 features), "
                     f"vocab {cfg.model.vocab_size}")
