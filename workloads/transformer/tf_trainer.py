"""Transformer training and BLEU eval in TensorFlow (Keras 3 model, custom loop), behind the
driver's Trainer API. The loop and the distribution (tf.distribute: data parallel, weight-
update sharding) live in workloads/parallel/tf_trainer_base.py; this file says what is the
Transformer's, as jax_trainer.py does for JAX.

Each replica's loss is its share of the global loss: its tokens' smoothed cross entropy over
the target token count all-reduced across replicas, so summing replica gradients gives the
gradient of the global mean. Eval translates with tf_beam_search.py and scores on the host
(host_bleu.py), as the JAX trainer does.
"""
import tensorflow as tf

from harness.pipeline import stage_ranges
from workloads.optim import tf_optimizers
from workloads.parallel import tf_model_parallel as mp
from workloads.parallel import tf_layers, tf_moe, tf_pipeline
from workloads.parallel.tf_trainer_base import StrategyTrainer
from workloads.transformer import formulas, spec, tf_beam_search, tf_model

START_ID = 0


def smoothed_cross_entropy(logits, labels, label_smoothing):
  """(sum of per-token losses over non-padding labels, their count): formulas.smoothing.

  The cross entropy with the smoothed targets (confidence on the label, low elsewhere, summing
  to 1), -sum_v soft_v (z_v - lse), is lse - low * sum_v z_v - (confidence - low) * z_label:
  two reductions of the logits and a gather, with no [tokens, vocab] one-hot or log-softmax
  materialised (XLA:CPU does not fuse those into the reductions: 1.5% of a small
  Transformer's step)."""
  vocab = logits.shape[-1]
  confidence, low, constant = formulas.smoothing(label_smoothing, vocab)
  label_logits = tf.gather(logits, labels, axis=-1, batch_dims=len(labels.shape))
  xent = (tf.reduce_logsumexp(logits, axis=-1) - low * tf.reduce_sum(logits, axis=-1)
          - (confidence - low) * label_logits - constant)
  weights = tf.cast(tf.not_equal(labels, tf_model.PAD_ID), logits.dtype)
  return tf.reduce_sum(xent * weights), tf.reduce_sum(weights)


def vocab_parallel_smoothed_cross_entropy(runtime, logits, labels, label_smoothing, vocab):
  """smoothed_cross_entropy from this replica's vocabulary shard of the logits
  (tf_model_parallel: the logits are never gathered)."""
  confidence, low, constant = formulas.smoothing(label_smoothing, vocab)
  xent = mp.vocab_parallel_smoothed_cross_entropy(runtime, logits, labels, confidence, low,
                                                  constant)
  weights = tf.cast(tf.not_equal(labels, tf_model.PAD_ID), logits.dtype)
  return tf.reduce_sum(xent * weights), tf.reduce_sum(weights)


def replica_loss(model, batch, label_smoothing, training=True, routers=None):
  """This replica's share of the global mean loss (sum over replicas == the global loss; on a
  model axis, the sum over each replica's data peers), with the expert layers' router losses
  (their shares) when training; `routers`: a list that gets their figures."""
  with tf_moe.collect() as collected:
    logits = model(batch["inputs"], batch["targets"], training=training,
                   packed=spec.packed_features(batch))
  runtime = getattr(model, "runtime", None)
  if getattr(model, "vocab_parallel", False):
    total, count = vocab_parallel_smoothed_cross_entropy(
        runtime, logits, batch["targets"], label_smoothing, model.cfg.vocab_size)
  else:
    total, count = smoothed_cross_entropy(logits, batch["targets"], label_smoothing)
  replica = tf.distribute.get_replica_context()
  global_count = replica.all_reduce(tf.distribute.ReduceOp.SUM, count) if replica else count
  if runtime is not None:
    global_count /= runtime.copies          # every model peer counted the same tokens
  loss = total / tf.maximum(global_count, 1.0)
  if routers is not None:
    routers.extend(collected)
  return loss + tf.add_n([c["aux_loss"] for c in collected]) if collected else loss


def translate(model, inputs, model_cfg):
  """Beam search -> the best beam's tokens [B, L + extra_decode_length]."""
  encoded, encoder_bias = model.encode(inputs)
  max_decode_length = inputs.shape[1] + model_cfg.extra_decode_length
  cache = {"decoder": model.init_cache(encoded, max_decode_length), "encoder_bias": encoder_bias}

  def symbols_to_logits(ids, i, cache):
    logits, decoder = model.decode_step(ids, i, cache["decoder"], cache["encoder_bias"])
    return logits, {**cache, "decoder": decoder}

  batch = inputs.shape[0] if inputs.shape[0] is not None else tf.shape(inputs)[0]
  sequences, _ = tf_beam_search.beam_search(
      symbols_to_logits, tf.fill([batch], START_ID), cache, model_cfg.vocab_size,
      model_cfg.beam_size, model_cfg.alpha, max_decode_length, tf_model.EOS_ID)
  return sequences[:, 0, 1:]


