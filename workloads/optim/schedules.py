"""Learning-rate schedules, written once for every framework.

`ops` is an array namespace with `minimum`, `maximum` and `where` (numpy, jax.numpy, or
tf.experimental.numpy), so the same formula runs in numpy tests, inside a jitted JAX step and
inside a TF graph.
"""
import dataclasses

import numpy as np

from harness.cadence import steps_per_epoch


@dataclasses.dataclass(frozen=True)
class WarmupPolySchedule:
  """Linear warmup from 0 to base_lr, then polynomial decay to end_lr (MLPerf ResNet LARS).

  lr(step) = base_lr * step / warmup_steps                        for step < warmup_steps
           = end_lr + (base_lr - end_lr) * (1 - t) ** power       after, t = (step - warmup) / decay

  tensorflow/tpu EfficientNet counts the decay from max(step - warmup, 1) (`min_decay_step` 1).
  """
  base_lr: float
  warmup_steps: int
  decay_steps: int
  end_lr: float
  power: float
  min_decay_step: float = 0.0

  def __call__(self, step, ops=np):
    step = step * 1.0
    warmup = self.base_lr * step / max(self.warmup_steps, 1)
    since = ops.maximum(step - self.warmup_steps, self.min_decay_step)
    progress = ops.minimum(since / max(self.decay_steps, 1), 1.0)
    decayed = self.end_lr + (self.base_lr - self.end_lr) * (1.0 - progress) ** self.power
    return ops.where(step < self.warmup_steps, warmup, decayed)


def warmup_poly_for(opt_cfg, train_cfg, train_examples: int) -> WarmupPolySchedule:
  """The schedule the MLPerf ResNet recipe describes, in steps: decay ends at the epoch budget."""
  per_epoch = steps_per_epoch(train_examples, train_cfg.global_batch_size)
  warmup_steps = int(round(opt_cfg.warmup_epochs * per_epoch))
  total_steps = int(train_cfg.max_epochs * per_epoch)
  return WarmupPolySchedule(base_lr=opt_cfg.base_learning_rate, warmup_steps=warmup_steps,
                            decay_steps=max(total_steps - warmup_steps, 1),
                            end_lr=opt_cfg.end_learning_rate, power=opt_cfg.decay_poly_power)


def efficientnet_poly_for(opt_cfg, train_cfg, train_examples: int) -> WarmupPolySchedule:
  """tensorflow/tpu EfficientNet's 'poly' schedule (utils.build_learning_rate): the base rate
  scales with the batch, warmup int(epochs x steps per epoch) steps with a float steps per
  epoch, then tf.train.polynomial_decay(lr, max(1, step - warmup), total - warmup + 1,
  end_lr, power)."""
  per_epoch = train_examples / train_cfg.global_batch_size
  warmup_steps = int(opt_cfg.warmup_epochs * per_epoch)
  total_steps = int(train_cfg.max_epochs * per_epoch)
  return WarmupPolySchedule(
      base_lr=opt_cfg.base_learning_rate_per_256 * train_cfg.global_batch_size / 256,
      warmup_steps=warmup_steps, decay_steps=max(total_steps - warmup_steps + 1, 1),
      end_lr=opt_cfg.end_learning_rate, power=opt_cfg.decay_poly_power, min_decay_step=1.0)


@dataclasses.dataclass(frozen=True)
class BertLambSchedule:
  """The MLPerf BERT reference's learning rate (optimization.py `create_optimizer`):

  decayed(step) = base_lr * (1 - min(step, training_steps) / training_steps) ** power   (to 0)
  lr(step)      = base_lr * (step - start_warmup) / warmup    if step - start_warmup < warmup
                = decayed(step)                                otherwise

  The decay runs from step 0 (not from the end of warmup), and a negative start_warmup_step
  starts the run part-way into warmup, both as in the reference (tf.train.polynomial_decay
  and its hand-written warmup). `step` is the number of updates already applied.
  """
  base_lr: float
  training_steps: int
  warmup_steps: int = 0
  start_warmup_step: int = 0
  power: float = 1.0

  def __call__(self, step, ops=np):
    step = step * 1.0
    progress = ops.minimum(step, float(self.training_steps)) / max(self.training_steps, 1)
    decayed = self.base_lr * (1.0 - progress) ** self.power
    if not self.warmup_steps:
      return decayed
    since = step - self.start_warmup_step
    warmup = self.base_lr * since / self.warmup_steps
    return ops.where(since < self.warmup_steps, warmup, decayed)


@dataclasses.dataclass(frozen=True)
class WarmupExponentialSchedule:
  """tensorflow/tpu EfficientNet (utils.build_learning_rate, 'exponential'):

  lr(step) = base_lr * step / warmup_steps                          for step < warmup_steps
           = base_lr * decay_factor ** floor(step / decay_steps)   after (counted from step 0)
  """
  base_lr: float
  warmup_steps: int
  decay_steps: int
  decay_factor: float

  def __call__(self, step, ops=np):
    step = step * 1.0
    warmup = self.base_lr * step / max(self.warmup_steps, 1)
    decayed = self.base_lr * self.decay_factor ** ops.floor(step / max(self.decay_steps, 1))
    return ops.where(step < self.warmup_steps, warmup, decayed)


