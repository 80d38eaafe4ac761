"""Transformer (big) in Keras 3: the same architecture, initialisation and parameter names as
jax_model.py (see its docstring for the reference's choices), so parameters convert one to one
by flax path (tf_layers.load_flax_variables). At the reference size: 210,804,736 parameters.

The layers are small Keras layers written here, with the flax leaf names (kernel, bias, scale,
embedding): Keras' MultiHeadAttention has a different projection layout and Glorot fans, and
its LayerNormalization names its weights gamma/beta. Decoding (`encode`, `init_cache`,
`decode_step`) mirrors jax_model.py for tf_beam_search.py.

With a runtime whose mesh has a model axis (tf_model_parallel.py) the model is Megatron's, as
jax_model.py's layout: q/k/v kernels column-parallel on heads, the attention output
row-parallel, the feed-forward filter column-parallel and its output row-parallel, the shared
embedding vocabulary-parallel (lookups and logits); a dimension the axis does not divide stays
whole. Without one, the layers are the plain ones.
"""
import numpy as np

import keras
from keras import layers, ops

from workloads.common import moe as moe_lib
from workloads.parallel import tf_layers, tf_pipeline
from workloads.parallel import tf_model_parallel as mp
from workloads.parallel.tf_moe import MoEFeedForward
from workloads.transformer import formulas

PAD_ID, EOS_ID = 0, 1


def accumulation_dtype(policy):
  """Softmax, attention biases, LayerNorm statistics and logits: float32 under mixed_bfloat16
  or float32, float64 under float64 (the parity tests)."""
  return "float64" if policy.compute_dtype == "float64" else "float32"


def glorot(fan_in, fan_out):
  limit = formulas.glorot_limit(fan_in, fan_out)
  return keras.initializers.RandomUniform(-limit, limit)


class Projection(layers.Layer):
  """A bias-free projection whose kernel has the flax DenseGeneral layout; `equation` names it
  (x's trailing dimensions contracted with the kernel's leading ones). On a model axis: `split`
  is the kernel dimension on heads, `parallel` 'column' (input copied to the model peers) or
  'row' (partial outputs summed over them)."""

  @mp.in_path
  def __init__(self, kernel_shape, equation, fans, runtime=None, **kwargs):
    super().__init__(**kwargs)
    self.equation, self.runtime = equation, runtime
    self.contracted = contracted_dims(equation)
    self.kernel = mp.sharded_or_whole(self, runtime, "kernel", kernel_shape, glorot(*fans))
    # PARAM_AXES' split: on a contracted dimension the partial outputs are summed over the
    # model peers (row), on an output one the input is copied to them (column)
    self.parallel = (None if not isinstance(self.kernel, mp.ShardedWeight) else
                     "row" if self.kernel.dim < self.contracted else "column")

  def call(self, x):
    if not isinstance(self.kernel, mp.ShardedWeight):
      return ops.tensordot(x, self.kernel, self.contracted)
    if not mp.is_sharded(self.kernel):           # whole, gathered for the eval
      return ops.tensordot(x, mp.read(self.kernel, x.dtype), self.contracted)
    if self.parallel == "column":
      x = mp.copy_to_model(self.runtime, x)
    y = ops.tensordot(x, mp.read(self.kernel, x.dtype), self.contracted)
    return mp.reduce_from_model(self.runtime, y) if self.parallel == "row" else y


def contracted_dims(equation):
  """How many trailing dimensions of x an einsum `x,kernel->out` contracts with the kernel's
  leading ones ('bld,dnh->blnh': 1, 'blnh,nhd->bld': 2). The projections and the logits run as
  tensordot, one 2-D MatMul over all tokens: keras.ops.einsum on TF writes a batched x against
  an unbatched kernel as a broadcasting BatchMatMulV2, whose kernel gradient is one matmul per
  batch row summed afterwards (on the logits a [batch, hidden, vocab] intermediate; about 5% of
  a small Transformer's step on XLA:CPU, docs/platform.md)."""
  inputs, out = equation.split("->")
  x, kernel = inputs.split(",")
  n = sum(c not in out for c in x)
  if x[len(x) - n:] != kernel[:n] or out != x[:len(x) - n] + kernel[n:]:
    raise ValueError(f"equation {equation!r}: allowed: x's trailing dimensions contracted with "
                     "the kernel's leading ones, the output x's rest then the kernel's")
  return n


