"""RoPE's frequencies with Llama 3.1's scaling, framework-neutral (numpy): both models' tables
(jax_model.rope_tables, tf_model.rope_tables) are cos and sin of positions x these."""
import math

import numpy as np


def inverse_frequencies(c) -> np.ndarray:
  """RoPE's inverse frequencies [head_dim / 2] with Llama 3.1's scaling (HF
  `_compute_llama3_parameters`), float64 numpy: 1 / theta^(2i / d); wavelengths 2 pi / f above
  original_max_position / low_freq_factor divided by `factor`, below original_max_position /
  high_freq_factor kept, smoothly interpolated between. rope_scaling_factor 1: plain RoPE."""
  d = c.head_dim
  inv = 1.0 / c.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
  if c.rope_scaling_factor == 1.0:
    return inv
  old = c.rope_original_max_position
  low_wavelen, high_wavelen = old / c.rope_low_freq_factor, old / c.rope_high_freq_factor
  wavelen = 2 * math.pi / inv
  scaled = np.where(wavelen > low_wavelen, inv / c.rope_scaling_factor, inv)
  smooth = ((old / wavelen - c.rope_low_freq_factor)
            / (c.rope_high_freq_factor - c.rope_low_freq_factor))
  smoothed = (1 - smooth) * scaled / c.rope_scaling_factor + smooth * scaled
  medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
  return np.where(medium, smoothed, scaled)
