"""ResNet training and evaluation in TensorFlow (Keras 3 model, custom loop), behind the
driver's Trainer API. The loop, the distribution (tf.distribute) and the Trainer methods live
in workloads/parallel/tf_trainer_base.py; this file says what is ResNet's: the model (batch
norm across replica groups, halo-exchanged row slabs under spatial partitioning), LARS/SGD,
the label-smoothed loss, top-1 counts and the ImageNet/mini/synthetic batches.
"""
import tensorflow as tf

from harness.pipeline import stage_ranges
from workloads.common import tf_top1
from workloads.optim import schedules, tf_optimizers
from workloads.parallel import tf_pipeline
from workloads.parallel.tf_trainer_base import StrategyTrainer
from workloads.resnet import spec, tf_model


class ResNetTrainer(StrategyTrainer):
  spec = spec.SPEC

  def __init__(self, cfg, ctx):
    super().__init__(cfg, ctx)
    tf_model.check_spatial_partitions(cfg.model.stage_sizes, cfg.data.image_size,
                                      self.runtime.spatial)
    self.schedule = schedules.warmup_poly_for(cfg.optimizer, cfg.train, self.train_examples)
    if self.stage_cut and self.runtime.stage > 1 and self.runtime.data > 1:
      raise ValueError(f"--mesh {self.runtime.description} in TF: its pipeline normalises "
                       "each micro-batch on one stage device; allowed: stage=K with data=1")

  def make_model(self, runtime):
    return tf_model.build(self.cfg, self.dtype, runtime, stages=self.stage_placement)

  def make_optimizer(self):
    optimizer = tf_optimizers.make_optimizer(
        self.cfg.optimizer, self.schedule, tf_model.decayed_variables(self.model),
        self.model.trainable_variables)
    return optimizer, optimizer.learning_rate_schedule

  def loss_and_grads(self, batch):
    cfg = self.cfg
    if self.stage_cut:
      return self.pipelined_loss_and_grads(batch)
    with tf.GradientTape() as tape:
      logits = self.model(batch["image"], training=True)
      # Summed over this replica's examples and divided by the global batch, so the sum over
      # replicas is the global mean; the k replicas of a spatial group share each example.
      loss = tf_top1.cross_entropy_sum(logits, batch["label"], cfg.model.num_classes,
                               cfg.optimizer.label_smoothing) / (
                                   cfg.train.global_batch_size * self.runtime.copies)
    return loss, tape.gradient(loss, self.model.trainable_variables)

  def pipelined_loss_and_grads(self, batch):
    """GPipe (workloads/parallel/tf_pipeline.py): the blocks cut into stages, batch norm per
    micro-batch, the moving averages moved by the mean of the micro-batches' statistics (each
    micro-batch's update is read off and undone; their mean is applied once, after the
    backward pass, whose re-materialized forwards update them again)."""
    cfg, rt = self.cfg, self.runtime
    stages = tf_model.stage_models(self.model, cfg.model.stage_sizes,
                                   stage_ranges(self.stage_cut))
    moving = self.model.non_trainable_variables
    before = [tf.identity(v.value) for v in moving]
    deltas, recording = [], [True]

    def stage_fn(k):
      def fn(x, micro):
        y = stages[k](micro["image"] if k == 0 else x[0], training=True)
        if recording[0]:
          deltas.append([v.value - b for v, b in zip(moving, before)])
        for v, b in zip(moving, before):
          v.assign(b)
        if k < len(stages) - 1:
          return (y,), tf.zeros([], y.dtype)
        return (), tf_top1.cross_entropy_sum(y, micro["label"], cfg.model.num_classes,
                                     cfg.optimizer.label_smoothing)
      return fn

    with tf.GradientTape() as tape:
      total, _, self.shifted_bytes = tf_pipeline.run(
          [stage_fn(k) for k in range(len(stages))], batch, devices=rt.pipeline_devices,
          stages=rt.stage, microbatches_count=rt.microbatches, data=rt.data,
          remat=cfg.parallel.remat)
      loss = total / cfg.train.global_batch_size
    recording[0] = False
    self.forward_ops = tf_pipeline.forward_op_count()
    grads = tape.gradient(loss, self.model.trainable_variables)
    count = rt.microbatches * rt.data
    for i, (v, b) in enumerate(zip(moving, before)):
      v.assign(b + tf.add_n([d[i] for d in deltas]) / count)
    return loss, grads

  def eval_step(self, batch):
    logits = self.model(batch["image"], training=False)
    mask = batch["mask"]
    if self.runtime.spatial > 1:                # a spatial group counts its examples once
      mask = mask * tf.cast(self.runtime.spatial_index() == 0, tf.float32)
    return tf_top1.counts(logits, batch["label"], mask)


make_trainer = ResNetTrainer        # WorkloadSpec.trainer_modules: (cfg, ctx) -> the trainer