class LayerNorm(layers.Layer):
  """(x - mean) / sqrt(var + 1e-6) * scale + bias, statistics in the accumulation dtype. The
  variance reads the mean through stop_gradient, as tf.nn.moments does: its gradient with
  respect to the mean is 2 * mean(x - mean) = 0, so the backward pass is the same without it
  (XLA:CPU does not find that zero itself; 1% of a small Transformer's step)."""

  def __init__(self, hidden_size, **kwargs):
    super().__init__(**kwargs)
    self.scale = self.add_weight(shape=(hidden_size,), initializer="ones", name="scale")
    self.bias = self.add_weight(shape=(hidden_size,), initializer="zeros", name="bias")

  def call(self, x):
    acc = accumulation_dtype(self.dtype_policy)
    x32 = ops.cast(x, acc)
    mean = ops.mean(x32, axis=-1, keepdims=True)
    var = ops.mean(ops.square(x32 - ops.stop_gradient(mean)), axis=-1, keepdims=True)
    y = (x32 - mean) * ops.rsqrt(var + formulas.LAYER_NORM_EPSILON)
    return ops.cast(y * ops.cast(self.scale, acc) + ops.cast(self.bias, acc), x.dtype)


class Attention(tf_layers.BuiltInInitLayer):
  @mp.in_path
  def __init__(self, hidden_size, num_heads, dropout, runtime=None, **kwargs):
    super().__init__(**kwargs)
    kv = hidden_size // num_heads
    self.kv = kv
    fans = (hidden_size, hidden_size)       # the reference's [hidden, hidden] matrices
    project = lambda name: Projection((hidden_size, num_heads, kv), "bld,dnh->blnh", fans,
                                      runtime, name=name, dtype=self.dtype_policy)
    self.query, self.key, self.value = project("query"), project("key"), project("value")
    self.output_projection = Projection((num_heads, kv, hidden_size), "blnh,nhd->bld", fans,
                                        runtime, name="output", dtype=self.dtype_policy)
    self.weights_dropout = tf_layers.ExampleDropout(dropout, dtype=self.dtype_policy)

  def sublayers(self):
    return {"query": self.query, "key": self.key, "value": self.value,
            "output": self.output_projection}

  def keys_values(self, y):
    return self.key(y), self.value(y)

  def attend(self, x, k, v, bias, training=False):
    acc = accumulation_dtype(self.dtype_policy)
    q = self.query(x) * self.kv ** -0.5
    logits = ops.cast(ops.einsum("bqnh,bknh->bnqk", q, k), acc) + ops.cast(bias, acc)
    weights = ops.cast(ops.softmax(logits, axis=-1), v.dtype)
    weights = self.weights_dropout(weights, training=training)
    return self.output_projection(ops.einsum("bnqk,bknh->bqnh", weights, v))

  def call(self, x, y, bias, training=False):
    k, v = self.keys_values(y)
    return self.attend(x, k, v, bias, training)


class FeedForward(tf_layers.BuiltInInitLayer):
  @mp.in_path
  def __init__(self, hidden_size, filter_size, dropout, runtime=None, **kwargs):
    super().__init__(**kwargs)
    if runtime is not None and runtime.model > 1:
      self.filter = mp.ParallelDense(hidden_size, filter_size, runtime, "relu",
                                  name="filter", dtype=self.dtype_policy)
      self.output_dense = mp.ParallelDense(filter_size, hidden_size, runtime,
                                        name="output", dtype=self.dtype_policy)
    else:
      self.filter = layers.Dense(filter_size, activation="relu", name="filter",
                                 kernel_initializer="glorot_uniform", dtype=self.dtype_policy)
      self.output_dense = layers.Dense(hidden_size, name="output",
                                       kernel_initializer="glorot_uniform",
                                       dtype=self.dtype_policy)
    self.relu_dropout = tf_layers.ExampleDropout(dropout, dtype=self.dtype_policy)

  def sublayers(self):
    return {"filter": self.filter, "output": self.output_dense}

  def call(self, x, training=False):
    return self.output_dense(self.relu_dropout(self.filter(x), training=training))


