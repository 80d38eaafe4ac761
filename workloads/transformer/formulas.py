"""The Transformer reference's closed-form pieces, in numpy, read by both frameworks' models
(framework-neutral, so the two cannot disagree on them).

  position_encoding: model_utils.get_position_encoding (min timescale 1, max 1e4): the sines of
    all timescales, then the cosines, concatenated along the hidden dimension.
  smoothing: metrics.padded_cross_entropy_loss: the true token gets 1 - s, each of the other
    vocab_size - 1 tokens s / (vocab_size - 1) (optax.smooth_labels spreads s over all
    vocab_size tokens instead), and the constant entropy of that distribution is subtracted, so
    a perfect prediction has loss 0.
"""
import math

import numpy as np

LAYER_NORM_EPSILON = 1e-6       # the reference's LayerNormalization
ATTENTION_MASK = -1e9           # model_utils: the bias added to masked attention logits


def position_encoding(length: int, hidden_size: int) -> np.ndarray:
  """[length, hidden_size] float64."""
  half = hidden_size // 2
  increment = math.log(1.0e4 / 1.0) / max(half - 1, 1)
  inverse_timescales = np.exp(np.arange(half, dtype=np.float64) * -increment)
  angles = np.arange(length, dtype=np.float64)[:, None] * inverse_timescales[None, :]
  return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


def smoothing(label_smoothing: float, vocab_size: int) -> tuple[float, float, float]:
  """(confidence, low_confidence, normalizing constant) of the label-smoothed cross entropy."""
  confidence = 1.0 - label_smoothing
  low = label_smoothing / (vocab_size - 1)
  constant = -(confidence * math.log(confidence) + (vocab_size - 1) * low * math.log(low + 1e-20))
  return confidence, low, constant


def length_penalty(length, alpha: float):
  """Beam search's ((5 + length) / 6) ** alpha (Wu et al. 2016, as the reference)."""
  return ((5.0 + length) / 6.0) ** alpha


def glorot_limit(fan_in: int, fan_out: int) -> float:
  """Glorot-uniform bound. Attention kernels are [hidden, heads, kv] here but the reference's
  are [hidden, hidden] matrices: their fans are those of the matrix."""
  return math.sqrt(6.0 / (fan_in + fan_out))
