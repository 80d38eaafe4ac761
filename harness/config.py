"""Typed configs, presets and `--set a.b=value` overrides.

A workload's config is a tree of dataclasses (see workloads/*/spec.py). Overrides are parsed
with the declared field type, so `--set train.global_batch_size=abc` fails with a message
that names the key, the value and the expected type, before anything runs.

Validators are public (`positive`, `in_range`, `one_of`) and take a config node and a field
name: the error names the dotted key the user typed (`optimizer.epsilon`), because
`validate_tree` tells every node where it sits in the tree before validating it.
"""
import dataclasses
import typing
from typing import Any

from harness.errors import UsageError

FRAMEWORKS = ("jax", "tf")
PRESETS = ("mini", "reference", "synthetic", "tiny")
PRECISIONS = ("float32", "bfloat16")


@dataclasses.dataclass
class TrainConfig:
  """The timed loop's settings, common to every workload. The eval schedule is one of three
  kinds (harness/cadence.py), the presets fill it from rules/<benchmark>.yaml."""
  # No workload's defaults here: each preset sets its batch, budget, target and cadence (the
  # reference presets from rules/<benchmark>.yaml); these only make a TrainConfig() valid.
  global_batch_size: int = 32
  max_epochs: float = 1.0             # budget: run_stop(aborted) when spent without the target
  eval_every_epochs: int = 1          # MLPerf cadence (rules/<benchmark>.yaml)
  eval_offset_epochs: int = 0         # first eval after eval_every - offset epochs (MLPerf allows it)
  eval_at_epochs: tuple[float, ...] = ()   # eval at exactly these epochs (MLPerf SSD)
  target: float = 0.0                 # quality target in the workload metric's own units (set)
  precision: str = "float32"          # float32 | bfloat16 (mixed: bf16 compute, f32 params)
  synthetic_steps: int = 100          # timed steps of a synthetic (throughput-only) run, after
                                      # driver.SYNTHETIC_WARMUP_STEPS untimed ones
  steps_per_loop: int = 0             # >0: a progress line every N steps; 0: per epoch in multi-epoch blocks
  jit_compile: bool = True            # TF: XLA-compile the steps (JAX always compiles)
  # Sample-based cadence (MLPerf BERT): when eval_every_samples > 0 the driver evaluates every
  # that many training samples (rounded up to whole batches), logs epoch_num = samples trained,
  # and max_samples replaces max_epochs as the budget. 0 in a preset whose spec derives it
  # (spec.derive) means "from the MLPerf formula for this batch size".
  eval_every_samples: int = 0
  max_samples: int = 0
  # Several evals an epoch (MLPerf DLRM-DCNv2: 20, every 0.05 epoch): eval every
  # floor(steps per epoch / evals_per_epoch) steps, epoch_num logged as the epoch fraction.
  evals_per_epoch: int = 0

  def validate(self):
    positive(self, "global_batch_size", "max_epochs", "eval_every_epochs", "synthetic_steps")
    in_range(self, "eval_offset_epochs", 0, self.eval_every_epochs - 1)
    in_range(self, "steps_per_loop", 0, None)
    in_range(self, "eval_every_samples", 0, None)
    in_range(self, "max_samples", 0, None)
    in_range(self, "evals_per_epoch", 0, None)
    if self.evals_per_epoch and (self.eval_every_samples or self.eval_at_epochs):
      raise UsageError(f"{key_of(self, 'evals_per_epoch')}={self.evals_per_epoch} and another "
                       "eval schedule are both set; allowed: one eval schedule")
    if self.eval_every_samples and not self.max_samples:
      raise UsageError(f"{key_of(self, 'eval_every_samples')}={self.eval_every_samples} needs a "
                       f"sample budget; allowed: {key_of(self, 'max_samples')} > 0")
    at = self.eval_at_epochs
    if at and (min(at) <= 0 or list(at) != sorted(set(at))):
      raise UsageError(f"{key_of(self, 'eval_at_epochs')}={at!r} is not allowed; allowed: "
                       "increasing epochs > 0, e.g. 40,50,55")
    if at and self.eval_every_samples:
      raise UsageError(f"{key_of(self, 'eval_at_epochs')} and {key_of(self, 'eval_every_samples')}"
                       " are both set; allowed: one eval schedule")
    one_of(self, "precision", PRECISIONS)