def _ffn(cfg, index, runtime, policy):
  """Layer `index`'s feed-forward: the experts' mixture where model.moe puts one, else dense."""
  if moe_lib.is_expert_layer(cfg.moe, index):
    return MoEFeedForward(cfg.hidden_size, cfg.filter_size, cfg.moe, accumulation_dtype(policy),
                          runtime, name="ffn", dtype=policy)
  return FeedForward(cfg.hidden_size, cfg.filter_size, cfg.relu_dropout, runtime, name="ffn",
                     dtype=policy)


def _apply_ffn(ffn, x, real, training):
  """real [B, L]: False at padding (the router routes it nowhere); None: every token real."""
  if isinstance(ffn, MoEFeedForward):
    real = ops.ones(ops.shape(x)[:2], "bool") if real is None else real
    return ffn(x, real, training=training)
  return ffn(x, training=training)


class EncoderLayer(tf_layers.BuiltInInitLayer):
  @mp.in_path
  def __init__(self, cfg, runtime=None, index=0, **kwargs):
    super().__init__(**kwargs)
    p = self.dtype_policy
    self.self_attention = Attention(cfg.hidden_size, cfg.num_heads, cfg.attention_dropout,
                                    runtime, name="self_attention", dtype=p)
    self.self_attention_norm = LayerNorm(cfg.hidden_size, name="self_attention_norm", dtype=p)
    self.ffn = _ffn(cfg, index, runtime, p)
    self.ffn_norm = LayerNorm(cfg.hidden_size, name="ffn_norm", dtype=p)
    self.residual_dropout = tf_layers.ExampleDropout(cfg.dropout, dtype=p)

  def sublayers(self):
    return {"self_attention": self.self_attention, "self_attention_norm": self.self_attention_norm,
            "ffn": self.ffn, "ffn_norm": self.ffn_norm}

  def call(self, x, bias, training=False, real=None):
    drop = lambda y: self.residual_dropout(y, training=training)
    y = self.self_attention_norm(x)
    x = x + drop(self.self_attention(y, y, bias, training=training))
    return x + drop(_apply_ffn(self.ffn, self.ffn_norm(x), real, training))


class DecoderLayer(tf_layers.BuiltInInitLayer):
  @mp.in_path
  def __init__(self, cfg, runtime=None, index=0, **kwargs):
    super().__init__(**kwargs)
    p = self.dtype_policy
    attention = lambda name: Attention(cfg.hidden_size, cfg.num_heads, cfg.attention_dropout,
                                       runtime, name=name, dtype=p)
    self.self_attention, self.encdec_attention = attention("self_attention"), \
        attention("encdec_attention")
    norm = lambda name: LayerNorm(cfg.hidden_size, name=name, dtype=p)
    self.self_attention_norm, self.encdec_attention_norm = norm("self_attention_norm"), \
        norm("encdec_attention_norm")
    self.ffn = _ffn(cfg, index, runtime, p)
    self.ffn_norm = norm("ffn_norm")
    self.residual_dropout = tf_layers.ExampleDropout(cfg.dropout, dtype=p)

  def sublayers(self):
    return {"self_attention": self.self_attention, "self_attention_norm": self.self_attention_norm,
            "encdec_attention": self.encdec_attention,
            "encdec_attention_norm": self.encdec_attention_norm,
            "ffn": self.ffn, "ffn_norm": self.ffn_norm}

  def _rest(self, x, encdec_k, encdec_v, encoder_bias, training, real=None):
    drop = lambda y: self.residual_dropout(y, training=training)
    x = x + drop(self.encdec_attention.attend(self.encdec_attention_norm(x), encdec_k, encdec_v,
                                              encoder_bias, training))
    return x + drop(_apply_ffn(self.ffn, self.ffn_norm(x), real, training))

  def call(self, x, encoded, self_bias, encoder_bias, training=False, real=None):
    drop = lambda y: self.residual_dropout(y, training=training)
    y = self.self_attention_norm(x)
    x = x + drop(self.self_attention(y, y, self_bias, training=training))
    k, v = self.encdec_attention.keys_values(encoded)
    return self._rest(x, k, v, encoder_bias, training, real)

  def step(self, x, i, cache, encoder_bias):
    """One position (see jax_model.DecoderLayer.step)."""
    y = self.self_attention_norm(x)
    k, v = self.self_attention.keys_values(y)
    keys = ops.slice_update(cache["k"], (0, i, 0, 0), ops.cast(k, cache["k"].dtype))
    values = ops.slice_update(cache["v"], (0, i, 0, 0), ops.cast(v, cache["v"].dtype))
    acc = accumulation_dtype(self.dtype_policy)
    visible = ops.arange(ops.shape(keys)[1]) <= i
    bias = ops.cast(ops.where(visible, 0.0, formulas.ATTENTION_MASK), acc)[None, None, None, :]
    x = x + self.self_attention.attend(y, keys, values, bias)
    x = self._rest(x, cache["encdec_k"], cache["encdec_v"], encoder_bias, False)
    return x, {**cache, "k": keys, "v": values}


