"""Scaled dot-product attention for the JAX models, on the path each backend runs best.

`jax.nn.dot_product_attention` is the library's attention op: on an NVIDIA GPU in bf16 or fp16
its 'cudnn' implementation is cuDNN's fused (flash) attention, which never writes the [B, heads,
Lq, Lk] weights to memory; elsewhere its 'xla' implementation is the einsum-softmax-einsum XLA
fuses as it can. Two cases keep each model's own formulation (`portable`, the reference's
arithmetic in the reference's order, which the float64 parity tests compare with Keras):
- float64 compute: the library op rounds its softmax to float32;
- attention weights under dropout (training with BERT's and the Transformer's reference 0.1):
  the public op has no dropout, and the per-example masks here (jax_layers.ExampleDropout) are
  what makes a pipelined or resharded run equal one device.
So a GPU runs cuDNN attention in eval, in the beam-search decode and in training without
attention dropout; a CPU runs the XLA implementation there, equal to the portable one to
float32 rounding (tests/parallel/test_jax_attention.py).

Masks are boolean, True where a query may attend a key, broadcastable to [B, heads, Lq, Lk]
(padding [B, 1, 1, Lk], causal [1, 1, Lq, Lk], packed segments [B, 1, Lq, Lk]). The library op
gives a masked key the dtype's lowest value; the portable paths add the reference's constant
(-1e4 in BERT, -1e9 in the Transformer): after the softmax both are exactly zero weight.
"""
import os

import jax
import jax.numpy as jnp

PORTABLE, XLA, CUDNN = "portable", "xla", "cudnn"
# HARNESS_ATTENTION=portable|xla|cudnn overrides the choice (e.g. portable, to compare a GPU
# run with and without the library op); unset: chosen per backend and dtype.
OVERRIDE_ENV = "HARNESS_ATTENTION"


def implementation(dtype, dropout_active: bool, backend: str | None = None) -> str:
  """Which path a model's attention takes: 'portable', 'xla' or 'cudnn'."""
  chosen = os.environ.get(OVERRIDE_ENV, "")
  if chosen not in ("", PORTABLE, XLA, CUDNN):
    raise ValueError(f"{OVERRIDE_ENV}={chosen!r}; allowed: {PORTABLE}, {XLA}, {CUDNN} or unset")
  if dropout_active or jnp.dtype(dtype) == jnp.float64:
    return PORTABLE
  if chosen:
    return chosen
  backend = backend or jax.default_backend()
  if backend in ("gpu", "cuda") and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
    return CUDNN
  return XLA


def attend(q, k, v, mask, portable, *, scale: float, dropout_active: bool):
  """q [B, Lq, heads, kv], k and v [B, Lk, heads, kv], mask (see above) -> [B, Lq, heads, kv].
  `portable(q, k, v, mask)` is the model's own formulation (scale included), used where the
  library op is not (see the module note); `scale` multiplies q.k in the library op."""
  chosen = implementation(q.dtype, dropout_active)
  if chosen == PORTABLE:
    return portable(q, k, v, mask)
  if chosen == CUDNN and q.shape[1] == 1:
    chosen = XLA        # a decode step's one query: a matrix-vector product, nothing to tile
  if chosen == CUDNN and mask is not None:
    # cuDNN takes a mask as an additive bias of the whole [Lq, Lk] (JAX 0.11.2 on an H100
    # refused the padding mask's [B, 1, 1, Lk]: "Bias must have same seq length as QKV")
    mask = jnp.broadcast_to(mask, mask.shape[:2] + (q.shape[1], k.shape[1]))
  return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, implementation=chosen)


def mask_adder(mask, masked_value, dtype):
  """The portable paths' additive form of a mask: 0 where attended, `masked_value` where not."""
  return jnp.where(mask, 0.0, masked_value).astype(dtype)
