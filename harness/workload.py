"""The framework-neutral description of a workload (AlgoPerf's workload base, minus tensors).

A spec names the MLPerf benchmark, the metric, the presets, and where each framework's trainer
lives; the trainer module is imported only when a run asks for that framework.
"""
import dataclasses
import importlib
from typing import Any, Callable, Protocol

from harness.config import FRAMEWORKS
from harness.errors import UsageError


@dataclasses.dataclass
class RunContext:
  """What a trainer needs to know about this run beyond its config."""
  seed: int
  preset: str
  data_dir: str | None = None
  synthetic_steps: int = 0
  process_index: int = 0
  process_count: int = 1


class Trainer(Protocol):
  """One per workload x framework. The driver owns time and logging; a trainer owns tensors."""
  num_devices: int
  data_replicas: int             # devices on the data axis (for model_bn_span)
  mesh_description: str          # e.g. "data=4,spatial=2", for the result row
  device_kind: str
  train_examples: int            # one epoch
  eval_examples: int

  def init(self) -> None:
    """Builds the model and optimizer state and compiles the steps. Reads no data."""

  def train(self, num_steps: int) -> dict:
    """Runs num_steps steps; one host sync at the end; returns {'loss': float, 'lr': float}."""

  def evaluate(self) -> dict:
    """The quality metric over the whole eval split: {'accuracy': float, 'count': int}."""

  def describe(self) -> dict:
    """{'parameters': int, 'train_flops_per_example': float, 'optimizer_state_bytes_per_device':
    int, 'collectives_in_train_step': {kind: count}} from the step program; may be called
    before init (it builds what it needs)."""


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
  name: str                                  # what users type: resnet50
  mlperf_benchmark: str                      # submission_benchmark and rules/<name>.yaml
  title: str
  metric_name: str
  presets: dict[str, Callable[[], Any]]      # preset -> config tree (dataclasses)
  trainer_modules: dict[str, str]            # framework -> module with make_trainer(cfg, ctx)
  mllog_hyperparameters: Callable[[Any, int], dict]   # (cfg, train_examples) -> {key: value}
  bn_span: Callable[[Any, int], int] | None = None    # (cfg, num_devices) -> model_bn_span
  needs_data_dir: tuple[str, ...] = ("reference",)
  data_dir_contents: str = "a tensorflow-datasets data dir holding imagenet2012"

  def config(self, preset: str):
    if preset not in self.presets:
      raise UsageError(f"unknown preset {preset!r} for {self.name}; choose one of: "
                       f"{', '.join(self.presets)}")
    return self.presets[preset]()

  def make_trainer(self, framework: str, cfg, ctx: RunContext) -> Trainer:
    if framework not in self.trainer_modules:
      have = ", ".join(self.trainer_modules) or "none"
      raise UsageError(f"framework {framework!r} is not implemented for {self.name}; "
                       f"available: {have} (known frameworks: {', '.join(FRAMEWORKS)})")
    module = importlib.import_module(self.trainer_modules[framework])
    return module.make_trainer(cfg, ctx)


