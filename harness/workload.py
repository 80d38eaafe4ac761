"""The framework-neutral description of a workload (AlgoPerf's workload base, minus tensors).

A spec names the MLPerf benchmark, the metric, the presets, and where each framework's trainer
lives; the trainer module is imported only when a run asks for that framework.
"""
import abc
import dataclasses
import importlib
import importlib.util
from typing import Any, Callable, Protocol

import numpy as np

from harness.config import FRAMEWORKS, apply_overrides, validate_tree
from harness.errors import UsageError


def is_synthetic(cfg) -> bool:
  """A throughput-only run on generated batches: the one test of it (the driver's timing and
  the trainers' data both read it), `data.source == "synthetic"`, whatever the preset."""
  return getattr(cfg.data, "source", None) == "synthetic"


@dataclasses.dataclass
class RunContext:
  """What a trainer needs to know about this run beyond its config."""
  seed: int
  preset: str
  data_dir: str | None = None
  describing: bool = False       # `describe`: a JAX layout larger than the machine is shapes only


class InputPipeline(Protocol):
  """A workload's input_pipeline.py (spec.input_pipeline), the same module for both frameworks:
  tf.data on the host, batches of numpy-convertible features named as spec.batch_layout."""

  def data_source(self, cfg, ctx: RunContext) -> tuple[str | None, int]:
    """(the folder the run reads, or None for generated data; train examples in an epoch).
    Prepares a generated (mini) set on first use."""

  def train_dataset(self, cfg, global_batch_size: int, seed: int, data_dir, process_index=0,
                    process_count=1):
    """This host's shuffled, repeated train batches (global_batch_size / process_count)."""

  def eval_dataset(self, cfg, global_batch_size: int, data_dir, process_index=0,
                   process_count=1):
    """This host's eval batches (global_batch_size / process_count), padded (feature 'mask':
    1 for real examples, 0 padding)."""

  def synthetic_batch(self, cfg, batch_size: int, seed: int) -> dict:
    """One generated batch of the real shapes and dtypes (synthetic runs, describe)."""


class Evaluator(Protocol):
  """The host side of a workload's eval (spec.evaluator(cfg, data_dir)); the device side is the
  trainer's eval_step. Three phases: each batch's outputs are added (`accumulate`: device
  arrays, or numpy on the host when `on_host`), then `finalize` turns the sum into
  {metric name: value, 'count': examples}."""
  on_host: bool

  def accumulate(self, acc, outputs): ...

  def finalize(self, acc) -> dict: ...


class CountEvaluator:
  """[hits, counted] summed over batches, on the device: top-1 and masked-LM accuracy."""
  on_host = False

  def __init__(self, metric_name: str):
    self.metric_name = metric_name

  def accumulate(self, acc, outputs):
    return outputs if acc is None else acc + outputs

  def finalize(self, acc) -> dict:
    correct, count = np.asarray(acc, np.float64)
    return {self.metric_name: float(correct / count), "count": int(round(count))}


class ContractMeta(abc.ABCMeta):
  """abc.ABCMeta, and after __init__ the attributes the class declares in `built_with` must be
  set: a trainer that misses a piece fails when it is built, naming the piece, not with an
  AttributeError after run_start (abstract methods are ABCMeta's own check)."""

  def __call__(cls, *args, **kwargs):
    obj = super().__call__(*args, **kwargs)
    for klass in reversed(cls.__mro__):     # each class's `built_with` adds to its bases'
      missing = [name for name in vars(klass).get("built_with", ()) if not hasattr(obj, name)]
      if missing:
        raise TypeError(f"{cls.__name__} was built without {', '.join(missing)}: its __init__ "
                        f"must set {'them' if len(missing) > 1 else 'it'} (declared by "
                        f"{klass.__name__}.built_with)")
    return obj


