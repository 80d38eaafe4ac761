"""BERT pre-training and masked-LM eval in TensorFlow (Keras 3 model, custom loop), behind the
driver's Trainer API. The loop and the distribution (tf.distribute: data parallel, weight-
update sharding with LAMB's trust ratio over whole layers) live in
workloads/parallel/tf_trainer_base.py; this file says what is BERT's.

The loss is each replica's share of the global loss (masked-LM numerator over the all-reduced
weight sum, next-sentence sum over the global batch), so summing replica gradients gives the
global gradient, which LAMB clips by its global norm.
"""
import tensorflow as tf

from workloads.bert import input_pipeline, spec, tf_model
from workloads.optim import tf_optimizers
from workloads.parallel import tf_model_parallel as mp
from workloads.parallel.tf_trainer_base import StrategyTrainer


def pretraining_loss(mlm_logits, nsp_logits, batch, global_batch_size, model=None):
  """This replica's share of the reference loss (jax_model.pretraining_loss on the global
  batch): sum over replicas == the global loss (on a model axis: the sum over each replica's
  data peers; `model`'s MLM logits may be its vocabulary shard)."""
  replica = tf.distribute.get_replica_context()
  runtime = getattr(model, "runtime", None)
  if getattr(model, "vocab_parallel", False):
    nll = mp.vocab_parallel_smoothed_cross_entropy(runtime, mlm_logits, batch["masked_lm_ids"],
                                                   1.0, 0.0, 0.0)
  else:
    nll = tf.nn.sparse_softmax_cross_entropy_with_logits(batch["masked_lm_ids"], mlm_logits)
  weights = tf.cast(batch["masked_lm_weights"], nll.dtype)
  weight_sum = replica.all_reduce(tf.distribute.ReduceOp.SUM, tf.reduce_sum(weights))
  if runtime is not None:
    weight_sum /= runtime.copies            # every model peer counted the same positions
  mlm = tf.reduce_sum(weights * nll) / (weight_sum + 1e-5)
  nsp = tf.nn.sparse_softmax_cross_entropy_with_logits(batch["next_sentence_labels"], nsp_logits)
  return mlm + tf.reduce_sum(nsp) / global_batch_size


def loss_and_grads(model, batch, global_batch_size, training=True, watch=None):
  """Loss and dense gradients (the embedding lookups' IndexedSlices made dense: the tied word
  embedding gets both a sparse and a dense contribution, and LAMB's norms want whole arrays).
  `watch(tape)`: the variables to differentiate (default: the model's trainable ones)."""
  with tf.GradientTape() as tape:
    variables = watch(tape) if watch else model.trainable_variables
    mlm_logits, nsp_logits = model(batch, training=training)
    loss = pretraining_loss(mlm_logits, nsp_logits, batch, global_batch_size, model)
  grads = tape.gradient(loss, variables)
  return loss, [tf.convert_to_tensor(g) for g in grads]


def masked_lm_correct(mlm_logits, batch, example_mask):
  weights = batch["masked_lm_weights"] * example_mask[:, None]
  hits = tf.cast(tf.argmax(mlm_logits, -1, output_type=tf.int32) == batch["masked_lm_ids"],
                 tf.float32)
  return tf.reduce_sum(hits * weights), tf.reduce_sum(weights)


class BertTrainer(StrategyTrainer):
  spec = spec.SPEC

  def __init__(self, cfg, ctx):
    spec.check_framework(cfg, "tf")         # a pipeline or packed rows: JAX only, one line
    super().__init__(cfg, ctx)
    self.schedule = spec.schedule_for(cfg)

  def make_model(self, runtime):
    """The model (Megatron's layers on a model axis), or the reference checkpoint."""
    cfg = self.cfg
    model = tf_model.build(cfg, self.dtype, runtime)
    if cfg.data.init_checkpoint and cfg.data.source == "tfrecord":
      tf_model.load_tf1_checkpoint(model, input_pipeline.checkpoint_path(cfg, self.ctx))
    return model

  def make_optimizer(self):
    optimizer = tf_optimizers.make_lamb(self.cfg.optimizer, self.schedule,
                                        tf_model.lamb_excluded_variables(self.model))
    return optimizer, optimizer.learning_rate_schedule

  def loss_and_grads(self, batch):
    return loss_and_grads(self.model, batch, self.cfg.train.global_batch_size,
                          watch=self.watch_variables)

  def eval_step(self, batch):
    with mp.gathered_weights(self.model.runtime):   # whole logits for the argmax
      mlm_logits, _ = self.model(batch, training=False)
    return tf.stack(masked_lm_correct(mlm_logits, batch, batch["mask"]))


make_trainer = BertTrainer        # WorkloadSpec.trainer_modules: (cfg, ctx) -> the trainer
