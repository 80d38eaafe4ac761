"""Llama 3.1 8B in Keras 3: the same architecture, initialisation and parameter names as
jax_model.py (see its docstring for the reference's choices), so parameters convert one to one
by flax path (tf_layers.load_flax_variables). At the reference size: 8,030,261,248 parameters.

Every weight is made in __init__ (tf_layers.BuiltInInit): the model needs no call to exist,
and `count_parameters` builds it in a Keras StatelessScope, where variables keep their shapes
and are never initialised, so the reference size is counted without 32 GB of weights.

With a runtime whose mesh has a model axis the layers are Megatron's (tf_model_parallel.py),
as the workload's PARAM_AXES lays them out: q/k/v and gate/up column-parallel (heads, mlp; the
normalised input copied to the model peers once for each group), o_proj and down_proj
row-parallel (their partial outputs summed over the peers), the embedding vocabulary-parallel
(lookup) and lm_head column-parallel over the vocabulary: the logits are then this replica's
vocabulary shard (`vocab_parallel`) and the loss is reduced over the peers without gathering
them (`loss_sums`). A dimension the axis does not divide stays whole; the attention's split
needs the axis to divide num_kv_heads (Megatron's rule too: every query head's key/value head
on its shard).
"""
import math

import keras
import numpy as np
import tensorflow as tf
from keras import layers, ops

from workloads.llama31_8b.rope import inverse_frequencies
from workloads.parallel import tf_layers
from workloads.parallel import tf_model_parallel as mp

MASK_ADDER = -1e9


def accumulation_dtype(policy):
  """RMSNorm statistics, RoPE tables, softmax, logits and the loss: float32 under
  mixed_bfloat16 or float32, float64 under float64 (the parity tests)."""
  return "float64" if policy.compute_dtype == "float64" else "float32"


def rope_tables(c, length, dtype):
  """(cos, sin) [L, head_dim / 2] of positions 0..L-1 computed in `dtype`."""
  angles = (ops.cast(ops.arange(length), dtype)[:, None]
            * ops.cast(inverse_frequencies(c), dtype)[None])
  return ops.cos(angles), ops.sin(angles)


def apply_rope(x, cos, sin):
  """x [B, L, heads, d] rotated in HF's rotate-half pairing, in cos's dtype, returned in x's."""
  half = x.shape[-1] // 2
  y = ops.cast(x, cos.dtype)
  x1, x2 = y[..., :half], y[..., half:]
  cos, sin = cos[None, :, None, :], sin[None, :, None, :]
  return ops.cast(ops.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1), x.dtype)


class Projection(layers.Layer):
  """A bias-free dense layer, kernel [in, out] (flax nn.Dense's), split over the model axis as
  PARAM_AXES says: on its output units Megatron's column layer, on its input units the row
  layer (partial outputs summed over the peers). `matmul` skips the column layer's input copy
  (DecoderLayer copies once for q/k/v and once for gate/up)."""

  @mp.in_path
  def __init__(self, in_units, units, initializer, runtime=None, **kwargs):
    super().__init__(**kwargs)
    self.runtime = runtime
    self.kernel = mp.sharded_or_whole(self, runtime, "kernel", (in_units, units), initializer)
    self.parallel = (None if not isinstance(self.kernel, mp.ShardedWeight) else
                     "column" if self.kernel.dim == 1 else "row")
    self.built = True

  @property
  def column_sharded(self):
    return self.parallel == "column" and mp.is_sharded(self.kernel)

  def matmul(self, x):
    # on the rows folded into one dimension: XLA:CPU's dot of a 3-D activation (and its
    # kernel gradient, contracting batch and length) is several times slower than the same
    # product on the rows (jax_layers.FlatDense's note)
    kernel = mp.read(self.kernel, x.dtype)
    y = tf.reshape(tf.matmul(tf.reshape(x, (-1, x.shape[-1])), kernel),
                   tf.concat([tf.shape(x)[:-1], tf.shape(kernel)[-1:]], 0))
    if self.parallel == "row" and mp.is_sharded(self.kernel):
      y = mp.reduce_from_model(self.runtime, y)
    return y

  def call(self, x):
    if self.column_sharded:
      x = mp.copy_to_model(self.runtime, x)
    return self.matmul(x)