class Trainer(metaclass=ContractMeta):
  """One per workload x framework. The driver owns time and logging; a trainer owns tensors.
  Every workload's trainer derives from one of the two framework bases
  (workloads/parallel/jax_trainer_base.MeshTrainer, tf_trainer_base.StrategyTrainer), which
  implement this; the driver reads nothing else of a trainer."""
  # What the driver reads, set when the trainer is built (before init): `built_with` lists the
  # names every subclass's __init__ must set (ContractMeta checks them); a base lists its own.
  built_with = ("num_devices", "data_replicas", "mesh_description", "device_kind",
                "train_examples", "eval_examples")
  num_devices: int
  data_replicas: int             # devices on the data axis (for model_bn_span)
  mesh_description: str          # e.g. "data=4,spatial=2", for the result row
  device_kind: str
  train_examples: int            # one epoch
  eval_examples: int

  # Optional extras, with what a trainer that has none of them means.
  # Whether a step's samples vary (BERT's packed rows): the driver then plans its blocks in
  # samples and gives train() a sample count.
  variable_samples: bool = False
  # Every process's host by index (multi-process runs), for the line naming a lost peer.
  process_hosts: list | None = None

  def stop_check(self) -> None:
    """Called by the trainer's own loops between two steps (and two eval batches): raises
    harness.faults.Interrupted once a signal asked the run to stop. The driver sets it to its
    signal watch's check; a signal never raises from inside a library call (XLA's dispatch,
    tf.data's iterator), only here. Default: nothing stops the run."""

  @abc.abstractmethod
  def init(self) -> None:
    """Builds the model and optimizer state and compiles the steps. Reads no data."""

  @abc.abstractmethod
  def train(self, num_steps: int | None = None, *, samples: int | None = None) -> dict:
    """Runs num_steps steps (or as many as train at least `samples` samples, at most num_steps
    where both are given); one host sync at the end; returns {'loss': float, 'lr': float,
    'step': int, 'samples': int} (and optionally 'progress', 'scalars')."""

  @abc.abstractmethod
  def evaluate(self) -> dict:
    """The quality metric over the whole eval split: {spec.metric.name: float, 'count': int}
    (three phases in the base trainers: device eval_step, host accumulate, finalize)."""

  @abc.abstractmethod
  def describe(self, pipeline: bool = True) -> "Description":
    """The model and its step as compiled (or traced) on this layout; may be called before init
    (it builds what it needs). pipeline=False leaves out GPipe's figures, whose activation
    bytes take the step compiled (or traced) the other way of re-materialization too: the
    driver reads only the FLOPs (a pipelined JAX run's init compiled its step twice)."""


@dataclasses.dataclass
class PipelineDescription:
  """GPipe's figures of a pipelined step (harness/pipeline.py), both frameworks."""
  stages: int
  microbatches: int
  iterations: int                 # of the schedule: microbatches + stages - 1
  bubble_fraction: float          # (K - 1) / (M + K - 1)
  cut: list                       # per stage: {'layers': [names], 'parameters': int}
  remat: bool                     # this run's parallel.remat
  activation_bytes_remat: int     # per device, with and without re-materialization
  activation_bytes_no_remat: int
  activation_source: str          # how the two were measured
  permute_bytes_per_step: int     # what the stage shifts move per device, forward and back
  shift_source: str


@dataclasses.dataclass
class Description:
  """What `describe` reports of a trainer; both frameworks' bases fill it. None: not measured
  on this layout or in this framework (`flops_missing` says why for the FLOPs)."""
  parameters: int
  parameter_bytes_per_device: int           # read from the arrays' shards / the variables
  optimizer_state_bytes_per_device: int
  # with pipeline stages that own their weights: the parameter bytes of the whole model, what
  # each device held before (beside parameter_bytes_per_device)
  parameter_bytes_without_stages: int | None = None
  # the step program's FLOPs per example: XLA's cost analysis (JAX), the traced graph's ops (TF)
  train_flops_per_example: float | None = None
  flops_missing: str = ""
  # the model's own FLOPs per example, 3 x its forward matmuls and convolutions (TF)
  model_flops_per_example: float | None = None
  activation_bytes_per_device: int | None = None     # the compiled step's temporaries (JAX)
  collectives_in_train_step: dict | None = None      # {kind: count}
  collective_bytes_in_train_step: dict | None = None  # {kind: bytes} (TF)
  # {kind: (bytes a replica sends a step as built, bytes the true collective would send)}: a
  # collective the runtime builds from another (TF's all-to-all from an all-reduce)
  emulated_collectives: dict | None = None
  # {(kind, mesh axes): (ops, tensors, bytes)} from the compiled HLO (JAX)
  collectives_by_axis: dict | None = None
  layout: dict | None = None      # {'split': {path: axes}, 'whole': {path: dims}} (JAX)
  pipeline: PipelineDescription | None = None


