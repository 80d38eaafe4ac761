"""Llama 3.1 8B in flax (the MLPerf reference's NeMo Llama31Config8B, which is HuggingFace's
meta-llama/Llama-3.1-8B architecture):

- token embedding (untied from the output layer), no positional embedding;
- pre-RMSNorm decoder layers: h = x + attention(rmsnorm(x)); x = h + mlp(rmsnorm(h));
- RMSNorm x * rsqrt(mean(x^2) + eps) * scale, the statistics and the scale product in float32
  (float64 under float64 compute), cast back to the compute dtype (Megatron / Transformer
  Engine's RMSNorm; HF's LlamaRMSNorm upcasts the same way);
- grouped-query causal attention: num_heads query heads, num_kv_heads key/value heads, query
  head h reading key/value head h // (num_heads / num_kv_heads), scores scaled by
  head_dim^-0.5; RoPE on q and k in HF's rotate-half convention (dimension i paired with
  i + head_dim / 2), its inverse frequencies 1 / theta^(2i / head_dim) rescaled by Llama
  3.1's rule (`inverse_frequencies`), the cos / sin tables in float32 (float64 under
  float64) from positions 0..L-1;
- SwiGLU feed-forward down(silu(gate(x)) * up(x)); no biases and no dropout anywhere;
- final RMSNorm and the output projection lm_head; logits in float32 (float64 under float64).

Initialisation is Megatron's (NeMo's init_method_std 0.02): normal(0, 0.02) for the embedding,
q/k/v, gate/up and lm_head; o_proj and down_proj normal(0, 0.02 / sqrt(2 x num_layers)); the
RMSNorm scales at one. Parameters are float32, the compute in `dtype`.

Activations are laid out by logical names (jax_runtime.constrain; nothing without a model axis):
the residual stream whole on embed (split over model along the sequence under
parallel.sequence_parallel: Megatron-LM's sequence parallelism, GSPMD then gathering the
sequence before the split matmuls and reduce-scattering after them), q / k / v on heads (query heads and key/value heads both
split contiguously, so with a model axis dividing num_kv_heads every query head's key/value
head is on its own shard), the SwiGLU hidden on mlp, the logits on vocab.
At the reference size the model has 8,030,261,248 parameters (`count_parameters`;
tests/llama31_8b/test_llama_model.py has the formula).
"""
import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from workloads.llama31_8b import spec
from workloads.llama31_8b.rope import inverse_frequencies
from workloads.parallel import jax_attention
from workloads.parallel.jax_layers import FlatDense, remat_block
from workloads.parallel.jax_runtime import constrain

MASK_ADDER = -1e9              # the portable path's additive causal mask: exp() of it is 0
EMBED = ("batch", "length", "embed")
RESIDUAL_SPLIT = ("batch", "residual_length", "embed")     # parallel.sequence_parallel's
HEADS = ("batch", "length", "heads", "kv")


def accumulation_dtype(dtype):
  """RMSNorm statistics, RoPE tables, softmax, logits and the loss: float32 under bf16 or
  float32 compute, float64 under float64 (the parity tests)."""
  return jnp.promote_types(dtype, jnp.float32)


def rope_tables(c, length, dtype):
  """(cos, sin) [L, head_dim / 2] of positions 0..L-1, computed in `dtype` (the accumulation
  dtype: float32 as the reference's tables, float64 under float64)."""
  angles = (jnp.arange(length).astype(dtype)[:, None]
            * jnp.asarray(inverse_frequencies(c), dtype)[None])
  return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x, cos, sin):
  """x [B, L, heads, d] rotated in HF's rotate-half pairing (i, i + d/2), in cos's dtype, and
  returned in x's: x * cos + rotate_half(x) * sin."""
  half = x.shape[-1] // 2
  y = x.astype(cos.dtype)
  x1, x2 = y[..., :half], y[..., half:]
  cos, sin = cos[None, :, None, :], sin[None, :, None, :]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


def causal_mask(length):
  """[1, 1, L, L]: True where a query may see the key (the key's position <= the query's)."""
  return jnp.asarray(np.tril(np.ones((length, length), bool)))[None, None]