class RMSNorm(layers.Layer):
  """x * rsqrt(mean(x^2) + eps) * scale in the accumulation dtype, returned in x's dtype. The
  scale is read as stored (autocast off): under mixed_bfloat16 Keras would otherwise hand the
  call a bfloat16-rounded scale, where the flax model multiplies by the float32 one."""

  def __init__(self, hidden_size, epsilon, **kwargs):
    super().__init__(**kwargs)
    self.epsilon = epsilon
    self.scale = self.add_weight(shape=(hidden_size,), initializer="ones", name="scale",
                                 autocast=False)
    self.built = True

  def call(self, x):
    acc = accumulation_dtype(self.dtype_policy)
    y = ops.cast(x, acc)
    y = y * ops.rsqrt(ops.mean(y * y, axis=-1, keepdims=True) + self.epsilon)
    return ops.cast(y * ops.cast(self.scale, acc), x.dtype)


def _project_together(runtime, projections, x):
  """[p(x) for p in projections], the input copied to the model peers once when they are all
  column-parallel (Megatron's one f per layer group), else each as it is."""
  if all(p.column_sharded for p in projections):
    x = mp.copy_to_model(runtime, x)
    return [p.matmul(x) for p in projections]
  return [p(x) for p in projections]


class DecoderLayer(tf_layers.BuiltInInitLayer):
  @mp.in_path
  def __init__(self, c, runtime=None, **kwargs):
    super().__init__(**kwargs)
    self.cfg, self.runtime = c, runtime
    init = keras.initializers.RandomNormal(stddev=c.initializer_range)
    scaled = keras.initializers.RandomNormal(
        stddev=c.initializer_range / math.sqrt(2 * c.num_layers))
    d = c.head_dim
    project = lambda n_in, n_out, initializer, name: Projection(
        n_in, n_out, initializer, runtime, name=name, dtype=self.dtype_policy)
    norm = lambda name: RMSNorm(c.hidden_size, c.rms_norm_epsilon, name=name,
                                dtype=self.dtype_policy)
    self.input_norm = norm("input_norm")
    self.q_proj = project(c.hidden_size, c.num_heads * d, init, "q_proj")
    self.k_proj = project(c.hidden_size, c.num_kv_heads * d, init, "k_proj")
    self.v_proj = project(c.hidden_size, c.num_kv_heads * d, init, "v_proj")
    self.o_proj = project(c.num_heads * d, c.hidden_size, scaled, "o_proj")
    self.post_attention_norm = norm("post_attention_norm")
    self.gate_proj = project(c.hidden_size, c.intermediate_size, init, "gate_proj")
    self.up_proj = project(c.hidden_size, c.intermediate_size, init, "up_proj")
    self.down_proj = project(c.intermediate_size, c.hidden_size, scaled, "down_proj")
    split = [p.kernel.dim if isinstance(p.kernel, mp.ShardedWeight) else None
             for p in (self.q_proj, self.k_proj, self.v_proj, self.o_proj)]
    if any(s is not None for s in split) and (
        split != [1, 1, 1, 0] or c.num_kv_heads % runtime.model):
      raise ValueError(f"--mesh model={runtime.model}: TF's Megatron attention splits whole "
                       f"key/value heads; model must divide num_kv_heads={c.num_kv_heads} "
                       f"(and num_heads={c.num_heads})")
    self.built = True

  def sublayers(self):
    """{flax module name: Keras layer}."""
    return {name: getattr(self, name) for name in (
        "input_norm", "q_proj", "k_proj", "v_proj", "o_proj", "post_attention_norm",
        "gate_proj", "up_proj", "down_proj")}

  def call(self, x):
    c = self.cfg
    batch, length = ops.shape(x)[0], x.shape[1]
    d = c.head_dim
    acc = accumulation_dtype(self.dtype_policy)
    q, k, v = _project_together(self.runtime, (self.q_proj, self.k_proj, self.v_proj),
                                self.input_norm(x))
    q = ops.reshape(q, (batch, length, -1, d))          # this replica's heads
    k = ops.reshape(k, (batch, length, -1, d))
    v = ops.reshape(v, (batch, length, -1, d))
    cos, sin = rope_tables(c, length, acc)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    kv_heads = k.shape[2]
    group = c.num_heads // c.num_kv_heads
    q = ops.reshape(q, (batch, length, kv_heads, group, d))       # head h = kv * group + g
    scores = ops.cast(ops.einsum("bqkgd,bskd->bkgqs", q, k) * d ** -0.5, acc)
    causal = np.where(np.tril(np.ones((length, length), bool)), 0.0, MASK_ADDER)
    scores = scores + ops.cast(causal, acc)[None, None, None]
    probs = ops.cast(ops.softmax(scores, axis=-1), v.dtype)
    context = ops.reshape(ops.einsum("bkgqs,bskd->bqkgd", probs, v),
                          (batch, length, kv_heads * group * d))
    x = x + self.o_proj(context)
    gate, up = _project_together(self.runtime, (self.gate_proj, self.up_proj),
                                 self.post_attention_norm(x))
    return x + self.down_proj(ops.silu(gate) * up)


