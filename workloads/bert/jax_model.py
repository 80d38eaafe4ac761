"""BERT with masked-LM and next-sentence heads in flax (the MLPerf reference architecture:
google-research/bert modeling.py as bundled with the MLPerf reference).

Post-LayerNorm transformer encoder (LayerNorm epsilon 1e-12), exact (erf) GELU, every weight
initialised from a truncated normal with stddev 0.02 and every bias at zero. The MLM head is
dense + GELU + LayerNorm, then a projection tied to the word embedding plus an output bias;
the NSP head reads the pooler (dense + tanh on the [CLS] position). Under a model axis the
activations are laid out as Megatron's (jax_runtime.constrain): q, k, v on heads, the
feed-forward hidden on mlp, MLM logits on vocab, the layer outputs whole. Module names follow the
reference checkpoint's variable names (see checkpoint.py), so loading is a table lookup.
At the reference size the model has 336,226,108 parameters (formula in
tests/test_bert_parity.py).
"""
import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from workloads.bert import spec
from workloads.parallel import jax_attention
from workloads.parallel.jax_layers import ExampleDropout, FlatDense, remat_block
from workloads.parallel.jax_runtime import constrain

LAYER_NORM_EPSILON = 1e-12
MASK_ADDER = -10000.0          # the reference adds (1 - mask) * -10000 to attention scores


def weight_init(stddev):
  return nn.initializers.truncated_normal(stddev=stddev)


def gelu(x):
  return jax.nn.gelu(x, approximate=False)


def accumulation_dtype(dtype):
  """Softmax, mask adder and logits: float32 under bf16 or float32 compute, float64 under
  float64 (the parity tests)."""
  return jnp.promote_types(dtype, jnp.float32)


class TransformerLayer(nn.Module):
  hidden_size: int
  num_heads: int
  intermediate_size: int
  dropout: float
  init_std: float
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, attention_mask, deterministic):
    dense = functools.partial(FlatDense, dtype=self.dtype, kernel_init=weight_init(self.init_std))
    norm = functools.partial(nn.LayerNorm, epsilon=LAYER_NORM_EPSILON, dtype=self.dtype)
    # keyed by example (jax_layers.ExampleDropout): the same masks with or without a pipeline
    drop = lambda: functools.partial(ExampleDropout(self.dropout), deterministic=deterministic)
    batch, seq, _ = x.shape
    head_dim = self.hidden_size // self.num_heads
    split = lambda t: constrain(t.reshape(batch, seq, self.num_heads, head_dim),
                                ("batch", "length", "heads", "kv"))
    q = split(dense(self.hidden_size, name="query")(x))
    k = split(dense(self.hidden_size, name="key")(x))
    v = split(dense(self.hidden_size, name="value")(x))

    def portable(q, k, v, mask):     # the reference's order: scale the scores, add the adder
      scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(head_dim).astype(self.dtype)
      acc = accumulation_dtype(self.dtype)
      scores = scores.astype(acc) + jax_attention.mask_adder(mask, MASK_ADDER, acc)
      probs = drop()(jax.nn.softmax(scores, axis=-1)).astype(self.dtype)
      return jnp.einsum("bhqk,bkhd->bqhd", probs, v)

    context = jax_attention.attend(q, k, v, attention_mask, portable, scale=head_dim ** -0.5,
                                   dropout_active=not deterministic and self.dropout > 0)
    context = context.reshape(batch, seq, self.hidden_size)
    embed = ("batch", "length", "embed")
    attended = drop()(constrain(dense(self.hidden_size, name="attention_output")(context), embed))
    x = norm(name="attention_LayerNorm")(attended + x)
    hidden = constrain(gelu(dense(self.intermediate_size, name="intermediate")(x)),
                       ("batch", "length", "mlp"))
    out = drop()(constrain(dense(self.hidden_size, name="output")(hidden), embed))
    return norm(name="output_LayerNorm")(out + x)