def as_synthetic(cfg, global_batch_size: int):
  """A `synthetic` preset from the `reference` one: the same model and recipe on generated
  batches (`data.source = "synthetic"`, what harness.workload.is_synthetic tests), at a batch
  one machine holds; returns cfg."""
  cfg.data.source = "synthetic"
  cfg.train.global_batch_size = global_batch_size
  return cfg


# ----------------------------------------------------------------------------- validators

def key_of(cfg, field: str) -> str:
  """The dotted key of `field` as the user types it (`optimizer.epsilon`)."""
  path = cfg.__dict__.get("_key_prefix")
  if path is None:                  # validated outside a tree: the section's conventional name
    path = type(cfg).__name__.replace("Config", "").lower() + "."
  return path + field


def positive(cfg, *fields):
  for field in fields:
    value = getattr(cfg, field)
    if not value > 0:
      raise UsageError(f"{key_of(cfg, field)}={value!r} is out of range; allowed: a number > 0")


def in_range(cfg, field, low, high):
  value = getattr(cfg, field)
  if (low is not None and value < low) or (high is not None and value > high):
    bounds = f"{low} <= value" + (f" <= {high}" if high is not None else "")
    raise UsageError(f"{key_of(cfg, field)}={value!r} is out of range; allowed: {bounds}")


def one_of(cfg, field, allowed):
  value = getattr(cfg, field)
  if value not in allowed:
    raise UsageError(f"{key_of(cfg, field)}={value!r} is not allowed; choose one of: "
                     f"{', '.join(map(str, allowed))}")


def validate_tree(cfg, prefix=""):
  """Calls validate() on every dataclass in the tree that has one, children first; each node
  learns its dotted prefix first, so its errors name the key the user typed."""
  cfg.__dict__["_key_prefix"] = prefix
  for field in dataclasses.fields(cfg):
    value = getattr(cfg, field.name)
    if dataclasses.is_dataclass(value):
      validate_tree(value, f"{prefix}{field.name}.")
  if hasattr(cfg, "validate"):
    cfg.validate()


def flatten(cfg, prefix="") -> dict[str, Any]:
  """{'train.global_batch_size': 32, ...}: for logs, `describe`, and the error messages."""
  out = {}
  for field in dataclasses.fields(cfg):
    value = getattr(cfg, field.name)
    if dataclasses.is_dataclass(value):
      out.update(flatten(value, f"{prefix}{field.name}."))
    else:
      out[f"{prefix}{field.name}"] = value
  return out


def _parse_value(key: str, text: str, kind):
  origin = typing.get_origin(kind)
  if origin is tuple:
    (item_kind, *_) = typing.get_args(kind)
    items = [t for t in text.replace("(", "").replace(")", "").split(",") if t.strip()]
    return tuple(_parse_value(key, t.strip(), item_kind) for t in items)
  if kind is bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
      return True
    if lowered in ("0", "false", "no", "off"):
      return False
    raise UsageError(f"--set {key}={text!r}: not a bool; allowed: true or false")
  try:
    return kind(text)
  except (TypeError, ValueError):
    raise UsageError(f"--set {key}={text!r}: not a valid {kind.__name__}") from None


def apply_overrides(cfg, overrides: list[str], validate: bool = True):
  """Applies `a.b=value` strings to a dataclass tree, in place, and validates it; returns cfg.
  (WorkloadSpec.configure also derives the dependent values: use that for a run's config.)"""
  allowed = sorted(flatten(cfg))
  for item in overrides:
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
      raise UsageError(f"--set {item!r}: expected KEY=VALUE, e.g. train.global_batch_size=64")
    path = key.split(".")
    target = cfg
    for part in path[:-1]:
      if not (dataclasses.is_dataclass(target) and hasattr(target, part)):
        target = None
        break
      target = getattr(target, part)
    leaf = path[-1]
    if (target is None or not dataclasses.is_dataclass(target) or leaf not in
        {f.name for f in dataclasses.fields(target)} or dataclasses.is_dataclass(getattr(target, leaf))):
      raise UsageError(f"--set {key}: no such key; allowed: {', '.join(allowed)}")
    hints = typing.get_type_hints(type(target))
    setattr(target, leaf, _parse_value(key, text, hints[leaf]))
  if validate:
    validate_tree(cfg)
  return cfg
