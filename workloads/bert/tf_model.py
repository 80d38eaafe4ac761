"""BERT with masked-LM and next-sentence heads in Keras 3 (plain keras layers): the same
architecture, layer names and initialisation as jax_model.py, so parameters convert one to one
(tf_layers.load_flax_variables, by the flax paths of `sublayers()`) and the reference checkpoint
loads through the same paths (checkpoint.py). At the reference size: 336,226,108 parameters.

With a runtime whose mesh has a model axis the layers are Megatron's (tf_model_parallel.py),
as jax_model.py's layout: q/k/v and the intermediate dense column-parallel (heads, d_ff), the
attention output and the output dense row-parallel, the word embedding and the MLM output bias
vocabulary-parallel (the MLM logits are this replica's vocabulary shard); a dimension the axis
does not divide stays whole. Without one, the layers are plain Keras layers.
"""
import math

import numpy as np

import keras
from keras import layers, ops

from workloads.bert import checkpoint
from workloads.parallel import tf_layers
from workloads.parallel import tf_model_parallel as mp

LAYER_NORM_EPSILON = 1e-12
MASK_ADDER = -10000.0


def accumulation_dtype(policy):
  """Embedding sums, softmax, mask adder and logits: float32 under mixed_bfloat16 or float32,
  float64 under float64 (the parity tests)."""
  return "float64" if policy.compute_dtype == "float64" else "float32"


def gelu(x):
  """The reference's exact GELU, x * 0.5 * (1 + erf(x / sqrt(2))) (modeling.py). Python
  scalars, not ops.cast(scalar): that goes through a float32 tensor, and float32's sqrt(2)
  (as inside tf.nn.gelu) is off by 3e-8, which showed as 5e-9 in float64 parity."""
  return x * 0.5 * (1.0 + ops.erf(x / math.sqrt(2.0)))


class TransformerLayer(layers.Layer):
  @mp.in_path
  def __init__(self, hidden_size, num_heads, intermediate_size, dropout, init, runtime=None,
               **kwargs):
    super().__init__(**kwargs)
    if runtime is not None and runtime.model > 1:   # split as PARAM_AXES says (Megatron's)
      dense = lambda units, name: mp.ParallelDense(
          intermediate_size if name == "output" else hidden_size, units, runtime,
          kernel_initializer=init, name=name, dtype=self.dtype_policy)
    else:
      dense = lambda units, name: layers.Dense(units, kernel_initializer=init, name=name,
                                               dtype=self.dtype_policy)
    norm = lambda name: layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name=name,
                                                  dtype=self.dtype_policy)
    self.num_heads, self.hidden_size = num_heads, hidden_size
    self.query, self.key, self.value = dense(hidden_size, "query"), dense(hidden_size, "key"), \
        dense(hidden_size, "value")
    self.attention_output = dense(hidden_size, "attention_output")
    self.attention_LayerNorm = norm("attention_LayerNorm")
    self.intermediate = dense(intermediate_size, "intermediate")
    self.output_dense = dense(hidden_size, "output")
    self.output_LayerNorm = norm("output_LayerNorm")
    self.dropout = layers.Dropout(dropout, dtype=self.dtype_policy)

  def sublayers(self):
    """{flax module name: keras layer}."""
    return {"query": self.query, "key": self.key, "value": self.value,
            "attention_output": self.attention_output,
            "attention_LayerNorm": self.attention_LayerNorm, "intermediate": self.intermediate,
            "output": self.output_dense, "output_LayerNorm": self.output_LayerNorm}

  def call(self, x, attention_adder, training=False):
    batch, seq = ops.shape(x)[0], ops.shape(x)[1]
    head_dim = self.hidden_size // self.num_heads
    split = lambda t: ops.reshape(t, (batch, seq, -1, head_dim))    # this replica's heads
    q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
    scores = ops.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)   # in q's dtype
    # Keras casts float call arguments to the compute dtype (bf16 under mixed precision); the
    # adder is 0 or -10000, for which bf16 is exact enough (exp underflows to 0 either way)
    acc = accumulation_dtype(self.dtype_policy)
    scores = ops.cast(scores, acc) + ops.cast(attention_adder, acc)[:, None, None, :]
    probs = ops.cast(self.dropout(ops.softmax(scores, axis=-1), training=training), v.dtype)
    context = ops.reshape(ops.einsum("bhqk,bkhd->bqhd", probs, v), (batch, seq, -1))
    attended = self.dropout(self.attention_output(context), training=training)
    x = self.attention_LayerNorm(attended + x)
    out = self.dropout(self.output_dense(gelu(self.intermediate(x))), training=training)
    return self.output_LayerNorm(out + x)