@dataclasses.dataclass(frozen=True)
class Metric:
  """A workload's quality metric. Targets (rules/, --set train.target) are in its own units;
  MLPerf logs `eval_accuracy` as value * log_scale (BLEU 25.0 is logged as 0.25)."""
  name: str                       # the key evaluate() returns: top1_accuracy, bleu, box_map
  units: str                      # how a user reads it: "fraction", "BLEU points"
  low: float = 0.0                # a target must lie in (low, high): MLPerf's checker wants
  high: float = 1.0               # eval_accuracy < 1.0, so a fraction's target is below 1
  log_scale: float = 1.0
  higher_is_better: bool = True
  # What evaluate()'s 'count' counts: each eval example once, or (BERT's masked-LM accuracy)
  # the units the metric averages over.
  counts: str = "examples"

  def check_target(self, target: float, key: str = "train.target"):
    if not self.low < target < self.high:
      raise UsageError(f"{key}={target!r} is out of range for {self.name} ({self.units}); "
                       f"allowed: {self.low:g} < target < {self.high:g}")

  def reached(self, value: float, target: float) -> bool:
    return value >= target if self.higher_is_better else value <= target

  def logged(self, value: float) -> float:
    return value * self.log_scale


TOP1 = Metric("top1_accuracy", "fraction")


