"""ResNet training and evaluation in TensorFlow (Keras 3 model, custom loop), behind the
driver's Trainer API. The loop, the distribution (tf.distribute) and the Trainer methods live
in workloads/parallel/tf_trainer_base.py; this file says what is ResNet's: the model (batch
norm across replica groups, halo-exchanged row slabs under spatial partitioning), LARS/SGD,
the label-smoothed loss, top-1 counts and the ImageNet/mini/synthetic batches.
"""
import tensorflow as tf

from workloads.optim import schedules, tf_optimizers
from workloads.parallel.tf_trainer_base import StrategyTrainer
from workloads.resnet import input_pipeline, spec, tf_model


def cross_entropy_sum(logits, labels, num_classes, label_smoothing):
  """Summed (not averaged) label-smoothed cross entropy: callers divide by the global batch."""
  targets = tf.one_hot(labels, num_classes, dtype=logits.dtype)
  targets = targets * (1.0 - label_smoothing) + label_smoothing / num_classes
  return tf.reduce_sum(tf.nn.softmax_cross_entropy_with_logits(targets, logits))


class ResNetTrainer(StrategyTrainer):
  spec_module, pipeline = spec, input_pipeline

  def __init__(self, cfg, ctx):
    super().__init__(cfg, ctx)
    tf_model.check_spatial_partitions(cfg.model.stage_sizes, cfg.data.image_size,
                                      self.runtime.spatial)
    self.schedule = schedules.warmup_poly_for(cfg.optimizer, cfg.train, self.train_examples)

  def make_model(self, runtime):
    cfg = self.cfg
    return tf_model.resnet(cfg.model.stage_sizes, cfg.model.num_classes, cfg.model.width,
                           cfg.data.image_size, dtype=self.dtype, runtime=runtime)

  def make_optimizer(self):
    optimizer = tf_optimizers.make_optimizer(
        self.cfg.optimizer, self.schedule, tf_model.decayed_variables(self.model),
        self.model.trainable_variables)
    return optimizer, optimizer.learning_rate_schedule

  def loss_and_grads(self, batch):
    cfg = self.cfg
    with tf.GradientTape() as tape:
      logits = self.model(batch["image"], training=True)
      # Summed over this replica's examples and divided by the global batch, so the sum over
      # replicas is the global mean; the k replicas of a spatial group share each example.
      loss = cross_entropy_sum(logits, batch["label"], cfg.model.num_classes,
                               cfg.optimizer.label_smoothing) / (
                                   cfg.train.global_batch_size * self.runtime.spatial)
    return loss, tape.gradient(loss, self.model.trainable_variables)

  def eval_step(self, batch):
    logits = self.model(batch["image"], training=False)
    correct = tf.cast(tf.argmax(logits, -1, output_type=tf.int32) == batch["label"], tf.float32)
    mask = batch["mask"]
    if self.runtime.spatial > 1:                # a spatial group counts its examples once
      mask = mask * tf.cast(self.runtime.spatial_index() == 0, tf.float32)
    return tf.stack([tf.reduce_sum(correct * mask), tf.reduce_sum(mask)])


def make_trainer(cfg, ctx):
  return ResNetTrainer(cfg, ctx)