class BertPretraining(tf_layers.BuiltInInit, keras.Model):
  """call(batch) -> (mlm_logits [B, P, V], nsp_logits [B, 2]), float32; `batch` holds
  input_ids, input_mask, segment_ids and masked_lm_positions."""

  def __init__(self, model_cfg, dtype="float32", runtime=None, **kwargs):
    super().__init__(name="bert", dtype=dtype, **kwargs)
    c = self.cfg = model_cfg
    self.runtime = runtime
    init = keras.initializers.TruncatedNormal(stddev=c.initializer_range)
    acc = self.acc = accumulation_dtype(self.dtype_policy)
    embed = lambda count, name: layers.Embedding(count, c.hidden_size, embeddings_initializer=init,
                                                 name=name, dtype=acc)
    dense = lambda units, name, activation=None: layers.Dense(
        units, activation=activation, kernel_initializer=init, name=name, dtype=self.dtype_policy)
    norm = lambda name: layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name=name,
                                                  dtype=self.dtype_policy)
    # on a model axis: the word embedding and the MLM output bias split on the vocabulary
    # (PARAM_AXES' 'vocab'), both or neither (the tied projection adds the bias to its shard)
    table_shape = (c.vocab_size, c.hidden_size)
    dim = mp.split_dim(runtime, "word_embeddings/embedding", table_shape)
    split = dim is not None
    assert mp.split_dim(runtime, "mlm_output_bias", (c.vocab_size,)) == dim
    self.word_embeddings = (mp.ShardedWeight(runtime, "word_embeddings", table_shape, dim,
                                             init(table_shape, dtype=acc), acc)
                            if split else embed(c.vocab_size, "word_embeddings"))
    self.position_embeddings = embed(c.max_position_embeddings, "position_embeddings")
    self.token_type_embeddings = embed(c.type_vocab_size, "token_type_embeddings")
    for table in (self.word_embeddings, self.position_embeddings, self.token_type_embeddings):
      if not split or table is not self.word_embeddings:
        table.build((None,))            # the tables are read directly below (tied, sliced)
    self.embeddings_LayerNorm = norm("embeddings_LayerNorm")
    self.dropout = layers.Dropout(c.dropout, dtype=self.dtype_policy)
    self.encoder = [TransformerLayer(c.hidden_size, c.num_heads, c.intermediate_size, c.dropout,
                                     init, runtime, name=f"layer_{i}", dtype=self.dtype_policy)
                    for i in range(c.num_layers)]
    self.pooler = dense(c.hidden_size, "pooler", "tanh")
    self.nsp = dense(2, "nsp")
    self.mlm_transform = dense(c.hidden_size, "mlm_transform")
    self.mlm_LayerNorm = norm("mlm_LayerNorm")
    self.mlm_output_bias = (
        mp.ShardedWeight(runtime, "mlm_output_bias", (c.vocab_size,), dim,
                         np.zeros((c.vocab_size,)), acc) if split else
        self.add_weight(shape=(c.vocab_size,), initializer="zeros", name="mlm_output_bias",
                        dtype=acc))

  @property
  def vocab_parallel(self):
    """True when the MLM logits are this replica's vocabulary shard [..., V / model]."""
    return mp.is_sharded(self.word_embeddings)

  def _word_embeddings(self, ids):
    if isinstance(self.word_embeddings, mp.ShardedWeight):
      return mp.vocab_parallel_lookup(self.runtime, self.word_embeddings, ids)
    return self.word_embeddings(ids)

  def _word_table(self):
    if isinstance(self.word_embeddings, mp.ShardedWeight):
      return mp.read(self.word_embeddings, self.acc)
    return self.word_embeddings.embeddings

  def call(self, batch, training=False):
    input_ids, segment_ids = batch["input_ids"], batch["segment_ids"]
    seq = ops.shape(input_ids)[1]
    # Reading a float32 variable inside a mixed_bfloat16 call autocasts it to bfloat16: sum
    # the embeddings in float32 (as the flax model does) by casting explicitly.
    x = (self._word_embeddings(input_ids)
         + ops.cast(self.position_embeddings.embeddings, self.acc)[None, :seq]
         + self.token_type_embeddings(segment_ids))
    x = self.dropout(self.embeddings_LayerNorm(x), training=training)
    adder = (1.0 - ops.cast(batch["input_mask"], self.acc)) * MASK_ADDER
    for layer in self.encoder:
      x = layer(x, adder, training=training)
    nsp_logits = self.nsp(self.pooler(x[:, 0]))
    picked = ops.take_along_axis(x, ops.expand_dims(batch["masked_lm_positions"], -1), axis=1)
    picked = self.mlm_LayerNorm(gelu(self.mlm_transform(picked)))
    if self.vocab_parallel:
      picked = mp.copy_to_model(self.runtime, picked)
    table = ops.cast(self._word_table(), picked.dtype)
    mlm_logits = ops.matmul(picked, ops.transpose(table))
    bias = (mp.read(self.mlm_output_bias, self.acc)
            if isinstance(self.mlm_output_bias, mp.ShardedWeight) else self.mlm_output_bias)
    mlm_logits = ops.cast(mlm_logits, self.acc) + ops.cast(bias, self.acc)
    return mlm_logits, ops.cast(nsp_logits, self.acc)

  def sublayers(self):
    """{flax module name: Keras layer or variable} (tf_layers.variables_by_path)."""
    table = self.word_embeddings
    out = {"word_embeddings": ({"embedding": table} if isinstance(table, mp.ShardedWeight)
                               else table),
           "position_embeddings": self.position_embeddings,
           "token_type_embeddings": self.token_type_embeddings,
           "embeddings_LayerNorm": self.embeddings_LayerNorm}
    out.update({f"layer_{i}": layer for i, layer in enumerate(self.encoder)})
    out.update({"pooler": self.pooler, "nsp": self.nsp, "mlm_transform": self.mlm_transform,
                "mlm_LayerNorm": self.mlm_LayerNorm, "mlm_output_bias": self.mlm_output_bias})
    return out


