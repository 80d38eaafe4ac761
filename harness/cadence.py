"""Eval schedules, in one place (docs/architecture.md). MLPerf has three kinds:

  every N epochs, the first after N - offset (ResNet: every 4, offset 0..3);
  at a listed set of epochs (SSD v0.7-v1.0: 40, 50, 55, ..., 80);
  every N training samples, rounded up to whole batches (BERT: a formula of the batch size);
  N times an epoch (DLRM-DCNv2: every 0.05 epoch, epoch_num the fraction trained).

A run's TrainConfig holds its schedule (train.eval_every_epochs / eval_offset_epochs,
train.eval_at_epochs, train.eval_every_samples, or train.evals_per_epoch); presets fill it from rules/<benchmark>.yaml
with `apply_rules`. `plan` turns it into the driver's blocks: the global step after which each
eval runs, and the block_start metadata (first_epoch_num, epoch_count) in the schedule's unit.
"""
import math

EVERY_EPOCHS, AT_EPOCHS, EVERY_SAMPLES = "every_epochs", "at_epochs", "every_samples"
PER_EPOCH = "per_epoch"


def kind(train) -> str:
  if train.eval_every_samples:
    return EVERY_SAMPLES
  if getattr(train, "evals_per_epoch", 0):
    return PER_EPOCH
  return AT_EPOCHS if train.eval_at_epochs else EVERY_EPOCHS


def epoch_blocks(max_epochs, every, offset):
  """[(first_epoch_num, epoch_count)]: every `every` epochs, the first after every - offset."""
  out, epoch = [], 0
  count = every - offset
  while epoch < max_epochs:
    count = min(count, max_epochs - epoch)
    out.append((epoch, count))
    epoch += count
    count = every
  return out


def at_epoch_blocks(at_epochs, max_epochs):
  """[(first_epoch_num, epoch_count)] ending at each listed epoch within the budget."""
  out, epoch = [], 0
  for end in at_epochs:
    end = min(end, max_epochs)
    if end > epoch:
      out.append((epoch, end - epoch))
      epoch = end
  return out


def sample_blocks(max_samples, eval_every, global_batch_size):
  """[(first_step, step_count)]: eval after each block, at every multiple of eval_every samples
  rounded up to whole batches (MLPerf BERT: "may be rounded up to the nearest batch size")."""
  total = math.ceil(max_samples / global_batch_size)
  out, done, k = [], 0, 1
  while done < total:
    end = min(math.ceil(k * eval_every / global_batch_size), total)
    if end > done:
      out.append((done, end - done))
      done = end
    k += 1
  return out


def fraction_blocks(total_steps, per_epoch, evals_per_epoch):
  """[(first_step, step_count)]: an eval every floor(per_epoch / evals_per_epoch) steps (at
  least 1), the last block ending at the budget (the DLRM-DCNv2 reference evaluates every
  `validation_freq_within_epoch` steps)."""
  every = max(1, per_epoch // evals_per_epoch)
  return [(first, min(every, total_steps - first)) for first in range(0, total_steps, every)]


def epoch_fraction(steps, per_epoch) -> float:
  """Epochs trained after `steps`, as a fraction logged in epoch_num (4 decimals)."""
  return round(steps / per_epoch, 4)


def steps_per_epoch(train_examples: int, global_batch_size: int) -> int:
  """Steps that cover one epoch (the last batch of an epoch spills into the next): the one
  place it is computed (the driver's blocks and the optimizers' schedules read it)."""
  return math.ceil(train_examples / global_batch_size)


def budget_steps(train, per_epoch) -> int:
  """Training steps the budget allows (max_samples for a sample schedule, else max_epochs; a
  listed schedule ends at its last listed epoch if that comes first)."""
  gbs = train.global_batch_size
  if kind(train) == EVERY_SAMPLES:
    return math.ceil(train.max_samples / gbs)
  epochs = train.max_epochs
  if kind(train) == AT_EPOCHS:
    epochs = min(epochs, max(train.eval_at_epochs))
  return math.ceil(epochs * per_epoch)


def plan(train, per_epoch, max_steps):
  """[(end_step, first, count)]: the global step after which each eval runs (capped by
  max_steps), and the block's first_epoch_num / epoch_count in the schedule's unit (samples for
  a sample schedule, where MLPerf BERT logs epoch_num = samples)."""
  gbs = train.global_batch_size
  if kind(train) == EVERY_SAMPLES:
    return [(min(first + count, max_steps), first * gbs, count * gbs)
            for first, count in sample_blocks(train.max_samples, train.eval_every_samples, gbs)]
  if kind(train) == PER_EPOCH:
    total = budget_steps(train, per_epoch)
    return [(min(first + count, max_steps), epoch_fraction(first, per_epoch),
             epoch_fraction(count, per_epoch))
            for first, count in fraction_blocks(total, per_epoch, train.evals_per_epoch)]
  if kind(train) == AT_EPOCHS:
    blocks = at_epoch_blocks(train.eval_at_epochs, train.max_epochs)
  else:
    blocks = epoch_blocks(train.max_epochs, train.eval_every_epochs, train.eval_offset_epochs)
  return [(min(math.ceil((first + count) * per_epoch), max_steps), first, count)
          for first, count in blocks]


def apply_rules(train, eval_rules: dict):
  """Sets train's epoch schedule from a rules file's `eval:` section (unit epochs: `every`
  [+ offset 0], `every` below 1 (evals an epoch: 1 / every), or `at_epochs`). Sample schedules are formulas of the batch: the workload's
  spec.derive computes them."""
  if eval_rules.get("unit") != "epochs":
    return train
  if "at_epochs" in eval_rules:
    train.eval_at_epochs = tuple(float(e) for e in eval_rules["at_epochs"])
    train.max_epochs = max(train.eval_at_epochs)
  elif float(eval_rules["every"]) < 1:
    train.evals_per_epoch = round(1 / float(eval_rules["every"]))
  else:
    train.eval_every_epochs = int(eval_rules["every"])
    train.eval_offset_epochs = 0
  return train


def describe(train) -> str:
  """One line for `describe` and the run's first print."""
  k = kind(train)
  if k == EVERY_SAMPLES:
    return (f"eval every {train.eval_every_samples:,} samples, budget "
            f"{train.max_samples:,} samples")
  if k == PER_EPOCH:
    return (f"eval {train.evals_per_epoch} times an epoch, budget {train.max_epochs:g} epochs")
  if k == AT_EPOCHS:
    return (f"eval at epochs {', '.join(f'{e:g}' for e in train.eval_at_epochs)}, budget "
            f"{train.max_epochs:g} epochs")
  offset = f" (first after {train.eval_every_epochs - train.eval_offset_epochs})" if \
      train.eval_offset_epochs else ""
  return (f"eval every {train.eval_every_epochs} epochs{offset}, budget "
          f"{train.max_epochs:g} epochs")
