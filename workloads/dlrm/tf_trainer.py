"""DLRM-DCNv2 training and evaluation in TensorFlow (Keras 3 model, custom loop), behind the
driver's Trainer API (the loop and tf.distribute in workloads/parallel/tf_trainer_base.py).
On a model axis the slab's shard is differentiated by each replica (its rows' gradients) and
summed over its data peers by the base; every dense weight is whole."""
import tensorflow as tf

from workloads.dlrm import spec, tf_model
from workloads.optim import tf_optimizers
from workloads.parallel.tf_trainer_base import StrategyTrainer


class DlrmTrainer(StrategyTrainer):
  spec = spec.SPEC

  def __init__(self, cfg, ctx):
    super().__init__(cfg, ctx)
    self.schedule = spec.schedule_for(cfg)

  def make_model(self, runtime):
    return tf_model.build(self.cfg, self.dtype, runtime)

  def make_optimizer(self):
    dtype = "float64" if self.model.variable_dtype == "float64" else "float32"
    optimizer = tf_optimizers.make_adagrad(self.cfg.optimizer, self.schedule, dtype)
    return optimizer, optimizer.learning_rate_schedule

  def loss_and_grads(self, batch):
    """This replica's examples' binary cross entropy, summed and divided by the global batch
    (the sum over data replicas is the global mean; the base divides the whole weights'
    gradients by the model peers, who compute the same examples)."""
    with tf.GradientTape() as tape:
      variables = self.watch_variables(tape)
      logits = self.model(batch["dense"], batch["sparse"], training=True)
      losses = tf.nn.sigmoid_cross_entropy_with_logits(
          labels=tf.cast(batch["label"], logits.dtype), logits=logits)
      loss = tf.reduce_sum(losses) / self.cfg.train.global_batch_size
    # the slab's gather gives IndexedSlices: dense, for the replicas' sums
    return loss, [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]

  def eval_step(self, batch):
    logits = self.model(batch["dense"], batch["sparse"], training=False)
    return {"score": tf.sigmoid(logits), "label": batch["label"], "mask": batch["mask"]}


make_trainer = DlrmTrainer        # WorkloadSpec.trainer_modules: (cfg, ctx) -> the trainer
