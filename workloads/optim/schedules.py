"""Learning-rate schedules, written once for every framework.

`ops` is an array namespace with `minimum`, `maximum` and `where` (numpy, jax.numpy, or
tf.experimental.numpy), so the same formula runs in numpy tests, inside a jitted JAX step and
inside a TF graph.
"""
import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class WarmupPolySchedule:
  """Linear warmup from 0 to base_lr, then polynomial decay to end_lr (MLPerf ResNet LARS).

  lr(step) = base_lr * step / warmup_steps                        for step < warmup_steps
           = end_lr + (base_lr - end_lr) * (1 - t) ** power       after, t = (step - warmup) / decay
  """
  base_lr: float
  warmup_steps: int
  decay_steps: int
  end_lr: float
  power: float

  def __call__(self, step, ops=np):
    step = step * 1.0
    warmup = self.base_lr * step / max(self.warmup_steps, 1)
    progress = ops.minimum(ops.maximum(step - self.warmup_steps, 0.0) / max(self.decay_steps, 1), 1.0)
    decayed = self.end_lr + (self.base_lr - self.end_lr) * (1.0 - progress) ** self.power
    return ops.where(step < self.warmup_steps, warmup, decayed)


def steps_per_epoch(train_examples: int, global_batch_size: int) -> int:
  """Steps that cover one epoch (the last batch of an epoch spills into the next)."""
  return math.ceil(train_examples / global_batch_size)


def warmup_poly_for(opt_cfg, train_cfg, train_examples: int) -> WarmupPolySchedule:
  """The schedule the MLPerf ResNet recipe describes, in steps: decay ends at the epoch budget."""
  per_epoch = steps_per_epoch(train_examples, train_cfg.global_batch_size)
  warmup_steps = int(round(opt_cfg.warmup_epochs * per_epoch))
  total_steps = int(train_cfg.max_epochs * per_epoch)
  return WarmupPolySchedule(base_lr=opt_cfg.base_learning_rate, warmup_steps=warmup_steps,
                            decay_steps=max(total_steps - warmup_steps, 1),
                            end_lr=opt_cfg.end_learning_rate, power=opt_cfg.decay_poly_power)
