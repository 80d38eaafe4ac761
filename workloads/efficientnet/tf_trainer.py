"""EfficientNet training and evaluation in TensorFlow (Keras 3 model, custom loop), behind the
driver's Trainer API (the loop and distribution: workloads/parallel/tf_trainer_base.py).

What is EfficientNet's: the model (batch norm across replica groups), TF-semantics RMSProp
with the L2 term off batch norm (or, in the large_batch recipe, LARS with that L2 term in
the loss), the label-smoothed loss, and a second Keras model holding the
exponential moving average of the weights and batch-norm statistics (updated after every step
as tf.train.ExponentialMovingAverage(decay, num_updates=step) does), which eval runs.
"""
import tensorflow as tf

from workloads.common import tf_top1
from workloads.efficientnet import spec, tf_model
from workloads.optim import tf_optimizers
from workloads.parallel import tf_layers
from workloads.parallel.tf_trainer_base import StrategyTrainer


def l2_term(model, weight_decay):
  """weight_decay * sum(tf.nn.l2_loss(v)) over every trainable variable but batch norm's, as the
  tensorflow/tpu EfficientNet loss adds it (jax_optimizers.l2_term)."""
  bn = {id(v) for v in tf_model.batch_norm_variables(model)}
  return weight_decay * tf.add_n([tf.nn.l2_loss(v) for v in model.trainable_variables
                                  if id(v) not in bn])


def ema_update(ema_vars, new_values, decay, step):
  """ema = d * ema + (1 - d) * value, d = min(decay, (1 + step) / (10 + step))."""
  dtype = ema_vars[0].dtype
  step = tf.cast(step, dtype)
  d = tf.minimum(tf.constant(decay, dtype), (1.0 + step) / (10.0 + step))
  for ema, value in zip(ema_vars, new_values):
    ema.assign(d * ema + (1.0 - d) * tf.cast(value, dtype))


def averaged_weights(model):
  """The variables the moving average follows: trainable ones and the BN moving statistics
  (not the dropout seed generators' states)."""
  return model.trainable_weights + [w for layer in model.layers if hasattr(layer, "moving_mean")
                                    for w in (layer.moving_mean, layer.moving_variance)]


class EfficientNetTrainer(StrategyTrainer):
  spec = spec.SPEC

  def __init__(self, cfg, ctx):
    super().__init__(cfg, ctx)
    self.schedule = spec.schedule_for(cfg, self.train_examples)

  def make_model(self, runtime):
    # One replica's steps XLA-compile (train.jit_compile), and XLA:CPU's depthwise conv is slow.
    taps = runtime is None and self.cfg.train.jit_compile and self.device_kind == "cpu"
    model = tf_model.build(self.cfg, self.dtype, runtime, depthwise_taps=taps)
    # The moving average lives in a twin model (eval runs it); it starts at the initial weights.
    self.ema_model = tf_model.build(self.cfg, self.dtype, runtime, depthwise_taps=taps)
    self.ema_model.set_weights(model.get_weights())
    return model

  def make_optimizer(self):
    opt = self.cfg.optimizer
    if opt.name == "lars":
      optimizer = tf_optimizers.make_optimizer(
          opt, self.schedule, tf_layers.kernel_variables(self.model),
          self.model.trainable_variables, weight_decay=opt.lars_weight_decay)
    else:
      optimizer = tf_optimizers.make_rmsprop(opt, self.schedule,
                                             tf_model.batch_norm_variables(self.model))
    return optimizer, optimizer.learning_rate_schedule

  def loss_and_grads(self, batch):
    cfg = self.cfg
    with tf.GradientTape() as tape:
      logits = self.model(batch["image"], training=True)
      loss = tf_top1.cross_entropy_sum(logits, batch["label"], cfg.model.num_classes,
                               cfg.optimizer.label_smoothing) / cfg.train.global_batch_size
      if spec.loss_l2(cfg):   # each replica's share: the sum over replicas is the term once
        loss += l2_term(self.model, spec.loss_l2(cfg)) / self.runtime.num_replicas
    return loss, tape.gradient(loss, self.model.trainable_variables)

  def after_update(self):
    ema_update(averaged_weights(self.ema_model), averaged_weights(self.model),
               self.cfg.optimizer.ema_decay, self.iterations)

  def extra_state(self):
    return averaged_weights(self.ema_model)

  def eval_step(self, batch):
    logits = self.ema_model(batch["image"], training=False)
    return tf_top1.counts(logits, batch["label"], batch["mask"])


make_trainer = EfficientNetTrainer        # WorkloadSpec.trainer_modules: (cfg, ctx) -> the trainer