def causal_attention(q, k, v, scale):
  """q [B, L, H, d], k and v [B, L, K, d] (K divides H) -> [B, L, H, d], causal. The library
  op (jax_attention's choice: cuDNN's flash attention in bf16 on a GPU, XLA's elsewhere) takes
  grouped keys and values as they are and is told the mask is causal (cuDNN then skips the
  masked blocks: no [L, L] mask is made); float64 runs the portable formulation below."""
  chosen = jax_attention.implementation(q.dtype, dropout_active=False)
  if chosen == jax_attention.PORTABLE:
    return _portable_attention(q, k, v, scale)
  if chosen == jax_attention.CUDNN and q.shape[1] == 1:
    chosen = jax_attention.XLA
  return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True,
                                      implementation=chosen)


def _portable_attention(q, k, v, scale):
  """HF's eager order: q.k scaled, the causal adder and the softmax in the accumulation dtype,
  the weights back in the compute dtype against v. Query head h = kv * group + g."""
  batch, length, heads, head_dim = q.shape
  kv_heads = k.shape[2]
  q = q.reshape(batch, length, kv_heads, heads // kv_heads, head_dim)
  acc = accumulation_dtype(q.dtype)
  scores = (jnp.einsum("bqkgd,bskd->bkgqs", q, k) * scale).astype(acc)
  scores += jax_attention.mask_adder(causal_mask(length)[:, None], MASK_ADDER, acc)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgqs,bskd->bqkgd", probs, v)
  return out.reshape(batch, length, heads, head_dim)


class RMSNorm(nn.Module):
  epsilon: float
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
    acc = accumulation_dtype(self.dtype)
    y = x.astype(acc)
    y = y * jax.lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + self.epsilon)
    return (y * scale.astype(acc)).astype(self.dtype)


class DecoderLayer(nn.Module):
  config: spec.ModelConfig
  dtype: Any = jnp.float32
  residual: tuple = EMBED           # the residual stream's layout: EMBED or RESIDUAL_SPLIT

  def setup(self):
    c = self.config
    init = nn.initializers.normal(c.initializer_range)
    scaled = nn.initializers.normal(c.initializer_range / math.sqrt(2 * c.num_layers))
    dense = lambda units, kernel_init: FlatDense(units, use_bias=False, dtype=self.dtype,
                                                kernel_init=kernel_init)
    d = c.head_dim
    self.input_norm = RMSNorm(c.rms_norm_epsilon, self.dtype)
    self.q_proj = dense(c.num_heads * d, init)
    self.k_proj = dense(c.num_kv_heads * d, init)
    self.v_proj = dense(c.num_kv_heads * d, init)
    self.o_proj = dense(c.hidden_size, scaled)
    self.post_attention_norm = RMSNorm(c.rms_norm_epsilon, self.dtype)
    self.gate_proj = dense(c.intermediate_size, init)
    self.up_proj = dense(c.intermediate_size, init)
    self.down_proj = dense(c.hidden_size, scaled)

  def __call__(self, x):
    c = self.config
    batch, length, _ = x.shape
    d = c.head_dim
    y = self.input_norm(x)
    cos, sin = rope_tables(c, length, accumulation_dtype(self.dtype))
    q = constrain(self.q_proj(y).reshape(batch, length, c.num_heads, d), HEADS)
    k = constrain(self.k_proj(y).reshape(batch, length, c.num_kv_heads, d), HEADS)
    v = constrain(self.v_proj(y).reshape(batch, length, c.num_kv_heads, d), HEADS)
    q, k = constrain(apply_rope(q, cos, sin), HEADS), constrain(apply_rope(k, cos, sin), HEADS)
    context = constrain(causal_attention(q, k, v, d ** -0.5), HEADS)
    x = x + constrain(self.o_proj(context.reshape(batch, length, c.num_heads * d)),
                      self.residual)
    y = self.post_attention_norm(x)
    hidden = constrain(nn.silu(self.gate_proj(y)) * self.up_proj(y), ("batch", "length", "mlp"))
    return x + constrain(self.down_proj(hidden), self.residual)


