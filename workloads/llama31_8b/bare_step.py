"""Llama 3.1 8B's bare step (workloads/common/jax_bare_step.py): the reference's widths,
sequence 8,192 and vocabulary 128,256 with GPU_LAYERS of its 32 decoder layers (the whole
model with AdamW's state, 128 GB in float32 before activations, fits no single GPU: the
reference trains it data parallel with a distributed optimizer over 8 or more), AdamW.
A decoder layer is the same work at any depth, so the MFU of 4 layers reads as the model's,
less the embedding and output layer's larger share."""
import jax.numpy as jnp
import numpy as np
import optax

from workloads.common.jax_bare_step import Anchor

GPU_BATCH = 2
GPU_LAYERS = 4
ANCHOR = Anchor(0.40, 0.497, "MaxText Llama2-7B, 8x H100, bf16 (the decoder figure the "
                             "Transformer's anchor cites)")


def build(batch, dtype, rng, shapes):
  from workloads.llama31_8b import jax_model, spec  # pylint: disable=import-outside-toplevel
  preset, overrides = shapes
  if preset in ("reference", "synthetic") and not any(
      o.startswith("model.num_layers=") for o in overrides):
    overrides = [*overrides, f"model.num_layers={GPU_LAYERS}"]
  cfg = spec.SPEC.configure(preset, overrides)
  model = jax_model.build(cfg, dtype)
  seq, vocab = cfg.data.max_seq_length, cfg.model.vocab_size

  def init(key):
    return model.init(key, jnp.zeros((1, seq), jnp.int32))

  def loss(params, batch_stats, b, key):
    del batch_stats, key
    return jax_model.lm_loss(model.apply({"params": params}, b["tokens"]), b), None

  tokens = rng.integers(0, vocab, (batch, seq + 1)).astype(np.int32)
  data = {"tokens": tokens[:, :-1], "labels": tokens[:, 1:]}
  return dict(spec=spec, cfg=cfg, init=init, loss=loss, batch=data,
              tx=optax.adamw(4e-4, b1=0.9, b2=0.95, eps=1e-5, weight_decay=0.1),
              shapes=f"tokens and labels {batch}x{seq} i32, vocab {vocab}, "
                     f"{cfg.model.num_layers} layers")