class Stack(tf_layers.BuiltInInitLayer):
  """num_layers encoder or decoder layers (named layer_i) and the final LayerNorm."""

  @mp.in_path
  def __init__(self, cfg, layer_class, runtime=None, stages=None, first=0, **kwargs):
    """`stages`, `first`: a pipeline's placement and the index of this stack's first layer in
    the one list of encoder then decoder layers (its weights made on their stage's device)."""
    super().__init__(**kwargs)
    self.cfg = cfg
    self.blocks = []
    for i in range(cfg.num_layers):
      with tf_pipeline.on_stage_device(stages, first + i):
        self.blocks.append(layer_class(cfg, runtime, i, name=f"layer_{i}",
                                       dtype=self.dtype_policy))
    with tf_pipeline.on_stage_device(stages, first + cfg.num_layers - 1):
      self.output_norm = LayerNorm(cfg.hidden_size, name="output_norm",
                                   dtype=self.dtype_policy)

  def sublayers(self):
    out = {f"layer_{i}": block for i, block in enumerate(self.blocks)}
    return {**out, "output_norm": self.output_norm}

  def call(self, x, bias, encoded=None, encoder_bias=None, training=False, real=None):
    """Encoder: x, its padding bias. Decoder: x, the causal bias, the encoder's outputs and
    padding bias. `real` [B, L]: the real (not padding) tokens, for expert layers."""
    for block in self.blocks:
      x = (block(x, bias, training=training, real=real) if encoded is None else
           block(x, encoded, bias, encoder_bias, training=training, real=real))
    return self.output_norm(x)


