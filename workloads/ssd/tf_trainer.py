"""SSD training and evaluation in TensorFlow (Keras 3 model, custom loop), behind the driver's
Trainer API (the loop and tf.distribute: workloads/parallel/tf_trainer_base.py). The same loss,
optimizer, schedule and eval outputs as jax_trainer.py, in TF ops.
"""
import tensorflow as tf

from workloads.optim import tf_optimizers
from workloads.parallel.tf_trainer_base import StrategyTrainer
from workloads.ssd import boxes, checkpoint, host_eval, spec, tf_model


def smooth_l1(x):
  ax = tf.abs(x)
  return tf.where(ax < 1.0, 0.5 * x * x, ax - 0.5)


def hardest(values, k):
  """jax_trainer.hardest in TF: each row's k largest values, ties to the lower index."""
  last = tf.clip_by_value(k - 1, 0, values.shape[1] - 1)
  kth = tf.gather(tf.sort(values, axis=1, direction="DESCENDING"), last, axis=1,
                  batch_dims=1)[:, None]
  above, tie = values > kth, values == kth
  room = k[:, None] - tf.reduce_sum(tf.cast(above, tf.int32), 1, keepdims=True)
  return above | (tie & (tf.cumsum(tf.cast(tie, tf.int32), axis=1) <= room))


def ssd_loss_sum(locs, logits, gt_offsets, gt_labels, neg_ratio=3):
  """jax_trainer.ssd_loss summed (not averaged) over this replica's images."""
  positive = gt_labels > 0
  pos = tf.cast(positive, locs.dtype)
  gt_offsets = tf.cast(gt_offsets, locs.dtype)     # float64 models (the equality tests)
  num_pos = tf.reduce_sum(pos, 1)
  loc_loss = tf.reduce_sum(tf.reduce_sum(smooth_l1(locs - gt_offsets), -1) * pos, 1)
  con = tf.nn.sparse_softmax_cross_entropy_with_logits(gt_labels, logits)
  con_neg = tf.stop_gradient(tf.where(positive, tf.zeros_like(con), con))
  limit = tf.minimum(neg_ratio * num_pos, float(con.shape[1]))
  negative = hardest(con_neg, tf.cast(limit, tf.int32))
  con_loss = tf.reduce_sum(con * tf.cast(positive | negative, con.dtype), 1)
  per_image = ((loc_loss + con_loss) * tf.cast(num_pos > 0, locs.dtype)
               / tf.maximum(num_pos, 1e-6))
  return tf.reduce_sum(per_image)


def candidates(locs, logits, dboxes, k):
  """jax_trainer.candidates in TF: each foreground class's k best anchors, decoded."""
  dboxes = tf.constant(dboxes, locs.dtype)
  xy = dboxes[:, :2] + boxes.SCALE_XY * locs[..., :2] * dboxes[:, 2:]
  wh = tf.exp(boxes.SCALE_WH * locs[..., 2:]) * dboxes[:, 2:]
  ltrb = tf.concat([xy - wh / 2, xy + wh / 2], -1)
  probs = tf.transpose(tf.nn.softmax(logits, -1)[..., 1:], (0, 2, 1))     # (N, C-1, A)
  scores, index = tf.math.top_k(probs, k)
  picked = tf.gather(ltrb, index, batch_dims=1)                         # (N, C-1, k, 4)
  return picked, scores


class SsdTrainer(StrategyTrainer):
  spec = spec.SPEC

  def __init__(self, cfg, ctx):
    super().__init__(cfg, ctx)
    self.schedule = spec.schedule_for(cfg, self.train_examples)
    self.dboxes = boxes.default_boxes(**spec.anchor_geometry(cfg))
    # spatial slabs of an image whose rows do not split at every backbone level (300 px): the
    # rows padded with zeros at the bottom (tf_model.build zeroes what the layers add there)
    rows = spec.spatial_rows(cfg, self.runtime.spatial)
    if self.runtime.spatial > 1 and rows != cfg.data.image_size:
      pad = [[0, 0], [0, rows - cfg.data.image_size], [0, 0], [0, 0]]
      self.host_batch_map = lambda batch: {**batch, "image": tf.pad(batch["image"], pad)}

  def make_model(self, runtime):
    model = tf_model.build(self.cfg, self.dtype, runtime)
    if self.cfg.model.backbone_checkpoint and self.data_dir:   # (describe reads no data)
      checkpoint.load_into_keras(model, checkpoint.read(self.data_dir,
                                                        self.cfg.model.backbone_checkpoint))
    return model

  def make_optimizer(self):
    opt = self.cfg.optimizer
    # torch SGD: weight decay on every parameter (none excluded)
    optimizer = tf_optimizers.MLPerfMomentum(tf_optimizers.KerasSchedule(self.schedule),
                                             decay=opt.weight_decay, momentum=opt.momentum,
                                             lars=False)
    return optimizer, optimizer.learning_rate_schedule

  def loss_and_grads(self, batch):
    with tf.GradientTape() as tape:
      locs, logits = self.model(batch["image"], training=True)
      loss = ssd_loss_sum(locs, logits, batch["boxes"], batch["labels"]) / (
          self.cfg.train.global_batch_size * self.runtime.copies)
    return loss, tape.gradient(loss, self.model.trainable_variables)

  def eval_step(self, batch):
    locs, logits = self.model(batch["image"], training=False)
    k = min(host_eval.MAX_CANDIDATES, locs.shape[1])
    picked, scores = candidates(locs, logits, self.dboxes, k)
    return {"boxes": picked, "scores": scores, "image_id": batch["image_id"],
            "image_size": batch["image_size"], "mask": batch["mask"]}


make_trainer = SsdTrainer        # WorkloadSpec.trainer_modules: (cfg, ctx) -> the trainer