class LlamaLM(tf_layers.BuiltInInit, keras.Model):
  """call(batch) -> logits [B, L, vocab] of batch['tokens'] in the accumulation dtype, or under
  `vocab_parallel` this replica's [B, L, vocab / model]."""

  def __init__(self, model_cfg, dtype="float32", runtime=None, **kwargs):
    super().__init__(name="llama", dtype=dtype, **kwargs)
    c = self.cfg = model_cfg
    self.runtime = runtime
    self.acc = accumulation_dtype(self.dtype_policy)
    init = keras.initializers.RandomNormal(stddev=c.initializer_range)
    self.embed_tokens = mp.sharded_or_whole(self, runtime, "embedding",
                                            (c.vocab_size, c.hidden_size), init,
                                            path="embed_tokens/embedding")
    self.decoder = [DecoderLayer(c, runtime, name=f"layer_{i}", dtype=self.dtype_policy)
                    for i in range(c.num_layers)]
    self.final_norm = RMSNorm(c.hidden_size, c.rms_norm_epsilon, name="final_norm",
                              dtype=self.dtype_policy)
    self.lm_head = Projection(c.hidden_size, c.vocab_size, init, runtime, name="lm_head",
                              dtype=self.dtype_policy)
    self.built = True                # every weight made: count_params needs no call

  @property
  def vocab_parallel(self):
    """True when the logits are this replica's vocabulary shard [..., V / model]."""
    return self.lm_head.column_sharded

  def embed(self, tokens):
    if isinstance(self.embed_tokens, mp.ShardedWeight):
      x = mp.vocab_parallel_lookup(self.runtime, self.embed_tokens, tokens)
    else:
      x = ops.take(self.embed_tokens, tokens, axis=0)
    return ops.cast(x, self.compute_dtype)

  def head(self, x):
    return ops.cast(self.lm_head(self.final_norm(x)), self.acc)

  def call(self, batch, training=False):
    del training                     # no dropout
    x = self.embed(batch["tokens"])
    for layer in self.decoder:
      x = layer(x)
    return self.head(x)

  def pipeline_layers(self, x, batch, start, end, training=False):
    """GPipe's view, as jax_model.LlamaLM.pipeline_layers: -> (x, logits or None)."""
    del training
    if start == 0:
      x = self.embed(batch["tokens"])
    for layer in self.decoder[start:end]:
      x = layer(x)
    return x, (self.head(x) if end == self.cfg.num_layers else None)

  def sublayers(self):
    """{flax module name: Keras layer or variable} (tf_layers.variables_by_path)."""
    out = {"embed_tokens": {"embedding": self.embed_tokens}}
    out.update({f"layer_{i}": layer for i, layer in enumerate(self.decoder)})
    out.update({"final_norm": self.final_norm, "lm_head": self.lm_head})
    return out