class BertPretraining(nn.Module):
  """(mlm_logits [B, P, V] at masked_lm_positions, nsp_logits [B, 2]), both float32. Its
  sizes are the config's (spec.ModelConfig, bert_config.json's fields), as the Keras model's.
  GPipe's view of it (spec.pipeline_layers) is the encoder layers, the embeddings riding with
  the first and the heads with the last (`pipeline_layers`)."""
  config: spec.ModelConfig = dataclasses.field(default_factory=spec.ModelConfig)
  dtype: Any = jnp.float32          # compute dtype; parameters stay float32
  remat_policy: str = ""            # parallel.remat_policy, per encoder layer (jax_layers)

  def setup(self):
    c = self.config
    init = weight_init(c.initializer_range)
    embed = functools.partial(nn.Embed, features=c.hidden_size, embedding_init=init)
    norm = functools.partial(nn.LayerNorm, epsilon=LAYER_NORM_EPSILON, dtype=self.dtype)
    dense = functools.partial(FlatDense, dtype=self.dtype, kernel_init=init)
    self.word_embeddings = embed(c.vocab_size)
    self.position_embeddings = embed(c.max_position_embeddings)
    self.token_type_embeddings = embed(c.type_vocab_size)
    self.embeddings_LayerNorm = norm()
    self.embeddings_dropout = ExampleDropout(c.dropout)
    layer = remat_block(TransformerLayer, self.remat_policy, (3,))
    for i in range(c.num_layers):
      setattr(self, f"layer_{i}", layer(c.hidden_size, c.num_heads, c.intermediate_size,
                                        c.dropout, c.initializer_range, self.dtype))
    self.pooler, self.nsp = dense(c.hidden_size), dense(2)
    self.mlm_transform, self.mlm_LayerNorm = dense(c.hidden_size), norm()

  def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions, train=False,
               positions=None, cls_positions=None):
    """Packed rows (packing.py) pass `positions` (each token's in its own sample) and
    `cls_positions` [B, S] (each sample's first token): attention stays within a sample
    (input_mask holds the sample of each token) and nsp_logits are [B, S, 2]."""
    x = self.embed(input_ids, segment_ids, positions, train)
    x = self.encode(x, attention_mask(input_mask, positions), 0, self.config.num_layers, train)
    return self.heads(x, masked_lm_positions, cls_positions)

  def embed(self, input_ids, segment_ids, positions, train):
    seq = input_ids.shape[1]
    table = self.position_embeddings.embedding
    x = (self.word_embeddings(input_ids)
         + (table[:seq] if positions is None else jnp.take(table, positions, axis=0))
         + self.token_type_embeddings(segment_ids))
    x = self.embeddings_LayerNorm(x)
    return self.embeddings_dropout(x, deterministic=not train).astype(self.dtype)

  def encode(self, x, mask, start, end, train):
    """Encoder layers [start, end) on x [B, L, H]."""
    for i in range(start, end):
      x = getattr(self, f"layer_{i}")(x, mask, not train)
    return x

  @nn.compact            # its bias made here, not in setup: a pipeline's first stage has none
  def heads(self, x, masked_lm_positions, cls_positions):
    first = (x[:, 0] if cls_positions is None
             else jnp.take_along_axis(x, cls_positions[..., None], axis=1))    # [B, S, H]
    nsp_logits = self.nsp(jnp.tanh(self.pooler(first)))
    # Masked LM: only the masked positions go through the head (as the reference gathers).
    picked = jnp.take_along_axis(x, masked_lm_positions[..., None], axis=1)
    picked = self.mlm_LayerNorm(gelu(self.mlm_transform(picked)))
    output_bias = self.param("mlm_output_bias", nn.initializers.zeros,
                             (self.config.vocab_size,))
    mlm_logits = constrain(self.word_embeddings.attend(picked.astype(self.dtype)) + output_bias,
                           ("batch", None, "vocab"))
    acc = accumulation_dtype(self.dtype)
    return mlm_logits.astype(acc), nsp_logits.astype(acc)

  def pipeline_layers(self, x, batch, start, end, train):
    """GPipe's view: encoder layers [start, end) on x [b, L, H] (what the stage before sent),
    the first embedding `batch`'s tokens, the last applying the heads: -> (x, (mlm_logits,
    nsp_logits) or None)."""
    positions = batch.get("positions")
    if start == 0:
      x = self.embed(batch["input_ids"], batch["segment_ids"], positions, train)
    x = self.encode(x, attention_mask(batch["input_mask"], positions), start, end, train)
    if end < self.config.num_layers:
      return x, None
    return x, self.heads(x, batch["masked_lm_positions"], batch.get("cls_positions"))