def warmup_exponential_for(opt_cfg, train_cfg, train_examples: int) -> WarmupExponentialSchedule:
  """The reference's schedule in steps; the base rate scales with the global batch."""
  per_epoch = train_examples / train_cfg.global_batch_size    # the reference's float division
  return WarmupExponentialSchedule(
      base_lr=opt_cfg.base_learning_rate_per_256 * train_cfg.global_batch_size / 256,
      warmup_steps=int(opt_cfg.warmup_epochs * per_epoch),
      decay_steps=int(opt_cfg.decay_epochs * per_epoch), decay_factor=opt_cfg.decay_factor)


@dataclasses.dataclass(frozen=True)
class RsqrtSchedule:
  """The MLPerf Transformer reference's learning rate (transformer_main.get_learning_rate):

  lr(step) = base_lr * hidden_size^-0.5 * min(1, step / warmup) * rsqrt(max(step, warmup))

  `step` is the number of updates already applied (the reference reads TF1's global step
  before it is incremented), so the first update has lr 0, as in the reference.
  """
  base_lr: float
  hidden_size: int
  warmup_steps: int

  def __call__(self, step, ops=np):
    step = step * 1.0
    warmup = float(max(self.warmup_steps, 1))
    return (self.base_lr * self.hidden_size ** -0.5 * ops.minimum(1.0, step / warmup)
            / ops.maximum(step, warmup) ** 0.5)


@dataclasses.dataclass(frozen=True)
class WarmupStepSchedule:
  """MLPerf SSD's rate (ssd-v1 train.py lr_warmup + the decay at listed epochs):

  lr(step) = base_lr - (warmup - step) * base_lr / (warmup * 2**factor)   for step < warmup
           = base_lr * decay_factor ** (boundaries passed)                after
  """
  base_lr: float
  warmup_steps: int
  warmup_factor: int
  boundaries: tuple[int, ...]
  decay_factor: float

  def __call__(self, step, ops=np):
    step = step * 1.0
    warmup = max(self.warmup_steps, 1)
    warm = self.base_lr - (warmup - step) * self.base_lr / (warmup * 2.0 ** self.warmup_factor)
    lr = self.base_lr + 0.0 * step
    for boundary in self.boundaries:
      lr = ops.where(step >= boundary, lr * self.decay_factor, lr)
    return ops.where(step < self.warmup_steps, warm, lr)


@dataclasses.dataclass(frozen=True)
class LrPolicySchedule:
  """The MLPerf DLRM reference's LRPolicyScheduler, at update count `step` (from 0):

  lr = base_lr * (step + 1) / warmup                            step + 1 < warmup
     = base_lr * ((decay_steps - (step + 1 - start)) / decay_steps) ** 2, at least 1e-7,
                                                                start <= step + 1 < start + decay
     = with a decay, the last rate set (frozen between warmup and decay, and after the
       decay); without one, base_lr
  (the reference's scheduler counts its own steps from 1).
  """
  base_lr: float
  warmup_steps: int
  decay_start_step: int
  decay_steps: int

  def __call__(self, step, ops=np):
    n = step * 1.0 + 1.0
    warm = self.base_lr * n / max(self.warmup_steps, 1)
    lr = self.base_lr + 0.0 * n
    if self.decay_steps and self.warmup_steps > 1:   # frozen at the warmup's last rate
      lr = lr * (self.warmup_steps - 1) / self.warmup_steps
    if self.decay_steps:
      done = ops.minimum(n - self.decay_start_step, float(self.decay_steps - 1))   # then frozen
      decayed = ops.maximum(self.base_lr * ((self.decay_steps - done) / self.decay_steps) ** 2,
                            1e-7)
      lr = ops.where(n >= self.decay_start_step, decayed, lr)
    return ops.where(n < self.warmup_steps, warm, lr)


@dataclasses.dataclass(frozen=True)
class WarmupCosineSchedule:
  """NeMo's CosineAnnealing with warmup (nemo/core/optim/lr_scheduler.py), the MLPerf Llama 3.1
  reference's schedule, at `step` updates already applied (torch's last_epoch):

  lr(step) = base_lr * (step + 1) / (warmup + 1)                       step <= warmup
           = min_lr + (base_lr - min_lr) * (1 + cos(pi * (step - warmup) / (max_steps - warmup))) / 2
           = min_lr                                                     step > max_steps
  """
  base_lr: float
  min_lr: float
  warmup_steps: int
  max_steps: int

  def __call__(self, step, ops=np):
    step = step * 1.0
    warmup = self.base_lr * (step + 1.0) / (self.warmup_steps + 1.0)
    decay_steps = max(self.max_steps - self.warmup_steps, 1)
    progress = ops.minimum(ops.maximum(step - self.warmup_steps, 0.0), float(decay_steps))
    cosine = self.min_lr + (self.base_lr - self.min_lr) * 0.5 * (
        1.0 + ops.cos(np.pi * progress / decay_steps))
    if not self.warmup_steps:
      return cosine
    return ops.where(step <= self.warmup_steps, warmup, cosine)