def build(cfg, dtype="float32", runtime=None) -> LlamaLM:
  """The model of the workload config `cfg` (cfg.model) with its variables (all made in
  __init__: no call is needed, on a model axis none could be made outside the replicas)."""
  return LlamaLM(cfg.model, dtype=dtype, runtime=runtime)


def count_parameters(model_cfg) -> int:
  """Parameters of the Keras model of `model_cfg`, built in a StatelessScope: the variables
  have their shapes and are never initialised (nothing allocated, any size; on the
  default runtime only: a ShardedWeight is made whole)."""
  # Keras registers a variable made in the scope for initialisation on leaving it (and by a
  # later scope that initialises): the scope is told not to, and the registry is put back.
  from keras.src.backend.common import global_state  # pylint: disable=import-outside-toplevel
  pending = list(global_state.get_global_attribute("uninitialized_variables") or [])
  try:
    with keras.StatelessScope(initialize_variables=False):
      model = LlamaLM(model_cfg)
      return sum(int(np.prod(v.shape)) for v in model.weights)
  finally:
    global_state.set_global_attribute("uninitialized_variables", pending)


# ----------------------------------------------------------------------------------- loss

def token_nll(model, logits, labels):
  """Per-token NLL [B, L] of `labels`; from the vocabulary shard of the logits when the model
  is vocab_parallel (tf_model_parallel's reduction over the peers: never gathered)."""
  if getattr(model, "vocab_parallel", False):
    return mp.vocab_parallel_smoothed_cross_entropy(model.runtime, logits, labels, 1.0, 0.0,
                                                    0.0)
  return tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)


def _token_weights(batch, dtype):
  mask = batch.get("loss_mask")
  if mask is None:
    return tf.ones(tf.shape(batch["labels"]), dtype)
  return tf.cast(mask, dtype)


def loss_sums(model, logits, batch):
  """(NLL summed over the tokens of batch['labels'], weighted by batch['loss_mask'] where
  present; the tokens counted): jax_model.loss_sums and loss_denominators of this replica's
  batch."""
  nll = token_nll(model, logits, batch["labels"])
  weights = _token_weights(batch, nll.dtype)
  return tf.reduce_sum(weights * nll), tf.reduce_sum(weights)


def lm_loss(model, logits, batch):
  """Mean token NLL of one batch (jax_model.lm_loss), outside a replica's share."""
  total, count = loss_sums(model, logits, batch)
  return total / count


def replica_loss(model, batch, training=True):
  """This replica's share of the global mean token NLL (summed over replicas == the global
  loss; on a model axis, the sum over each replica's data peers: the counted tokens are summed
  over every replica and divided by the model peers that counted the same ones)."""
  logits = model(batch, training=training)
  total, count = loss_sums(model, logits, batch)
  replica = tf.distribute.get_replica_context()
  if replica is not None and replica.num_replicas_in_sync > 1:
    count = replica.all_reduce(tf.distribute.ReduceOp.SUM, count)
    runtime = getattr(model, "runtime", None)
    if runtime is not None:
      count /= runtime.copies
  return total / count


def eval_sums(model, logits, batch, example_mask):
  """(NLL summed over the real examples' tokens, tokens counted): jax_model.eval_sums."""
  nll = token_nll(model, logits, batch["labels"])
  weights = _token_weights(batch, nll.dtype) * tf.cast(example_mask, nll.dtype)[:, None]
  return tf.reduce_sum(weights * nll), tf.reduce_sum(weights)