class TransformerTrainer(StrategyTrainer):
  spec = spec.SPEC

  def __init__(self, cfg, ctx):
    super().__init__(cfg, ctx)
    self.schedule = spec.schedule_for(cfg)

  def make_model(self, runtime):
    """`runtime`: its model axis makes the layers Megatron's (tf_model_parallel)."""
    return tf_model.build(self.cfg, self.dtype, runtime, stages=self.stage_placement)

  def make_optimizer(self):
    optimizer = tf_optimizers.make_adam(self.cfg.optimizer, self.schedule)
    return optimizer, optimizer.learning_rate_schedule

  def example_ids(self, rows):
    """Global batch indices of this replica's `rows` training rows (dropout keys)."""
    rt = self.runtime
    first = rt.data_index() * rows if rt.distributed else 0
    return tf.range(tf.cast(rows, tf.int64)) + tf.cast(first, tf.int64)

  def loss_and_grads(self, batch):
    if self.stage_cut:
      return self.pipelined_loss_and_grads(batch)
    rows = tf.shape(batch["targets"])[0]
    routers = []
    with tf.GradientTape() as tape, tf_layers.examples(self.iterations, self.example_ids(rows)):
      variables = self.watch_variables(tape)
      loss = replica_loss(self.model, batch, self.cfg.optimizer.label_smoothing,
                          routers=routers)
    grads = tape.gradient(loss, variables)
    # the shared embedding's lookups give IndexedSlices: dense, to add the projection's part
    grads = [tf.convert_to_tensor(g) for g in grads]
    if routers:                       # expert layers: the step also reports their figures
      copies = self.runtime.copies if self.runtime.distributed else 1
      return {"loss": loss, "router": tf_moe.replica_figures(routers, copies)}, grads
    return loss, grads

  def step_outputs(self):
    """The train step's outputs in zeros (the train loop's totals start from them)."""
    if not self.cfg.model.moe.num_experts:
      return super().step_outputs()
    return {"loss": super().step_outputs(),
            "router": tf_moe.zero_figures(self.cfg.model.moe.num_experts)}

  def pipelined_loss_and_grads(self, batch):
    """GPipe (workloads/parallel/tf_pipeline.py) over the one list of encoder then decoder
    layers: the loss is the sum over all target tokens divided by their count over the
    global batch, as without a pipeline."""
    cfg, rt = self.cfg, self.runtime
    ranges = stage_ranges(self.stage_cut)
    label_smoothing = cfg.optimizer.label_smoothing

    def stage_fn(k):
      start, end = ranges[k]

      def fn(x, micro):
        carry = dict(zip(("encoded", "decoded"), x))
        with tf_layers.examples(self.iterations, micro["example"]):
          carry, logits = self.model.pipeline_layers(
              carry, micro["inputs"], micro["targets"], spec.packed_features(micro), start,
              end, training=True)
        if logits is None:
          return tuple(carry[k] for k in ("encoded", "decoded") if k in carry), tf.zeros(
              [], self.model.acc)
        return (), smoothed_cross_entropy(logits, micro["targets"], label_smoothing)[0]
      return fn

    rows = batch["targets"].shape[0]
    batch = {**batch, "example": tf.range(rows, dtype=tf.int64)}  # dropout keys, split as rows
    with tf.GradientTape() as tape:
      total, _, self.shifted_bytes = tf_pipeline.run(
          [stage_fn(k) for k in range(len(ranges))], batch, devices=rt.pipeline_devices,
          stages=rt.stage, microbatches_count=rt.microbatches, data=rt.data,
          remat=cfg.parallel.remat)
      tokens = tf.reduce_sum(tf.cast(tf.not_equal(batch["targets"], tf_model.PAD_ID),
                                     total.dtype))
      loss = total / tf.maximum(tokens, 1.0)
    self.forward_ops = tf_pipeline.forward_op_count()
    grads = tape.gradient(loss, self.model.trainable_variables)
    return loss, [tf.convert_to_tensor(g) for g in grads]

  def eval_step(self, batch):
    with mp.gathered_weights(self.model.runtime):   # no collective inside the decode loop
      tokens = translate(self.model, batch["inputs"], self.cfg.model)
    return {"tokens": tokens, "index": batch["index"], "mask": batch["mask"]}


make_trainer = TransformerTrainer        # WorkloadSpec.trainer_modules: (cfg, ctx) -> the trainer
