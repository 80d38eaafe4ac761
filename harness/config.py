"""Typed configs, presets and `--set a.b=value` overrides.

A workload's config is a tree of dataclasses (see workloads/*/spec.py). Overrides are parsed
with the declared field type, so `--set train.global_batch_size=abc` fails with a message
that names the key, the value and the expected type, before anything runs.
"""
import dataclasses
import typing
from typing import Any

from harness.errors import UsageError

FRAMEWORKS = ("jax", "tf")
PRESETS = ("mini", "reference", "synthetic")
PRECISIONS = ("float32", "bfloat16")


@dataclasses.dataclass
class TrainConfig:
  """The timed loop's settings, common to every workload."""
  global_batch_size: int = 32
  max_epochs: float = 40.0            # budget: run_stop(aborted) when spent without the target
  eval_every_epochs: int = 4          # MLPerf cadence (rules/<benchmark>.yaml)
  eval_offset_epochs: int = 0         # first eval after eval_every - offset epochs (MLPerf allows it)
  target: float = 0.759               # quality target on the workload's metric
  precision: str = "float32"          # float32 | bfloat16 (mixed: bf16 compute, f32 params)
  synthetic_steps: int = 100          # steps of a synthetic (throughput-only) run
  steps_per_loop: int = 0             # 0: one loop per eval block; >0: progress every N steps
  jit_compile: bool = True            # TF: XLA-compile the steps (JAX always compiles)
  # Sample-based cadence (MLPerf BERT): when eval_every_samples > 0 the driver evaluates every
  # that many training samples (rounded up to whole batches), logs epoch_num = samples trained,
  # and max_samples replaces max_epochs as the budget.
  eval_every_samples: int = 0
  max_samples: int = 0

  def validate(self):
    _positive(self, "global_batch_size", "max_epochs", "eval_every_epochs", "synthetic_steps")
    _check_range("train.eval_offset_epochs", self.eval_offset_epochs, 0, self.eval_every_epochs - 1)
    _check_range("train.steps_per_loop", self.steps_per_loop, 0, None)
    _check_range("train.eval_every_samples", self.eval_every_samples, 0, None)
    _check_range("train.max_samples", self.max_samples, 0, None)
    if self.eval_every_samples and not self.max_samples:
      raise UsageError(f"train.eval_every_samples={self.eval_every_samples} needs a sample "
                       "budget; allowed: train.max_samples > 0")
    _check_choice("train.precision", self.precision, PRECISIONS)
    if not 0.0 < self.target < 1.0:
      raise UsageError(f"train.target={self.target!r} is out of range; allowed: 0 < target < 1")


@dataclasses.dataclass
class OptimizerConfig:
  """LARS / SGD+momentum with linear warmup then polynomial decay (MLPerf ResNet)."""
  name: str = "lars"                  # lars | sgd
  base_learning_rate: float = 10.0
  warmup_epochs: float = 5.0
  end_learning_rate: float = 1e-4
  decay_poly_power: float = 2.0
  weight_decay: float = 2e-4
  momentum: float = 0.9
  lars_eta: float = 0.001             # trust coefficient
  lars_epsilon: float = 0.0
  label_smoothing: float = 0.1

  def summary(self) -> str:
    return (f"{self.name} (base lr {self.base_learning_rate}, warmup {self.warmup_epochs} "
            f"epochs, weight decay {self.weight_decay}, momentum {self.momentum})")

  def validate(self):
    _check_choice("optimizer.name", self.name, ("lars", "sgd"))
    _positive(self, "base_learning_rate")
    for key in ("warmup_epochs", "end_learning_rate", "weight_decay", "lars_epsilon"):
      _check_range(f"optimizer.{key}", getattr(self, key), 0.0, None)
    _check_range("optimizer.momentum", self.momentum, 0.0, 1.0)
    _check_range("optimizer.label_smoothing", self.label_smoothing, 0.0, 1.0)
    _positive(self, "lars_eta", "decay_poly_power")


MESH_AXES = ("data", "spatial")


