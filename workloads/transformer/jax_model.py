"""Transformer (big) in flax, as the MLPerf reference builds it (retired `transformer`,
model/transformer.py, attention_layer.py, ffn_layer.py, embedding_layer.py):

- one embedding matrix shared by source, target and the pre-softmax projection, initialised
  normal(0, hidden^-0.5); lookups are zeroed at padding and scaled by sqrt(hidden);
- sinusoidal positions (formulas.position_encoding), dropout on the embedded sum;
- pre-LayerNorm residual blocks (x + dropout(f(LayerNorm(x)))) and a final LayerNorm on each
  stack, epsilon 1e-6;
- attention without biases: queries scaled by kv^-0.5, padding / causal biases of -1e9,
  dropout on the attention weights (the masks are boolean here; jax_attention.py adds the
  -1e9 on the reference's path and picks the backend's fused attention elsewhere); kernels [hidden, heads, kv] and [heads, kv, hidden],
  Glorot-uniform over the [hidden, hidden] matrix they are (flax's DenseGeneral initialises
  the flattened matrix);
- ReLU feed-forward with biases and dropout after the ReLU.

Decoding (`encode`, `init_cache`, `decode_step`) keeps every decoder layer's self-attention
keys and values in a fixed-size cache written at the step's position, and the encoder-decoder
keys and values computed once; beam search (jax_beam_search.py) tiles and reorders it.
Parameter paths are listed with their logical axes in spec.PARAM_AXES; tf_model.py uses the
same names. Activations are laid out by logical names at the layer boundaries of Mesh-TF's
layout (jax_runtime.constrain; nothing without a model axis): queries, keys, values and the KV
cache split on heads, the feed-forward hidden on mlp, logits on vocab, and the attention and
feed-forward outputs whole on embed, where GSPMD puts the all-reduce over `model`.
"""
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from workloads.common import moe as moe_lib
from workloads.parallel import jax_attention
from workloads.parallel.jax_layers import ExampleDropout, remat_block
from workloads.parallel.jax_moe import MoEFeedForward
from workloads.parallel.jax_runtime import constrain
from workloads.transformer import formulas

PAD_ID, EOS_ID = 0, 1
HEADS = ("batch", "length", "heads", "kv")        # logical names of q, k, v and the KV cache
EMBED = ("batch", "length", "embed")


def accumulation_dtype(dtype):
  """Softmax and logits: float32 under bf16 or float32 compute, float64 under float64."""
  return jnp.promote_types(dtype, jnp.float32)


def padding_mask(ids):
  """[B, 1, 1, L]: False on padding keys (the reference's -1e9 bias there)."""
  return (ids != PAD_ID)[:, None, None, :]


def causal_mask(length):
  """[1, 1, L, L]: False where a query would see a later position."""
  return jnp.asarray(np.tril(np.ones((length, length), bool)))[None, None]


def segment_mask(query_segments, key_segments, causal=False):
  """Packed rows (workloads/common/packing.py): [B, 1, Lq, Lk], False where query and key
  belong to different examples of the row, the key is padding (segment 0) or, causal, later."""
  allowed = ((query_segments[:, :, None] == key_segments[:, None, :])
             & (key_segments[:, None, :] != 0))
  if causal:
    allowed &= jnp.asarray(np.tril(np.ones((query_segments.shape[1],) * 2, bool)))[None]
  return allowed[:, None]


def shift_right(targets, segments=None):
  """The decoder's inputs: targets one position later, start id 0 first (as the reference);
  in a packed row, also at the first position of each example."""
  shifted = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  if segments is not None:
    shifted *= (segments == jnp.pad(segments, ((0, 0), (1, 0)))[:, :-1]).astype(shifted.dtype)
  return shifted