def by_name(*presets: Callable[[], Any]) -> dict[str, Callable[[], Any]]:
  """A spec's presets, each named by its function's name (the name given once)."""
  return {preset.__name__: preset for preset in presets}


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
  name: str                                  # what users type: resnet50
  # submission_benchmark and rules/<benchmark>.yaml; "": the name (most workloads are named so)
  mlperf_benchmark: str = ""
  title: str
  metric: Metric
  presets: dict[str, Callable[[], Any]]      # preset -> config tree (dataclasses): by_name(...)
  # The workload's folder as a package (its spec's __package__: workloads.<w>): by convention it
  # holds <framework>_trainer.py (make_trainer(cfg, ctx)) for each of `frameworks` and
  # input_pipeline.py (its InputPipeline), so the spec names no module by hand.
  package: str
  # (cfg, train_examples) -> {key: value or (value, {metadata})}, e.g. MLPerf Transformer's
  # max_sequence_length with metadata {'method': 'discard'}
  mllog_hyperparameters: Callable[[Any, int], dict]
  # (cfg, batch_size, with_mask) -> {feature: (shape, dtype, logical axes)}: a batch as the
  # input pipeline yields it (eval batches add 'mask'); each framework's trainer base turns it
  # into its own specs (jax.ShapeDtypeStruct laid out on the mesh, tf.TensorSpec) and compiles
  # before any data
  batch_layout: Callable[[Any, int, bool], dict]
  bn_span: Callable[[Any, int], int] | None = None    # (cfg, num_devices) -> model_bn_span
  # Hyperparameters that follow from others (eval interval from the batch, decay steps from
  # the sample budget): filled in place after --set, only where the config leaves them 0.
  derive: Callable[[Any], None] | None = None
  # Mesh axes the model has logical dimensions on, and the sizes of the logical dimensions a
  # mesh axis may split ({'height': 224}), for the fit check before any framework loads.
  mesh_axes: tuple[str, ...] = ("data",)
  split_dims: Callable[[Any], dict] = lambda cfg: {}
  param_axes: tuple = ()                     # ((path regex, logical axes), ...) every parameter
  # cfg -> the names of the layers a GPipe pipeline cuts into stages (harness/pipeline.py);
  # None: the workload does not pipeline.
  pipeline_layers: Callable[[Any], list[str]] | None = None
  needs_data_dir: tuple[str, ...] = ("reference",)
  data_dir_contents: str = "a tensorflow-datasets data dir holding imagenet2012"
  # (cfg, data_dir) -> what the run would read but the folder lacks (paths or patterns);
  # checked before any framework loads, so a wrong folder is one line, not a traceback.
  missing_data: Callable[[Any, str], list[str]] = lambda cfg, data_dir: []
  # (cfg, framework) -> None or ValueError: a framework's own limits on the config, checked
  # before it loads (its start-up output would bury the one-line error).
  check_framework: Callable[[Any, str], None] = lambda cfg, framework: None
  # cfg -> what a sample is where it is not one example ('packed rows'): global_batch_size's
  # metadata in the log, since MLPerf logs count whatever the submission batches.
  sample_unit: Callable[[Any], str] | None = None
  # (cfg, total parameters) -> [(label, text)]: describe's lines of the workload's own
  # (an MoE Transformer's experts: parameters, compute per token, all-to-all bytes)
  describe_lines: Callable[[Any, int], list] = lambda cfg, parameters: []
  # (cfg, chips) -> (bytes one chip sends into one all-to-all of the step, what they are), or
  # None: `simulate --workload W --collective all-to-all` (an MoE layer's dispatch)
  all_to_all_bytes: Callable[[Any, int], tuple | None] = lambda cfg, chips: None
  # "module.Class" in the workload's folder: the Evaluator of the eval's host side, built as
  # Class(cfg, data_dir, metric_name, pipeline) when a trainer evaluates (its module, with what
  # it imports, e.g. pycocotools, loaded then), `pipeline()` the workload's InputPipeline (its
  # reference data, e.g. SSD's ground truth, comes from there, so an evaluator imports no
  # pipeline); None: CountEvaluator (the device eval step returns [hits, counted])
  host_evaluator: str | None = None
  frameworks: tuple[str, ...] = FRAMEWORKS    # those with a <framework>_trainer.py

  def __post_init__(self):
    if not self.mlperf_benchmark:
      object.__setattr__(self, "mlperf_benchmark", self.name)

  @property
  def trainer_modules(self) -> dict[str, str]:
    """framework -> the module whose make_trainer(cfg, ctx) builds its trainer."""
    return {framework: f"{self.package}.{framework}_trainer" for framework in self.frameworks}

  @property
  def input_pipeline_module(self) -> str:
    return f"{self.package}.input_pipeline"

  @property
  def metric_name(self) -> str:
    return self.metric.name

  def own_module(self, name: str) -> str | None:
    """The dotted name of module `name` in the workload's own folder (the input pipeline's),
    or None where the folder has none: what a tool finds of a workload by convention (e.g.
    bench/gpu_models.py its `bare_step`), so that no list outside the folder names workloads.
    Nothing is imported but the folder's package."""
    module = f"{self.package}.{name}"
    return module if importlib.util.find_spec(module) is not None else None

  @property
  def input_pipeline(self) -> InputPipeline:
    return importlib.import_module(self.input_pipeline_module)

  def evaluator(self, cfg, data_dir) -> Evaluator:
    if self.host_evaluator is None:
      return CountEvaluator(self.metric.name)
    module, _, name = self.host_evaluator.rpartition(".")
    evaluator = getattr(importlib.import_module(f"{self.package}.{module}"), name)
    return evaluator(cfg, data_dir, self.metric.name, lambda: self.input_pipeline)

  def config(self, preset: str):
    if preset not in self.presets:
      raise UsageError(f"unknown preset {preset!r} for {self.name}; choose one of: "
                       f"{', '.join(self.presets)}")
    return self.presets[preset]()

  def configure(self, preset: str, overrides=()):
    """The run's config: the preset, then --set overrides, then the derived values, then
    validation (every key, and the target in the metric's units)."""
    cfg = self.config(preset)
    apply_overrides(cfg, list(overrides))
    if self.derive is not None:
      self.derive(cfg)
      validate_tree(cfg)
    self.metric.check_target(cfg.train.target)
    return cfg

  def make_trainer(self, framework: str, cfg, ctx: RunContext) -> Trainer:
    if framework not in self.trainer_modules:
      have = ", ".join(self.trainer_modules) or "none"
      raise UsageError(f"framework {framework!r} is not implemented for {self.name}; "
                       f"available: {have} (known frameworks: {', '.join(FRAMEWORKS)})")
    module = importlib.import_module(self.trainer_modules[framework])
    return module.make_trainer(cfg, ctx)


# The hooks a spec module may define as module-level functions named as the field: from_module
# takes them, so that a spec names each once.
HOOKS = ("mllog_hyperparameters", "batch_layout", "bn_span", "derive", "split_dims",
         "pipeline_layers", "missing_data", "check_framework", "sample_unit", "describe_lines",
         "all_to_all_bytes")


def from_module(namespace: dict) -> dict:
  """The fields a spec module supplies by convention, from its globals():
  `WorkloadSpec(..., **from_module(globals()))` takes `package` (its __package__) and every
  module-level callable named as one of HOOKS. A hook from elsewhere (a shared module's, a
  lambda) is given by keyword; a field given both ways is a TypeError (a keyword repeated)."""
  hooks = {name: namespace[name] for name in HOOKS if callable(namespace.get(name))}
  return {"package": namespace["__package__"], **hooks}
