"""BERT pre-training and masked-LM eval in TensorFlow (Keras 3 model, custom loop), behind the
driver's Trainer API.

Strategy-friendly by construction, so a tf.distribute runtime can wrap `_train_step` in
`strategy.run`: the loss is each replica's share of the global loss (masked-LM numerator over
the all-reduced weight sum, next-sentence sum over the global batch), so summing replica
gradients gives the global gradient; the optimizer is built eagerly before any step.
`train(n)` runs n XLA-compiled steps inside one tf.function, one host sync per call.
"""
import numpy as np
import tensorflow as tf
import keras

from workloads.bert import input_pipeline, spec, tf_model
from workloads.optim import tf_optimizers


def pretraining_loss(mlm_logits, nsp_logits, batch, global_batch_size):
  """This replica's share of the reference loss (jax_model.pretraining_loss on the global
  batch): sum over replicas == the global loss."""
  replica = tf.distribute.get_replica_context()
  weights = batch["masked_lm_weights"]
  nll = tf.nn.sparse_softmax_cross_entropy_with_logits(batch["masked_lm_ids"], mlm_logits)
  weight_sum = replica.all_reduce(tf.distribute.ReduceOp.SUM, tf.reduce_sum(weights))
  mlm = tf.reduce_sum(weights * nll) / (weight_sum + 1e-5)
  nsp = tf.nn.sparse_softmax_cross_entropy_with_logits(batch["next_sentence_labels"], nsp_logits)
  return mlm + tf.reduce_sum(nsp) / global_batch_size


def loss_and_grads(model, batch, global_batch_size, training=True):
  """Loss and dense gradients (the embedding lookups' IndexedSlices made dense: the tied word
  embedding gets both a sparse and a dense contribution, and LAMB's norms want whole arrays)."""
  with tf.GradientTape() as tape:
    mlm_logits, nsp_logits = model(batch, training=training)
    loss = pretraining_loss(mlm_logits, nsp_logits, batch, global_batch_size)
  grads = tape.gradient(loss, model.trainable_variables)
  return loss, [tf.convert_to_tensor(g) for g in grads]


def masked_lm_correct(mlm_logits, batch, example_mask):
  weights = batch["masked_lm_weights"] * example_mask[:, None]
  hits = tf.cast(tf.argmax(mlm_logits, -1, output_type=tf.int32) == batch["masked_lm_ids"],
                 tf.float32)
  return tf.reduce_sum(hits * weights), tf.reduce_sum(weights)


class BertTrainer:
  def __init__(self, cfg, ctx):
    self.cfg, self.ctx = cfg, ctx
    self.num_devices = self.data_replicas = 1
    self.mesh_description = "data=1"
    gpus = tf.config.list_logical_devices("GPU")
    self.device_kind = (tf.config.experimental.get_device_details(
        tf.config.list_physical_devices("GPU")[0]).get("device_name", "GPU") if gpus else "cpu")
    self.data_dir, self.train_examples = input_pipeline.data_source(cfg, ctx)
    self.eval_examples = cfg.data.eval_examples
    self.schedule = spec.schedule_for(cfg)
    self._train_iter = self._eval_data = None

  def build(self):
    """The model (or the reference checkpoint) and the optimizer, without compiling steps."""
    cfg = self.cfg
    keras.utils.set_random_seed(self.ctx.seed)
    dtype = "mixed_bfloat16" if cfg.train.precision == "bfloat16" else "float32"
    self.model = tf_model.build(cfg.model, cfg.data.max_seq_length,
                                cfg.data.max_predictions_per_seq, dtype)
    if cfg.data.init_checkpoint and cfg.data.source == "tfrecord":
      tf_model.load_tf1_checkpoint(self.model, input_pipeline.checkpoint_path(cfg, self.ctx))
    self.optimizer = tf_optimizers.make_lamb(cfg.optimizer, self.schedule,
                                             tf_model.lamb_excluded_variables(self.model))
    self.optimizer.build(self.model.trainable_variables)
    self._step = tf.function(self._train_step, jit_compile=cfg.train.jit_compile)
    self._eval_step = tf.function(self._eval_batch, jit_compile=cfg.train.jit_compile)

  def _train_step(self, batch):
    loss, grads = loss_and_grads(self.model, batch, self.cfg.train.global_batch_size)
    self.optimizer.apply(grads, self.model.trainable_variables)
    return loss

  def _eval_batch(self, batch):
    mlm_logits, _ = self.model(batch, training=False)
    return tf.stack(masked_lm_correct(mlm_logits, batch, batch["mask"]))

  @tf.function
  def _train_loop(self, iterator, num_steps):
    total = tf.constant(0.0)
    for _ in tf.range(num_steps):
      total += self._step(next(iterator))
    return total / tf.cast(num_steps, tf.float32)

  def _batch_spec(self, batch_size, with_mask=False):
    return {k: tf.TensorSpec(shape, dtype)
            for k, (shape, dtype) in spec.batch_layout(self.cfg, batch_size, with_mask).items()}

  def init(self):
    """Builds model and optimizer, traces and compiles the loop and the eval step on zeros (no
    dataset exists yet), then restores the initial state."""
    self.build()
    gbs, eval_bs = self.cfg.train.global_batch_size, self.cfg.data.eval_batch_size
    zeros = lambda specs: {k: tf.zeros(s.shape, s.dtype) for k, s in specs.items()}
    state = self.model.variables + self.optimizer.variables
    saved = [v.numpy() for v in state]
    dummy = iter(tf.data.Dataset.from_tensors(zeros(self._batch_spec(gbs))).repeat())
    self._train_loop(dummy, tf.constant(1))
    self._eval_step(zeros(self._batch_spec(eval_bs, with_mask=True)))
    for var, value in zip(state, saved):
      var.assign(value)

  def _train_iterator(self):
    if self._train_iter is None:         # first use is after run_start: no data read before
      gbs = self.cfg.train.global_batch_size
      if self.cfg.data.source == "synthetic":
        batch = input_pipeline.synthetic_batch(self.cfg, gbs, self.ctx.seed + 1)
        ds = tf.data.Dataset.from_tensors(batch).repeat()
      else:
        ds = input_pipeline.train_dataset(self.cfg, gbs, seed=self.ctx.seed,
                                          data_dir=self.data_dir)
      self._train_iter = iter(ds)
    return self._train_iter

  def train(self, num_steps):
    loss = self._train_loop(self._train_iterator(), tf.constant(num_steps))
    step = int(self.optimizer.iterations.numpy())       # the one host sync of the call
    return {"loss": float(loss), "lr": float(self.schedule(step - 1)), "step": step}

  def evaluate(self):
    if self.cfg.data.source == "synthetic":
      raise ValueError("a synthetic run has no eval split")
    if self._eval_data is None:
      self._eval_data = input_pipeline.eval_dataset(self.cfg, self.cfg.data.eval_batch_size,
                                                    self.data_dir)
    totals = tf.zeros(2)
    for batch in self._eval_data:
      totals += self._eval_step(batch)
    correct, count = totals.numpy()
    return {"accuracy": float(correct / count), "count": int(round(count))}

  def describe(self):
    params = int(sum(np.prod(v.shape) for v in self.model.trainable_variables))
    from workloads.resnet.tf_trainer import _graph_flops
    return {"parameters": params,
            "train_flops_per_example": _graph_flops(self._step, self._batch_spec(
                self.cfg.train.global_batch_size)) / self.cfg.train.global_batch_size}


def make_trainer(cfg, ctx):
  return BertTrainer(cfg, ctx)