class Transformer(tf_layers.BuiltInInit, keras.Model):
  """call(inputs, targets) -> logits [B, L, V] in the accumulation dtype."""

  def __init__(self, model_cfg, dtype="float32", runtime=None, stages=None, **kwargs):
    """`stages`: a pipeline's placement [(device, (first layer, end layer))]: each layer's
    weights made on its stage's device, the shared embedding on the first stage's
    (tf_pipeline.on_stage_device)."""
    super().__init__(name="transformer", dtype=dtype, **kwargs)
    c = self.cfg = model_cfg
    self.runtime = runtime
    self.acc = accumulation_dtype(self.dtype_policy)
    with tf_pipeline.on_stage_device(stages, 0):
      self.embedding = mp.sharded_or_whole(
          self, runtime, "embedding", (c.vocab_size, c.hidden_size),
          keras.initializers.RandomNormal(stddev=c.hidden_size ** -0.5),
          path="embedding_shared/embedding")
    self.encoder = Stack(c, EncoderLayer, runtime, stages, 0, name="encoder",
                         dtype=self.dtype_policy)
    self.decoder = Stack(c, DecoderLayer, runtime, stages, c.num_layers, name="decoder",
                         dtype=self.dtype_policy)
    self.embedding_dropout = tf_layers.ExampleDropout(c.dropout, dtype=self.dtype_policy)
    self.target_embedding_dropout = tf_layers.ExampleDropout(c.dropout,
                                                             dtype=self.dtype_policy)
    dropouts = [layer for layer in self._flatten_layers()
                if isinstance(layer, tf_layers.ExampleDropout)]
    dropouts += [layer.noise for layer in self._flatten_layers()
                 if isinstance(layer, MoEFeedForward)]
    for key, layer in enumerate(dropouts):       # construction order: the same every build
      layer.key = key

  @property
  def vocab_parallel(self):
    """True when the logits are this replica's vocabulary shard [..., V / model]."""
    return mp.is_sharded(self.embedding)

  def _lookup(self, ids):
    if isinstance(self.embedding, mp.ShardedWeight):
      x = mp.vocab_parallel_lookup(self.runtime, self.embedding, ids)
    else:
      x = ops.take(self.embedding, ids, axis=0)
    mask = ops.cast(ops.not_equal(ids, PAD_ID), x.dtype)[..., None]
    return x * mask * self.cfg.hidden_size ** 0.5

  def _embed(self, ids, training, positions=None, target=False):
    table = formulas.position_encoding(ids.shape[1], self.cfg.hidden_size)
    x = self._lookup(ids)
    table = table[None] if positions is None else ops.take(table, positions, axis=0)
    x = x + ops.cast(table, x.dtype)
    dropout = self.target_embedding_dropout if target else self.embedding_dropout
    return dropout(x, training=training)

  def encode(self, inputs, training=False, packed=None):
    """-> (encoder outputs, their attention bias); `packed` as in jax_model.Transformer."""
    if packed is None:
      bias = ops.where(ops.equal(inputs, PAD_ID), formulas.ATTENTION_MASK, 0.0)
      bias = ops.cast(bias, self.acc)[:, None, None, :]
      return self.encoder(self._embed(inputs, training), bias, training=training,
                          real=ops.not_equal(inputs, PAD_ID)), bias
    segments = packed["inputs_segmentation"]
    bias = segment_bias(segments, segments, self.acc)
    x = self._embed(inputs, training, packed["inputs_position"])
    return self.encoder(x, bias, training=training, real=ops.not_equal(inputs, PAD_ID)), bias

  def logits(self, x):
    """[B, L, V], or under vocab_parallel this replica's [B, L, V / model]."""
    if not isinstance(self.embedding, mp.ShardedWeight):
      return ops.cast(ops.tensordot(x, ops.cast(self.embedding, x.dtype), [[2], [1]]), self.acc)
    if self.vocab_parallel:
      x = mp.copy_to_model(self.runtime, x)
    table = mp.read(self.embedding, x.dtype)
    return ops.cast(ops.tensordot(x, table, [[2], [1]]), self.acc)   # see contracted_dims

  def _biases(self, inputs, targets, packed):
    """(encoder self-attention bias, decoder self-attention bias, encoder-decoder bias)."""
    if packed is None:
      bias = ops.where(ops.equal(inputs, PAD_ID), formulas.ATTENTION_MASK, 0.0)
      bias = ops.cast(bias, self.acc)[:, None, None, :]
      length = targets.shape[1]
      causal = np.where(np.tril(np.ones((length, length), bool)), 0.0, formulas.ATTENTION_MASK)
      return bias, ops.cast(causal, self.acc)[None, None], bias
    inputs_segments, segments = packed["inputs_segmentation"], packed["targets_segmentation"]
    return (segment_bias(inputs_segments, inputs_segments, self.acc),
            segment_bias(segments, segments, self.acc, causal=True),
            segment_bias(segments, inputs_segments, self.acc))

  def _embed_targets(self, targets, training, packed):
    if packed is None:
      return self._embed(shift_right(targets), training, target=True)
    return self._embed(shift_right(targets, packed["targets_segmentation"]), training,
                       packed["targets_position"], target=True)

  def call(self, inputs, targets, training=False, packed=None):
    encoded, _ = self.encode(inputs, training, packed)
    _, self_bias, encoder_bias = self._biases(inputs, targets, packed)
    x = self._embed_targets(targets, training, packed)
    x = self.decoder(x, self_bias, encoded, encoder_bias, training=training,
                     real=ops.not_equal(targets, PAD_ID))
    return self.logits(x)

  def pipeline_layers(self, carry, inputs, targets, packed, start, end, training=False):
    """GPipe's view, as jax_model.Transformer.pipeline_layers: layers [start, end) of the
    encoder layers then the decoder layers on carry {'encoded', 'decoded'} (absent entries:
    not yet made) -> (carry, logits after the last layer, else None)."""
    n = self.cfg.num_layers
    encoder_bias, self_bias, encdec_bias = self._biases(inputs, targets, packed)
    encoded, decoded = carry.get("encoded"), carry.get("decoded")
    for i in range(start, end):
      if i == 0:
        x = self._embed(inputs, training,
                        None if packed is None else packed["inputs_position"])
        encoded = ops.cast(x, self.compute_dtype)
      if i < n:
        encoded = self.encoder.blocks[i](encoded, encoder_bias, training=training)
        if i == n - 1:
          encoded = self.encoder.output_norm(encoded)
        continue
      if i == n:
        decoded = ops.cast(self._embed_targets(targets, training, packed), self.compute_dtype)
      decoded = self.decoder.blocks[i - n](decoded, encoded, self_bias, encdec_bias,
                                           training=training)
    carry = {k: v for k, v in (("encoded", encoded), ("decoded", decoded)) if v is not None}
    if end < 2 * n:
      return carry, None
    return carry, self.logits(self.decoder.output_norm(decoded))

  # ------------------------------------------------------------------ decoding
  def init_cache(self, encoded, max_decode_length):
    c = self.cfg
    batch = ops.shape(encoded)[0]
    shape = (batch, max_decode_length, c.num_heads, c.hidden_size // c.num_heads)
    cache = {}
    for i, block in enumerate(self.decoder.blocks):
      k, v = block.encdec_attention.keys_values(encoded)
      cache[f"layer_{i}"] = {"k": ops.zeros(shape, k.dtype), "v": ops.zeros(shape, v.dtype),
                             "encdec_k": k, "encdec_v": v}
    return cache

  def decode_step(self, ids, i, cache, encoder_bias):
    """ids [B] (the token at position i) -> (logits [B, V], cache)."""
    x = self._lookup(ids[:, None])
    x = x + ops.cast(position_at(i, self.cfg.hidden_size), x.dtype)[None]
    # Outside call() Keras casts nothing: the lookup is float32, the layers compute (and
    # return) bfloat16 under mixed_bfloat16, and the residual sums need one dtype.
    x = ops.cast(x, self.compute_dtype)
    new = {}
    for n, block in enumerate(self.decoder.blocks):
      x, new[f"layer_{n}"] = block.step(x, i, cache[f"layer_{n}"], encoder_bias)
    return self.logits(self.decoder.output_norm(x))[:, 0], new

  def sublayers(self):
    """{flax module name: Keras layer or variable} (tf_layers.variables_by_path)."""
    return {"embedding_shared": {"embedding": self.embedding}, "encoder": self.encoder,
            "decoder": self.decoder}


def segment_bias(query_segments, key_segments, dtype, causal=False):
  """jax_model.segment_bias: [B, 1, Lq, Lk], -1e9 across examples of a packed row, on padding
  keys and (causal) on later positions."""
  allowed = ops.logical_and(
      ops.equal(query_segments[:, :, None], key_segments[:, None, :]),
      ops.not_equal(key_segments[:, None, :], 0))
  if causal:
    length = query_segments.shape[1]
    allowed = ops.logical_and(allowed, np.tril(np.ones((length, length), bool))[None])
  return ops.cast(ops.where(allowed, 0.0, formulas.ATTENTION_MASK), dtype)[:, None]


def shift_right(targets, segments=None):
  """jax_model.shift_right: start id 0 first, and at each packed example's first position."""
  shifted = ops.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  if segments is not None:
    same = ops.equal(segments, ops.pad(segments, ((0, 0), (1, 0)))[:, :-1])
    shifted = shifted * ops.cast(same, shifted.dtype)
  return shifted


def position_at(i, hidden_size):
  """formulas.position_encoding's row i for a traced position, [1, hidden_size]."""
  half = hidden_size // 2
  increment = np.log(1.0e4) / max(half - 1, 1)
  inverse = np.exp(np.arange(half, dtype=np.float64) * -increment)
  angles = ops.cast(i, "float64") * inverse
  return ops.concatenate([ops.sin(angles), ops.cos(angles)])[None]


def build(cfg, dtype="float32", runtime=None, stages=None) -> Transformer:
  """The model of the workload config `cfg` (cfg.model) with its variables: made by one call on
  a dummy batch (on a model axis every weight is made in __init__, and a call outside the
  replicas could not read the shards). `stages`: a pipeline's placement (Transformer): the
  weights made in __init__ and those made on a first call (the feed-forward's Dense layers)
  on their stage's device, the call made stage by stage there."""
  model = Transformer(cfg.model, dtype=dtype, runtime=runtime, stages=stages)
  ids = np.ones((1, 8), np.int32)         # any length: no weight depends on it
  if stages:
    carry = {}
    for _, (start, end) in stages:
      with tf_pipeline.on_stage_device(stages, start):
        carry, _ = model.pipeline_layers(carry, ids, ids, None, start, end)
  elif runtime is None or runtime.model == 1:
    model(ids, ids)
  return model