class Attention(nn.Module):
  hidden_size: int
  num_heads: int
  dropout: float
  dtype: Any = jnp.float32

  def setup(self):
    kv = self.hidden_size // self.num_heads
    dense = functools.partial(nn.DenseGeneral, features=(self.num_heads, kv), use_bias=False,
                              kernel_init=nn.initializers.xavier_uniform(), dtype=self.dtype)
    self.query, self.key, self.value = dense(), dense(), dense()
    self.output = nn.DenseGeneral(self.hidden_size, axis=(-2, -1), use_bias=False,
                                  kernel_init=nn.initializers.xavier_uniform(), dtype=self.dtype)
    self.weights_dropout = ExampleDropout(self.dropout)

  def keys_values(self, y):
    return constrain(self.key(y), HEADS), constrain(self.value(y), HEADS)

  def attend(self, x, k, v, mask, train):
    """x [B, Lq, H] against k, v [B, Lk, heads, kv]; mask broadcasts to [B, heads, Lq, Lk]."""
    scale = (self.hidden_size // self.num_heads) ** -0.5

    def portable(q, k, v, mask):     # the reference's order: scale the queries, add the bias
      acc = accumulation_dtype(self.dtype)
      logits = jnp.einsum("bqnh,bknh->bnqk", q * scale, k).astype(acc)
      logits += jax_attention.mask_adder(mask, formulas.ATTENTION_MASK, acc)
      weights = jax.nn.softmax(logits, axis=-1).astype(self.dtype)
      weights = self.weights_dropout(weights, deterministic=not train)
      return jnp.einsum("bnqk,bknh->bqnh", weights, v)

    q = constrain(self.query(x), HEADS)
    context = jax_attention.attend(q, k, v, mask, portable, scale=scale,
                                   dropout_active=train and self.dropout > 0)
    return constrain(self.output(context), EMBED)

  def __call__(self, x, y, mask, train):
    k, v = self.keys_values(y)
    return self.attend(x, k, v, mask, train)


class FeedForward(nn.Module):
  hidden_size: int
  filter_size: int
  dropout: float
  dtype: Any = jnp.float32

  def setup(self):
    dense = functools.partial(nn.Dense, kernel_init=nn.initializers.xavier_uniform(),
                              dtype=self.dtype)
    self.filter, self.output = dense(self.filter_size), dense(self.hidden_size)
    self.relu_dropout = ExampleDropout(self.dropout)

  def __call__(self, x, train):
    hidden = constrain(nn.relu(self.filter(x)), ("batch", "length", "mlp"))
    return constrain(self.output(self.relu_dropout(hidden, deterministic=not train)), EMBED)


def _norm(dtype):
  return nn.LayerNorm(epsilon=formulas.LAYER_NORM_EPSILON, dtype=dtype)


def _ffn(cfg, index, dtype):
  """Layer `index`'s feed-forward: the experts' mixture where model.moe puts one, else dense."""
  if moe_lib.is_expert_layer(cfg.moe, index):
    return MoEFeedForward(cfg.hidden_size, cfg.filter_size, cfg.moe, dtype)
  return FeedForward(cfg.hidden_size, cfg.filter_size, cfg.relu_dropout, dtype)


def _apply_ffn(ffn, x, real, train):
  """real [B, L]: False at padding (the router routes it nowhere); None: every token real."""
  if isinstance(ffn, MoEFeedForward):
    real = jnp.ones(x.shape[:2], bool) if real is None else real
    return ffn(x, real, train)
  return ffn(x, train)


class SelfAttentionLayer(nn.Module):
  """What an encoder and a decoder layer share: self-attention and the feed-forward (layer
  `index`'s: model.moe may make it experts), each after its own norm, and the dropout on what
  each adds to the residual."""
  cfg: Any
  dtype: Any = jnp.float32
  index: int = 0

  def setup(self):
    c = self.cfg
    self.self_attention = Attention(c.hidden_size, c.num_heads, c.attention_dropout, self.dtype)
    self.self_attention_norm = _norm(self.dtype)
    self.ffn = _ffn(c, self.index, self.dtype)
    self.ffn_norm = _norm(self.dtype)
    self.residual_dropout = ExampleDropout(c.dropout)


class EncoderLayer(SelfAttentionLayer):
  def __call__(self, x, bias, train, real=None):
    drop = lambda y: self.residual_dropout(y, deterministic=not train)
    y = self.self_attention_norm(x)
    x = x + drop(self.self_attention(y, y, bias, train))
    return x + drop(_apply_ffn(self.ffn, self.ffn_norm(x), real, train))


class DecoderLayer(SelfAttentionLayer):
  def setup(self):
    super().setup()
    c = self.cfg
    self.encdec_attention = Attention(c.hidden_size, c.num_heads, c.attention_dropout,
                                      self.dtype)
    self.encdec_attention_norm = _norm(self.dtype)

  def _rest(self, x, encdec_k, encdec_v, encoder_bias, train, real=None):
    drop = lambda y: self.residual_dropout(y, deterministic=not train)
    x = x + drop(self.encdec_attention.attend(self.encdec_attention_norm(x), encdec_k,
                                              encdec_v, encoder_bias, train))
    return x + drop(_apply_ffn(self.ffn, self.ffn_norm(x), real, train))

  def __call__(self, x, encoded, self_bias, encoder_bias, train, real=None):
    drop = lambda y: self.residual_dropout(y, deterministic=not train)
    y = self.self_attention_norm(x)
    x = x + drop(self.self_attention(y, y, self_bias, train))
    k, v = self.encdec_attention.keys_values(encoded)
    return self._rest(x, k, v, encoder_bias, train, real)

  def encdec_keys_values(self, encoded):
    return self.encdec_attention.keys_values(encoded)

  def step(self, x, i, cache, encoder_bias):
    """One position: x [B, 1, H] at position i; cache {'k', 'v': [B, max_len, heads, kv],
    'encdec_k', 'encdec_v'} -> (x, updated cache)."""
    y = self.self_attention_norm(x)
    k, v = self.self_attention.keys_values(y)
    keys = jax.lax.dynamic_update_slice_in_dim(cache["k"], k.astype(cache["k"].dtype), i, 1)
    values = jax.lax.dynamic_update_slice_in_dim(cache["v"], v.astype(cache["v"].dtype), i, 1)
    visible = (jnp.arange(keys.shape[1]) <= i)[None, None, None, :]
    x = x + self.self_attention.attend(y, keys, values, visible, False)
    x = self._rest(x, cache["encdec_k"], cache["encdec_v"], encoder_bias, False)
    return x, {**cache, "k": keys, "v": values}


class LayerStack(nn.Module):
  """cfg.num_layers layers of the subclass's `layer_class` (`layer_0`, ...; each re-materialized
  per parallel.remat_policy, its `train` argument, at `train_argnum`, static), then the
  output norm."""
  cfg: Any
  dtype: Any = jnp.float32
  remat_policy: str = ""
  layer_class = None
  train_argnum = None

  def setup(self):
    layer = remat_block(self.layer_class, self.remat_policy, (self.train_argnum,))
    for i in range(self.cfg.num_layers):
      setattr(self, f"layer_{i}", layer(self.cfg, self.dtype, i))
    self.output_norm = _norm(self.dtype)

  def layers(self):
    return [getattr(self, f"layer_{i}") for i in range(self.cfg.num_layers)]


class Encoder(LayerStack):
  layer_class = EncoderLayer
  train_argnum = 3

  def __call__(self, x, bias, train, real=None):
    for layer in self.layers():
      x = layer(x, bias, train, real)
    return self.output_norm(x)


class Decoder(LayerStack):
  layer_class = DecoderLayer
  train_argnum = 5

  def __call__(self, x, encoded, self_bias, encoder_bias, train, real=None):
    for layer in self.layers():
      x = layer(x, encoded, self_bias, encoder_bias, train, real)
    return self.output_norm(x)

  def init_cache(self, encoded, max_decode_length):
    """Per layer: empty self-attention keys/values for max_decode_length positions and the
    encoder-decoder keys/values of `encoded` (computed once per sentence)."""
    c = self.cfg
    shape = (encoded.shape[0], max_decode_length, c.num_heads, c.hidden_size // c.num_heads)
    cache = {}
    for i, layer in enumerate(self.layers()):
      k, v = layer.encdec_keys_values(encoded)
      cache[f"layer_{i}"] = {"k": constrain(jnp.zeros(shape, k.dtype), HEADS),
                             "v": constrain(jnp.zeros(shape, v.dtype), HEADS),
                             "encdec_k": k, "encdec_v": v}
    return cache

  def step(self, x, i, cache, encoder_bias):
    new = {}
    for n, layer in enumerate(self.layers()):
      x, new[f"layer_{n}"] = layer.step(x, i, cache[f"layer_{n}"], encoder_bias)
    return self.output_norm(x), new


class Transformer(nn.Module):
  """__call__(inputs, targets) -> logits [B, L, V] (float32, or float64 under float64)."""
  cfg: Any                          # spec.ModelConfig
  dtype: Any = jnp.float32          # compute dtype; parameters stay float32
  remat_policy: str = ""            # parallel.remat_policy, per encoder/decoder layer

  def setup(self):
    c = self.cfg
    self.embedding_shared = nn.Embed(c.vocab_size, c.hidden_size,
                                     embedding_init=nn.initializers.normal(c.hidden_size ** -0.5))
    self.encoder = Encoder(c, self.dtype, self.remat_policy)
    self.decoder = Decoder(c, self.dtype, self.remat_policy)
    self.embedding_dropout = ExampleDropout(c.dropout)          # the source embedding's
    self.target_embedding_dropout = ExampleDropout(c.dropout)   # the target embedding's

  def _lookup(self, ids):
    """Scaled embedding lookups, zero at padding."""
    x = constrain(self.embedding_shared(ids).astype(self.dtype), EMBED)
    return x * (ids != PAD_ID)[..., None].astype(self.dtype) * self.cfg.hidden_size ** 0.5

  def _embed(self, ids, train, positions=None, target=False):
    """Lookups plus position encodings: of positions 0..L-1, or of each packed example's own
    `positions` [B, L]. Source and target have a dropout each (its key: one per call site)."""
    table = jnp.asarray(formulas.position_encoding(ids.shape[1], self.cfg.hidden_size))
    table = table[None] if positions is None else jnp.take(table, positions, axis=0)
    x = self._lookup(ids) + table.astype(self.dtype)
    dropout = self.target_embedding_dropout if target else self.embedding_dropout
    return dropout(x, deterministic=not train)

  def _biases(self, inputs, targets, packed):
    """(encoder self-attention mask, decoder self-attention mask, encoder-decoder mask): the
    reference's biases, as boolean masks (jax_attention.py)."""
    if packed is None:
      mask = padding_mask(inputs)
      return mask, causal_mask(targets.shape[1]), mask
    inputs_segments, segments = packed["inputs_segmentation"], packed["targets_segmentation"]
    return (segment_mask(inputs_segments, inputs_segments),
            segment_mask(segments, segments, causal=True),
            segment_mask(segments, inputs_segments))

  def _embed_inputs(self, inputs, train, packed):
    return self._embed(inputs, train, None if packed is None else packed["inputs_position"])

  def _embed_targets(self, targets, train, packed):
    if packed is None:
      return self._embed(shift_right(targets), train, target=True)
    return self._embed(shift_right(targets, packed["targets_segmentation"]), train,
                       packed["targets_position"], target=True)

  def encode(self, inputs, train=False, packed=None):
    """-> (encoder outputs [B, L, H], its attention mask [B, 1, 1, L]). `packed`: a packed
    batch's segmentation and position features (then the mask is [B, 1, L, L])."""
    if packed is None:
      bias = padding_mask(inputs)
    else:
      bias = self._biases(inputs, inputs, packed)[0]
    return self.encoder(self._embed_inputs(inputs, train, packed), bias, train,
                        inputs != PAD_ID), bias

  def logits(self, x):
    """The shared embedding's attend in the compute dtype, cast to float32 after it: the
    tokens x hidden x vocab matmul is 8% of a step's FLOPs, and Embed.attend promotes to the
    float32 table (TF32 GEMMs, 10 of an 82 ms step on an H100: docs/benchmarks.md). The
    lookup keeps the float32 table, so its gradient's scatter-add stays float32."""
    table = self.embedding_shared.embedding.astype(self.dtype)
    return constrain(jnp.einsum("...h,vh->...v", x.astype(self.dtype), table).astype(
        accumulation_dtype(self.dtype)), ("batch", "length", "vocab"))

  def __call__(self, inputs, targets, train=False, packed=None):
    """`packed`: the segmentation and position features of packed rows, or None."""
    encoder_bias, self_bias, encdec_bias = self._biases(inputs, targets, packed)
    encoded = self.encoder(self._embed_inputs(inputs, train, packed), encoder_bias, train,
                           inputs != PAD_ID)
    x = self._embed_targets(targets, train, packed)
    return self.logits(self.decoder(x, encoded, self_bias, encdec_bias, train,
                                    targets != PAD_ID))

  def pipeline_layers(self, carry, inputs, targets, packed, start, end, train):
    """GPipe's view (spec.pipeline_layers): layers [start, end) of the one list of encoder
    layers then decoder layers, on carry {'encoded', 'decoded'} [b, L, H] (what the stage
    before sent). The first layer embeds the source, the last encoder layer applies the
    encoder's final norm, the first decoder layer embeds the targets; after the last decoder
    layer the decoder's norm and the logits: -> (carry, logits or None)."""
    n = self.cfg.num_layers
    encoder_bias, self_bias, encdec_bias = self._biases(inputs, targets, packed)
    encoded, decoded = carry["encoded"], carry["decoded"]
    for i in range(start, end):
      if i == 0:
        encoded = self._embed_inputs(inputs, train, packed)
      if i < n:
        encoded = getattr(self.encoder, f"layer_{i}")(encoded, encoder_bias, train)
        if i == n - 1:
          encoded = self.encoder.output_norm(encoded)
        continue
      if i == n:
        decoded = self._embed_targets(targets, train, packed)
      decoded = getattr(self.decoder, f"layer_{i - n}")(decoded, encoded, self_bias,
                                                         encdec_bias, train)
    carry = {"encoded": encoded, "decoded": decoded}
    if end < 2 * n:
      return carry, None
    return carry, self.logits(self.decoder.output_norm(decoded))

  # ------------------------------------------------------------------ decoding
  def init_cache(self, encoded, max_decode_length):
    return self.decoder.init_cache(encoded, max_decode_length)

  def decode_step(self, ids, i, cache, encoder_bias):
    """ids [B] (the token at position i) -> (logits [B, V], cache)."""
    x = self._lookup(ids[:, None]) + _position_at(i, self.cfg.hidden_size).astype(self.dtype)[None]
    x, cache = self.decoder.step(x, i, cache, encoder_bias)
    return self.logits(x)[:, 0], cache


def _position_at(i, hidden_size):
  """formulas.position_encoding's row i (a traced position), [1, hidden_size]."""
  half = hidden_size // 2
  increment = np.log(1.0e4) / max(half - 1, 1)
  inverse = jnp.asarray(np.exp(np.arange(half, dtype=np.float64) * -increment))
  angles = jnp.asarray(i, inverse.dtype) * inverse
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)])[None]


def build(cfg, dtype=jnp.float32) -> Transformer:
  """The model of the workload config `cfg` (cfg.model), computing in `dtype`."""
  return Transformer(cfg.model, dtype, cfg.parallel.remat_policy)


def smoothed_cross_entropy(logits, labels, label_smoothing):
  """(sum of per-token losses over non-padding labels, number of non-padding labels): the
  reference's padded_cross_entropy_loss (formulas.smoothing)."""
  vocab = logits.shape[-1]
  confidence, low, constant = formulas.smoothing(label_smoothing, vocab)
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  soft = jax.nn.one_hot(labels, vocab, dtype=logits.dtype) * (confidence - low) + low
  xent = -jnp.sum(soft * log_probs, axis=-1) - constant
  weights = (labels != PAD_ID).astype(logits.dtype)
  return jnp.sum(xent * weights), jnp.sum(weights)