def build(cfg, dtype="float32", runtime=None) -> BertPretraining:
  """The model of the workload config `cfg` (cfg.model) with its variables: made by one call on
  a dummy batch of cfg.data's shapes (on a model axis every weight is made in __init__, and a
  call outside the replicas could not read the shards)."""
  model_cfg = cfg.model
  model = BertPretraining(model_cfg, dtype=dtype, runtime=runtime)
  if runtime is not None and runtime.model > 1:
    for layer in model._flatten_layers(include_self=False):  # pylint: disable=protected-access
      if isinstance(layer, (layers.LayerNormalization, layers.Dense)) and not layer.built:
        layer.build((None, model_cfg.hidden_size))    # every one of them reads hidden units
    return model
  seq = cfg.data.max_seq_length
  zeros = lambda *shape: np.zeros(shape, np.int32)
  model({"input_ids": zeros(1, seq), "input_mask": zeros(1, seq), "segment_ids": zeros(1, seq),
         "masked_lm_positions": zeros(1, cfg.data.max_predictions_per_seq)})
  return model


def lamb_excluded_variables(model):
  """Biases, LayerNorm gamma/beta and the MLM output bias: no weight decay and no trust ratio
  (the reference's exclusion list), chosen by layer role."""
  out = [] if isinstance(model.mlm_output_bias, mp.ShardedWeight) else [model.mlm_output_bias]
  for layer in model._flatten_layers(include_self=False):
    if isinstance(layer, layers.LayerNormalization):
      out += [layer.gamma, layer.beta]
    elif isinstance(layer, (layers.Dense, mp.ParallelDense)) and not isinstance(
        layer.bias, mp.ShardedWeight):
      out.append(layer.bias)
  return out


def load_tf1_checkpoint(model, path):
  """Loads the reference TF1 checkpoint (e.g. model.ckpt-28252) into the model."""
  by_path = tf_layers.variables_by_path(model)
  for ours, value in checkpoint.read_tf1_checkpoint(path, model.cfg.num_layers):
    var = by_path[("params",) + ours]
    shape = var.full_shape if isinstance(var, mp.ShardedWeight) else tuple(var.shape)
    if tuple(shape) != value.shape:
      raise ValueError(f"checkpoint {path}: {ours} has shape {value.shape}, the model "
                       f"{tuple(shape)}: the model config differs from bert_config.json")
    var.assign_full(value) if isinstance(var, mp.ShardedWeight) else var.assign(value)
  return model