@dataclasses.dataclass
class ParallelConfig:
  """How a run spreads over devices and hosts; every framework runtime reads the same keys."""
  mesh: str = ""                      # "data=8" or "data=4,spatial=2"; "": all devices on data
  bn_group_size: int = 0              # data replicas pooling batch-norm statistics; 0: all
  weight_update_sharding: bool = False   # optimizer state + update sharded over data replicas
  spatial_partitions: int = 1         # shorthand for the mesh's spatial axis (image height)
  coordinator: str = ""               # HOST:PORT of process 0, for multi-host runs
  num_processes: int = 1
  process_id: int = 0
  heartbeat_timeout_s: int = 30       # a peer silent this long ends the run with an error

  def axes(self) -> dict[str, int]:
    """{'data': d, 'spatial': s} from `mesh` and `spatial_partitions` (d = 0: all devices)."""
    axes = {"data": 0, "spatial": self.spatial_partitions}
    for item in filter(None, (part.strip() for part in self.mesh.split(","))):
      name, sep, size = item.partition("=")
      if not sep or name.strip() not in MESH_AXES or not size.strip().isdigit() or int(size) < 1:
        raise UsageError(f"--mesh {self.mesh!r}: bad axis {item!r}; allowed: NAME=SIZE with "
                         f"NAME in {', '.join(MESH_AXES)}, e.g. data=4,spatial=2")
      axes[name.strip()] = int(size)
    if "spatial=" in self.mesh and self.spatial_partitions not in (1, axes["spatial"]):
      raise UsageError(f"--spatial-partitions {self.spatial_partitions} contradicts --mesh "
                       f"{self.mesh!r}; allowed: the same spatial size or only one of them")
    return axes

  def validate(self):
    axes = self.axes()
    _check_range("parallel.bn_group_size", self.bn_group_size, 0, None)
    _check_range("parallel.spatial_partitions", self.spatial_partitions, 1, None)
    _check_range("parallel.num_processes", self.num_processes, 1, None)
    _check_range("parallel.process_id", self.process_id, 0, self.num_processes - 1)
    _check_range("parallel.heartbeat_timeout_s", self.heartbeat_timeout_s, 1, None)
    data = axes["data"]
    if data and self.bn_group_size and data % self.bn_group_size:
      raise UsageError(f"--bn-group-size {self.bn_group_size} does not divide the data axis "
                       f"({data}); allowed: a divisor of {data}")
    if self.num_processes > 1:
      host, sep, port = self.coordinator.rpartition(":")
      if not sep or not host or not port.isdigit():
        raise UsageError(f"--coordinator {self.coordinator!r}: a multi-host run needs "
                         "HOST:PORT of process 0, e.g. 127.0.0.1:12345")


def mesh_shape(parallel: ParallelConfig, available: int) -> tuple[int, int, int]:
  """(data, spatial, bn_group_size) of a run on `available` devices, the same for every
  framework runtime; ValueError (the CLI's one-line error) when they do not fit."""
  axes = parallel.axes()
  spatial = axes["spatial"]
  data = axes["data"] or available // spatial
  if data * spatial > available or data < 1:
    raise ValueError(f"--mesh data={axes['data'] or data},spatial={spatial} needs "
                     f"{max(data, 1) * spatial} devices; {available} available")
  group = parallel.bn_group_size or data
  if data % group:
    raise ValueError(f"--bn-group-size {group} does not divide the data axis ({data})")
  if spatial > 1 and group != data:
    raise ValueError("--bn-group-size with --spatial-partitions > 1: grouped batch norm runs "
                     "only without spatial partitioning")
  return data, spatial, group


def check_parallel_fits(parallel: ParallelConfig, global_batch_size: int, image_size=None):
  """The checks that need the workload: batch and image divisibility (before anything runs)."""
  axes = parallel.axes()
  data, spatial = axes["data"], axes["spatial"]
  if data and global_batch_size % data:
    raise UsageError(f"train.global_batch_size={global_batch_size} is not divisible by the "
                     f"data axis ({data}); allowed: a multiple of {data}")
  if global_batch_size % parallel.num_processes:
    raise UsageError(f"train.global_batch_size={global_batch_size} is not divisible by "
                     f"--num-processes {parallel.num_processes}")
  if spatial > 1 and image_size is not None and image_size % spatial:
    raise UsageError(f"--spatial-partitions {spatial} does not divide the image height "
                     f"{image_size}; allowed: a divisor of {image_size}")
  if spatial > 1 and parallel.bn_group_size and parallel.bn_group_size != data:
    raise UsageError("--bn-group-size with --spatial-partitions > 1: grouped batch norm runs "
                     "only without spatial partitioning; allowed: --bn-group-size 0 (all)")


def _positive(obj, *names):
  section = type(obj).__name__.replace("Config", "").lower()
  for name in names:
    value = getattr(obj, name)
    if not value > 0:
      raise UsageError(f"{section}.{name}={value!r} is out of range; allowed: a number > 0")


def _check_range(key, value, low, high):
  if (low is not None and value < low) or (high is not None and value > high):
    bounds = f"{low} <= value" + (f" <= {high}" if high is not None else "")
    raise UsageError(f"{key}={value!r} is out of range; allowed: {bounds}")


def _check_choice(key, value, allowed):
  if value not in allowed:
    raise UsageError(f"{key}={value!r} is not allowed; choose one of: {', '.join(allowed)}")


def validate_tree(cfg):
  """Calls validate() on every dataclass in the tree that has one."""
  for field in dataclasses.fields(cfg):
    value = getattr(cfg, field.name)
    if dataclasses.is_dataclass(value):
      validate_tree(value)
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


def apply_overrides(cfg, overrides: list[str]):
  """Applies `a.b=value` strings to a dataclass tree, in place; returns cfg."""
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
  validate_tree(cfg)
  return cfg