def attention_mask(input_mask, positions=None):
  """Real keys [B, 1, 1, L], or for packed rows (`positions` given) packed_attention_mask."""
  if positions is None:
    return (input_mask != 0)[:, None, None, :]
  return packed_attention_mask(input_mask)


def packed_attention_mask(sample_ids):
  """[B, 1, L, L]: a query attends the keys of its own sample (sample_ids 1..S; 0 padding)."""
  same = sample_ids[:, None, :, None] == sample_ids[:, None, None, :]
  return same & (sample_ids != 0)[:, None, None, :]


def build(cfg, dtype=jnp.float32) -> BertPretraining:
  """The model of the workload config `cfg` (cfg.model), computing in `dtype`."""
  return BertPretraining(config=cfg.model, dtype=dtype, remat_policy=cfg.parallel.remat_policy)


def pretraining_loss(mlm_logits, nsp_logits, batch):
  """The reference's loss: weighted mean of masked-LM cross entropy over the masked positions
  (denominator sum(weights) + 1e-5) plus mean next-sentence cross entropy (over the real
  samples of packed rows)."""
  mlm, nsp = loss_sums(mlm_logits, nsp_logits, batch)
  weights, samples = loss_denominators(batch, mlm.dtype)
  return mlm / (weights + 1e-5) + nsp / samples


def loss_sums(mlm_logits, nsp_logits, batch):
  """(weighted masked-LM negative log-likelihood summed over the masked positions, next-sentence
  negative log-likelihood summed over the (real) samples): the loss's numerators, which a
  pipeline sums over its micro-batches."""
  log_probs = jax.nn.log_softmax(mlm_logits, axis=-1)
  token_nll = -jnp.take_along_axis(log_probs, batch["masked_lm_ids"][..., None], axis=-1)[..., 0]
  mlm = jnp.sum(batch["masked_lm_weights"].astype(token_nll.dtype) * token_nll)
  nsp_log_probs = jax.nn.log_softmax(nsp_logits, axis=-1)
  labels = batch["next_sentence_labels"]
  nsp_nll = -jnp.take_along_axis(nsp_log_probs, labels[..., None], axis=-1)[..., 0]
  if "next_sentence_weights" in batch:      # packed rows: the real samples only
    nsp_nll = batch["next_sentence_weights"].astype(nsp_nll.dtype) * nsp_nll
  return mlm, jnp.sum(nsp_nll)


def loss_denominators(batch, dtype):
  """(sum of the masked-LM weights, number of (real) next-sentence samples) of `batch`."""
  weights = jnp.sum(batch["masked_lm_weights"].astype(dtype))
  if "next_sentence_weights" in batch:
    return weights, jnp.sum(batch["next_sentence_weights"].astype(dtype))
  return weights, jnp.asarray(batch["next_sentence_labels"].size, dtype)


def masked_lm_correct(mlm_logits, batch, example_mask):
  """(correct predictions, counted predictions) over masked positions; weights respected and
  padding examples (example_mask 0) left out."""
  weights = batch["masked_lm_weights"] * example_mask[:, None]
  correct = (jnp.argmax(mlm_logits, -1) == batch["masked_lm_ids"]) * weights
  return jnp.sum(correct), jnp.sum(weights)


def load_tf1_checkpoint(params, path, num_layers):
  """Params with every model variable replaced by the reference TF1 checkpoint's (e.g.
  model.ckpt-28252), through checkpoint.py's name table; shapes must match the config."""
  import numpy as np
  from workloads.bert import checkpoint
  params = jax.tree.map(lambda x: x, params)          # a fresh nested dict to fill in
  for path, value in checkpoint.read_tf1_checkpoint(path, num_layers):
    node = params
    for key in path[:-1]:
      node = node[key]
    if tuple(node[path[-1]].shape) != value.shape:
      raise ValueError(f"checkpoint {path}: {path} has shape {value.shape}, the model "
                       f"{tuple(node[path[-1]].shape)}: the model config differs")
    node[path[-1]] = jnp.asarray(value, np.float32)
  return params