class LlamaLM(nn.Module):
  """tokens [B, L] -> next-token logits [B, L, vocab] in the accumulation dtype. GPipe's view
  (`pipeline_layers`) is the decoder layers, the embedding riding with the first and the final
  norm and lm_head with the last."""
  config: spec.ModelConfig = dataclasses.field(default_factory=spec.ModelConfig)
  dtype: Any = jnp.float32          # compute dtype; parameters stay float32
  remat_policy: str = ""            # parallel.remat_policy, per decoder layer (jax_layers)
  sequence_parallel: bool = False   # parallel.sequence_parallel

  @property
  def residual(self):
    return RESIDUAL_SPLIT if self.sequence_parallel else EMBED

  def setup(self):
    c = self.config
    self.embed_tokens = nn.Embed(c.vocab_size, c.hidden_size,
                                 embedding_init=nn.initializers.normal(c.initializer_range))
    layer = remat_block(DecoderLayer, self.remat_policy)
    for i in range(c.num_layers):
      setattr(self, f"layer_{i}", layer(c, self.dtype, self.residual))
    self.final_norm = RMSNorm(c.rms_norm_epsilon, self.dtype)
    self.lm_head = FlatDense(c.vocab_size, use_bias=False, dtype=self.dtype,
                            kernel_init=nn.initializers.normal(c.initializer_range))

  def __call__(self, tokens):
    return self.head(self.decode(self.embed(tokens), 0, self.config.num_layers))

  def embed(self, tokens):
    """tokens [B, L] -> the residual stream [B, L, hidden] in the compute dtype."""
    return constrain(self.embed_tokens(tokens).astype(self.dtype), self.residual)

  def decode(self, x, start, end):
    """Decoder layers [start, end) on x [B, L, hidden]."""
    for i in range(start, end):
      x = getattr(self, f"layer_{i}")(x)
    return x

  def head(self, x):
    """Final norm and lm_head: x [B, L, hidden] -> logits [B, L, vocab], accumulation dtype."""
    logits = constrain(self.lm_head(self.final_norm(x)), ("batch", "length", "vocab"))
    return logits.astype(accumulation_dtype(self.dtype))

  def pipeline_layers(self, x, batch, start, end, train):
    """GPipe's view: decoder layers [start, end) on x [b, L, hidden] (what the stage before
    sent), the first embedding batch['tokens'], the last applying the head: -> (x, logits or
    None). `train` changes nothing (no dropout); kept for the pipeline's contract."""
    del train
    if start == 0:
      x = self.embed(batch["tokens"])
    x = self.decode(x, start, end)
    if end < self.config.num_layers:
      return x, None
    return x, self.head(x)


def build(cfg, dtype=jnp.float32) -> LlamaLM:
  """The model of the workload config `cfg` (cfg.model), computing in `dtype`."""
  return LlamaLM(config=cfg.model, dtype=dtype, remat_policy=cfg.parallel.remat_policy,
                 sequence_parallel=cfg.parallel.sequence_parallel)


def parameter_shapes(model_cfg):
  """The parameters' shapes (jax.ShapeDtypeStruct tree) from an abstract init: nothing is
  allocated, whatever the size."""
  model = LlamaLM(config=model_cfg)
  tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  return jax.eval_shape(lambda t: model.init(jax.random.key(0), t), tokens)["params"]


def count_parameters(model_cfg) -> int:
  """Parameters of the model of `model_cfg`, from their shapes (8,030,261,248 at the
  reference's)."""
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(parameter_shapes(model_cfg)))


# ----------------------------------------------------------------------------------- loss

def token_nll(logits, labels):
  """Per-token negative log-likelihood [B, L] of `labels` under `logits` (log-softmax in the
  logits' dtype: float32, float64 under float64)."""
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]


def _token_weights(batch, dtype):
  mask = batch.get("loss_mask")
  if mask is None:
    return jnp.ones(batch["labels"].shape, dtype)
  return mask.astype(dtype)


def loss_sums(logits, batch):
  """Sum over the batch's tokens of the NLL of batch['labels'] (weighted by
  batch['loss_mask'] where present): the mean loss's numerator, which a pipeline sums over its
  micro-batches."""
  nll = token_nll(logits, batch["labels"])
  return jnp.sum(_token_weights(batch, nll.dtype) * nll)


def loss_denominators(batch, dtype):
  """The tokens `loss_sums` counts (the sum of loss_mask, or every label)."""
  return jnp.sum(_token_weights(batch, dtype))


def lm_loss(logits, batch):
  """The reference's loss: mean token NLL over the counted tokens."""
  return loss_sums(logits, batch) / loss_denominators(batch, logits.dtype)


def eval_sums(logits, batch, example_mask):
  """(NLL summed over the tokens of the real examples (example_mask [B] 1, padding rows 0),
  tokens counted): the log-perplexity's numerator and denominator."""
  nll = token_nll(logits, batch["labels"])
  weights = _token_weights(batch, nll.dtype) * example_mask.astype(nll.dtype)[:, None]
  return jnp.sum(weights * nll), jnp.sum(weights)
