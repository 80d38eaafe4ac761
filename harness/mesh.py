"""Named mesh axes, declared once for every framework (docs/architecture.md).

A run's devices form a mesh with named axes: `data` (data-parallel replicas, split into groups
of `bn_group_size` for batch norm), `model` (tensor/Mesh-TF model parallelism), `stage`
(pipeline stages), `expert` (MoE experts) and `spatial` (image rows). `--mesh data=2,model=4`
gives their sizes. Tensors never name mesh axes: they carry *logical* axis names (batch, embed,
heads, height, ...), and one rule table (t5x / flax `logical_axis_rules`; Mesh-TF's
"batch:data;d_ff:model;heads:model;vocab:model") maps those to mesh axes. Each workload maps its
parameter paths to logical names in one table (its spec's `param_axes`), read by both
frameworks. Layouts change speed, never results: every layout is tested equal to one device.

Everything here is plain Python, so the fit check runs before TensorFlow or JAX is imported.
"""
import dataclasses
import math
import re
from typing import Callable

from harness import pipeline
from harness.cluster import SOURCES as CLUSTER_SOURCES
from harness.errors import UsageError

AXES = ("data", "model", "stage", "expert", "spatial")

# Logical tensor dimension -> mesh axis, or mesh axes jointly (a tuple, major first), or None
# (never split). First match wins, and a mesh axis splits at most one dimension of a tensor: a
# later dimension mapping to a used axis stays whole on it (of a tuple, the unused axes split
# it). The batch is split over data and expert together (GShard / Switch: the layers around
# the experts are data parallel over every device); the experts' inputs [experts, groups, ...]
# are split over expert by 'experts', and over what is left of 'batch' (data) by the groups.
LOGICAL_AXIS_RULES = (
    ("batch", ("data", "expert")),
    ("height", "spatial"),
    ("width", None),
    ("channels", None),          # conv feature maps
    ("conv_in", None), ("conv_out", None), ("kernel_h", None), ("kernel_w", None),
    ("length", None),            # sequence positions
    # the residual stream's positions under parallel.sequence_parallel (Megatron-LM's sequence
    # parallelism, MaxText's activation_length): split over model between the split matmuls
    ("residual_length", "model"),
    ("embed", None),             # d_model
    ("mlp", "model"),            # d_ff
    ("heads", "model"),
    ("kv", None),                # per-head dimension
    ("vocab", "model"),
    ("classes", None),
    ("experts", "expert"),
    ("routes", None),            # the router's output: one logit per expert, whole
    ("stages", "stage"),
)
LOGICAL_AXES = tuple(name for name, _ in LOGICAL_AXIS_RULES)

# The mesh axes each framework runtime executes (workloads/parallel/*_runtime.py check that
# they agree).
RUNTIME_AXES = {"jax": ("data", "model", "stage", "expert", "spatial"),
                "tf": ("data", "model", "stage", "expert", "spatial")}

# Device order on the mesh, major to minor: device (or TF replica) r has coordinates
# r = (((data * stage + s) * expert + e) * model + m) * spatial + j. Spatial slabs of one image
# are neighbours, then the model shards of one replica (Mesh-TF and MaxText put the
# most-communicating axis innermost, on the fastest links); data is outermost.
MESH_ORDER = ("data", "stage", "expert", "model", "spatial")

# What each repeated block of a JAX model keeps for its backward pass (parallel.remat_policy;
# workloads/parallel/jax_layers.py applies them): '' everything (no recomputation), 'full'
# only the block's input, 'matmuls' the matmul and convolution outputs.
REMAT_POLICIES = ("", "full", "matmuls")


@dataclasses.dataclass
class ParallelConfig:
  """How a run spreads over devices and hosts; every framework runtime reads the same keys."""
  mesh: str = ""                      # "data=8", "data=4,spatial=2", "data=2,model=4"; "": all on data
  bn_group_size: int = 0              # data replicas pooling batch-norm statistics; 0: all
  bn_group_samples: int = 0           # or: groups of this many samples (arXiv 2011.00071's
                                      # distributed BN), replicas = samples / per-replica batch
  weight_update_sharding: bool = False   # optimizer state + update sharded over data replicas
  spatial_partitions: int = 1         # shorthand for the mesh's spatial axis (image height)
  coordinator: str = ""               # HOST:PORT of process 0, for multi-host runs
  num_processes: int = 1
  process_id: int = 0
  cluster: str = ""                   # how the processes were found (harness/cluster.py):
                                      # set by the command line from its flags or environment
  heartbeat_timeout_s: int = 30       # a peer silent this long ends the run with an error
  microbatches: int = 1               # GPipe: micro-batches per data replica's batch
  remat: bool = False                 # GPipe: recompute each stage's forward in the backward
  remat_policy: str = ""              # JAX: what each model block keeps for the backward pass
                                      # (REMAT_POLICIES)
  stage_layers: str = ""              # GPipe: layers per stage ("5,4,4,3"); "": balanced
  sequence_parallel: bool = False     # JAX: the residual stream (norms, residual adds, dropout
                                      # sites) split over model along the sequence

  def axes(self) -> dict[str, int]:
    """{axis: size} for every named axis; data = 0 means 'all remaining devices'."""
    axes = parse_mesh(self.mesh)
    if "spatial" in axes and self.spatial_partitions not in (1, axes["spatial"]):
      raise UsageError(f"--spatial-partitions {self.spatial_partitions} contradicts --mesh "
                       f"{self.mesh!r}; allowed: the same spatial size or only one of them")
    axes.setdefault("spatial", self.spatial_partitions)
    return {name: axes.get(name, 0 if name == "data" else 1) for name in AXES}

  def validate(self):
    from harness.config import in_range, key_of  # config imports nothing from here
    self.axes()
    in_range(self, "bn_group_size", 0, None)
    in_range(self, "bn_group_samples", 0, None)
    if self.bn_group_size and self.bn_group_samples:
      raise UsageError(f"--bn-group-size {self.bn_group_size} and --bn-group-samples "
                       f"{self.bn_group_samples} both set; allowed: one of them")
    in_range(self, "spatial_partitions", 1, None)
    in_range(self, "num_processes", 1, None)
    in_range(self, "process_id", 0, self.num_processes - 1)
    in_range(self, "heartbeat_timeout_s", 1, None)
    in_range(self, "microbatches", 1, None)
    if self.remat_policy not in REMAT_POLICIES:
      raise UsageError(f"{key_of(self, 'remat_policy')}={self.remat_policy!r} is not a remat "
                       f"policy; allowed: {', '.join(repr(p) for p in REMAT_POLICIES)}")
    data = self.axes()["data"]
    if data and self.bn_group_size and data % self.bn_group_size:
      raise UsageError(f"--bn-group-size {self.bn_group_size} does not divide the data axis "
                       f"({data}); allowed: a divisor of {data}")
    if self.cluster not in ("",) + CLUSTER_SOURCES:
      raise UsageError(f"{key_of(self, 'cluster')}={self.cluster!r} is not a cluster source; "
                       f"allowed: {', '.join(CLUSTER_SOURCES)}")
    if self.num_processes > 1 and self.cluster != "slurm":   # slurm: the frameworks resolve it
      host, sep, port = self.coordinator.rpartition(":")
      if not sep or not host or not port.isdigit():
        raise UsageError(f"--coordinator {self.coordinator!r}: a multi-host run needs "
                         f"HOST:PORT of process 0 ({key_of(self, 'coordinator')}), "
                         "e.g. 127.0.0.1:12345")


def parse_mesh(text: str) -> dict[str, int]:
  """'data=2,model=4' -> {'data': 2, 'model': 4}; a one-line error for anything else."""
  axes = {}
  for item in filter(None, (part.strip() for part in text.split(","))):
    name, sep, size = (s.strip() for s in item.partition("="))
    if not sep or name not in AXES or not size.isdigit() or int(size) < 1 or name in axes:
      raise UsageError(f"--mesh {text!r}: bad axis {item!r}; allowed: NAME=SIZE with NAME in "
                       f"{', '.join(AXES)}, each once, e.g. data=4,spatial=2 or data=2,model=4")
    axes[name] = int(size)
  return axes


@dataclasses.dataclass(frozen=True)
class MeshShape:
  """The sizes of a run's mesh axes, with the batch-norm group size on the data axis."""
  data: int
  model: int = 1
  stage: int = 1
  expert: int = 1
  spatial: int = 1
  bn_group_size: int = 0             # 0 before it is resolved; then a divisor of data

  def size(self, axis) -> int:
    """The size of a mesh axis, or the product of a tuple of them (logical_to_mesh's)."""
    if isinstance(axis, tuple):
      return math.prod(getattr(self, a) for a in axis)
    return getattr(self, axis)

  @property
  def batch_shards(self) -> int:
    """Devices a batch is split over: data x expert (the rule table's 'batch')."""
    return self.data * self.expert

  @property
  def devices(self) -> int:
    return math.prod(self.size(a) for a in AXES)

  def coordinates(self, index: int) -> dict[str, int]:
    """{axis: coordinate} of device (TF: replica) `index` in MESH_ORDER."""
    coords = {}
    for axis in reversed(MESH_ORDER):
      index, coords[axis] = divmod(index, self.size(axis))
    return coords

  @property
  def description(self) -> str:
    """'data=4,spatial=2': data always, other axes when split (the result row's `mesh`)."""
    return ",".join(f"{a}={self.size(a)}" for a in AXES if a == "data" or self.size(a) > 1)


def bn_group_replicas(parallel: ParallelConfig, data: int, global_batch_size: int = 0) -> int:
  """Data replicas per batch-norm group: --bn-group-size, or --bn-group-samples over the
  per-replica batch (tensorflow/tpu EfficientNet's DistributedBatchNormalization: at least one
  replica, at most all), or all. A ValueError when that does not divide the data axis."""
  group = parallel.bn_group_size or data
  if parallel.bn_group_samples:
    if not global_batch_size:
      raise ValueError("--bn-group-samples needs the global batch size")
    per_replica = global_batch_size // data
    group = min(data, max(1, parallel.bn_group_samples // per_replica))
    if data % group:
      raise ValueError(f"--bn-group-samples {parallel.bn_group_samples} at {per_replica} "
                       f"samples per replica makes groups of {group} replicas, which does not "
                       f"divide the data axis ({data}); allowed: a multiple of {per_replica} "
                       f"whose quotient divides {data}")
  elif data % group:
    raise ValueError(f"--bn-group-size {group} does not divide the data axis ({data})")
  return group


def bn_span(parallel: ParallelConfig, data: int, global_batch_size: int) -> int:
  """Samples behind each batch-norm statistic (MLPerf's model_bn_span)."""
  return bn_group_replicas(parallel, data, global_batch_size) * global_batch_size // data


def run_bn_span(cfg, data_replicas: int) -> int:
  """WorkloadSpec.bn_span of a batch-norm model: bn_span of the run's config (group size x
  per-replica batch; all replicas: the global batch, which plain jit over a data-sharded batch
  computes)."""
  return bn_span(cfg.parallel, data_replicas, cfg.train.global_batch_size)


def mesh_shape(parallel: ParallelConfig, available: int, global_batch_size: int = 0
               ) -> MeshShape:
  """The mesh of a run on `available` devices, the same for every framework runtime; a
  ValueError (the CLI's one-line error) when it does not fit. `global_batch_size` resolves
  --bn-group-samples."""
  axes = parallel.axes()
  others = math.prod(axes[a] for a in AXES if a != "data")
  data = axes["data"] or available // others
  needed = max(data, 1) * others
  if needed > available or data < 1:
    spelled = ",".join(f"{a}={axes[a] or data}" for a in AXES if a == "data" or axes[a] > 1)
    raise ValueError(f"--mesh {spelled} needs {needed} devices; {available} available")
  group = bn_group_replicas(parallel, data, global_batch_size)
  if axes["spatial"] > 1 and group != data:
    raise ValueError("--bn-group-size with --spatial-partitions > 1: grouped batch norm runs "
                     "only without spatial partitioning")
  return MeshShape(data=data, model=axes["model"], stage=axes["stage"], expert=axes["expert"],
                   spatial=axes["spatial"], bn_group_size=group)


@dataclasses.dataclass(frozen=True)
class Refusal:
  """A combination of axes (and run settings) a framework runtime does not run, and why."""
  framework: str                               # 'jax', 'tf' or 'any'
  applies: Callable[[dict, ParallelConfig], bool]   # (axes {name: size}, parallel) -> refused
  reason: Callable[[dict], str]                 # axes -> the one-line error, what is allowed


def _stage_with(axes, *allowed):
  """The first axis beside `stage` the pipeline does not run with (those `allowed` aside)."""
  return next((a for a in ("model", "spatial", "expert") if axes[a] > 1 and a not in allowed),
              None)


# Which mesh axes combine, in which framework: the one table. check_fits refuses the first row
# that applies, in one line, before any framework loads; the runtimes check their resolved
# shape against the same rows (composition_refusal) for a config that did not come through the
# command line. What a workload adds (its layouts, its model's fit) stays in its spec's
# split_dims and check_framework; what only a started runtime knows (the replicas a worker
# holds) stays in the runtime.
COMPOSITION = (
    Refusal("any", lambda a, p: a["stage"] > 1 and _stage_with(a, "model") is not None,
            lambda a: f"--mesh stage={a['stage']} with {_stage_with(a, 'model')}="
                      f"{a[_stage_with(a, 'model')]}: the pipeline runs over stage, data and "
                      "(JAX) model only; allowed: stage=K,data=D,model=M"),
    Refusal("tf", lambda a, p: a["stage"] > 1 and a["model"] > 1,
            lambda a: f"--mesh stage={a['stage']},model={a['model']} in TF: its pipeline places "
                      "whole stages on devices; allowed: both in JAX, or one in TF"),
    Refusal("any", lambda a, p: a["stage"] > 1 and p.bn_group_size,
            lambda a: "--bn-group-size with --mesh stage: pipelined batch norm normalises each "
                      "micro-batch over the data axis; allowed: --bn-group-size 0"),
    Refusal("tf", lambda a, p: a["expert"] > 1 and (a["spatial"] > 1 or p.num_processes > 1
                                                    or p.weight_update_sharding),
            lambda a: f"--mesh expert={a['expert']} in TF: its expert axis runs on one host, "
                      "without spatial partitioning or weight-update sharding; allowed: those "
                      "in JAX, or data=D,expert=X on one TF host"),
    Refusal("tf", lambda a, p: a["model"] > 1 and a["spatial"] > 1,
            lambda a: f"--mesh model={a['model']},spatial={a['spatial']} in TF: its runtime "
                      "splits weights without spatial partitioning; allowed: both in JAX, or "
                      "one in TF"),
    Refusal("tf", lambda a, p: (a["stage"] > 1 or p.microbatches > 1) and p.num_processes > 1,
            lambda a: f"--mesh stage={a['stage']} in TF: its pipeline is one graph placed over "
                      "one host's devices; allowed: those in JAX, or one TF host"),
)


def composition_refusal(framework: str, axes: dict, parallel: ParallelConfig) -> str | None:
  """The first row of COMPOSITION refusing `axes` ({name: size}) in `framework`, in words;
  None when the runtime runs them."""
  for row in COMPOSITION:
    if row.framework in ("any", framework) and row.applies(axes, parallel):
      return row.reason(axes)
  return None


def check_runtime_axes(framework: str, shape: MeshShape, parallel: ParallelConfig,
                       supported: tuple[str, ...]):
  """ValueError when a runtime cannot run the mesh `shape`: an axis it does not run
  (`supported`, the runtime's own list) or a composition COMPOSITION refuses. The runtimes'
  check, for configs that did not come through the command line (which refused them already)."""
  unsupported = [a for a in AXES if shape.size(a) > 1 and a not in supported]
  if unsupported:
    raise ValueError(f"--mesh axis {unsupported[0]}: the {framework} runtime does not run it "
                     f"yet; allowed axes: {', '.join(supported)}")
  refused = composition_refusal(framework, {a: shape.size(a) for a in AXES}, parallel)
  if refused:
    raise ValueError(refused)


def check_workload_axes(shape: MeshShape, workload: str, workload_axes):
  """ValueError when the mesh splits an axis the workload has no dimension on (the trainers'
  check, for configs that did not come through the CLI)."""
  for axis in AXES:
    if shape.size(axis) > 1 and axis not in workload_axes:
      raise ValueError(f"--mesh axis {axis}={shape.size(axis)}: {workload} has no dimension "
                       f"laid out on it; allowed axes for {workload}: {', '.join(workload_axes)}")


def check_fits(parallel: ParallelConfig, *, framework: str, workload: str,
               workload_axes: tuple[str, ...], global_batch_size: int,
               dims: dict[str, int] | None = None, devices: int | None = None,
               layers=None):
  """The one fit check, before any framework loads: axes the runtime and the workload support,
  the device count (when known, e.g. --cpu-devices), batch divisibility by the data axis and
  the hosts, each split logical dimension (`dims`, e.g. {'height': 224}) by its axis, and
  the pipeline (`layers`: the workload's pipeline layers, None when it has none)."""
  axes = parallel.axes()
  runtime = RUNTIME_AXES[framework]
  for axis in AXES:
    if axes[axis] > 1 and axis not in runtime:
      raise UsageError(f"--mesh axis {axis}={axes[axis]}: the {framework} runtime does not "
                       f"run it yet; allowed axes: {', '.join(runtime)}")
  refused = composition_refusal(framework, axes, parallel)
  if refused:
    raise UsageError(refused)
  try:
    check_workload_axes(MeshShape(**{**axes, "data": max(axes["data"], 1)}), workload,
                        workload_axes)
  except ValueError as e:
    raise UsageError(str(e)) from None
  data, spelled = axes["data"], str(axes["data"])
  if devices is not None:
    try:
      data = mesh_shape(parallel, devices, global_batch_size).data
    except ValueError as e:
      raise UsageError(f"{e} (--cpu-devices)") from None
    if not axes["data"]:              # the default mesh: the data axis takes every device
      spelled = f"{data}: --cpu-devices {devices}"
  shards = data * axes["expert"]
  if shards and global_batch_size % shards:
    if axes["expert"] > 1:
      raise UsageError(f"train.global_batch_size={global_batch_size} is not divisible by the "
                       f"data x expert devices the batch is split over ({data} x "
                       f"{axes['expert']}); allowed: a multiple of {shards}")
    raise UsageError(f"train.global_batch_size={global_batch_size} is not divisible by the "
                     f"data axis ({spelled}); allowed: a multiple of {data}")
  if global_batch_size % parallel.num_processes:
    raise UsageError(f"train.global_batch_size={global_batch_size} is not divisible by "
                     f"--num-processes {parallel.num_processes}")
  for logical, size in (dims or {}).items():
    axis = dict(LOGICAL_AXIS_RULES)[logical]
    if axis and not size and axes[axis] > 1:
      continue                 # the config has no such dimension: the workload's check says so
    if logical == "residual_length" and not parallel.sequence_parallel:
      continue                 # the residual stream is whole on model without it
    if axis == "model" and logical not in ("heads", "residual_length"):
      continue                 # d_ff and vocab stay whole on a model axis that does not divide
    if axis and axes[axis] > 1 and size % axes[axis]:
      flag = "--spatial-partitions " if axis == "spatial" else f"--mesh {axis}="
      raise UsageError(f"{flag}{axes[axis]} does not divide the {logical} size {size}; "
                       f"allowed: a divisor of {size}")
  if parallel.sequence_parallel:
    refused = _sequence_parallel_refusal(framework, workload, axes, dims or {})
    if refused:
      raise UsageError(refused)
  if framework == "tf" and parallel.remat_policy:
    raise UsageError(f"parallel.remat_policy={parallel.remat_policy!r} in TF: block "
                     "rematerialisation is JAX's (jax.checkpoint policies); allowed: '' in TF")
  if axes["spatial"] > 1 and parallel.bn_group_size and parallel.bn_group_size != data:
    raise UsageError("--bn-group-size with --spatial-partitions > 1: grouped batch norm runs "
                     "only without spatial partitioning; allowed: --bn-group-size 0 (all)")
  pipeline.check(parallel, workload=workload, layers=layers,
                 global_batch_size=global_batch_size, data=data)


def _sequence_parallel_refusal(framework, workload, axes, dims) -> str:
  """Why parallel.sequence_parallel cannot run here, or ''."""
  if framework == "tf":
    return ("parallel.sequence_parallel=true in TF: the sequence split of the residual stream "
            "is JAX's (GSPMD layouts); allowed: false in TF")
  if "residual_length" not in dims:
    return (f"parallel.sequence_parallel=true: {workload} does not lay its residual stream out "
            "along the sequence; allowed: false")
  if axes["model"] < 2:
    return ("parallel.sequence_parallel=true splits the residual stream over the model axis, "
            "which this mesh does not have; allowed: with --mesh model=N (N > 1), or false")
  return ""


def logical_to_mesh(logical_axes, mesh: MeshShape | None = None, rules=LOGICAL_AXIS_RULES,
                    shape=None):
  """Logical names of a tensor's dimensions -> the mesh axis splitting each: a name, a tuple
  of names (split over their product, major first) or None (whole). Without `mesh`, a rule's
  tuple is returned whole (less axes already used); with `mesh`, axes of size 1 are left out
  (a tuple of one becomes its name); with `shape` too, a dimension its axes do not divide stays
  whole (BERT's 30,522-entry vocab on model=4: MaxText does the same). Unknown logical names
  are an error (a typo in a table would silently replicate)."""
  table = dict(rules)
  used, out = set(), []
  for i, name in enumerate(logical_axes):
    if name is not None and name not in table:
      raise ValueError(f"unknown logical axis {name!r}; known: {', '.join(table)}")
    rule = table.get(name) if name is not None else None
    axes = () if rule is None else rule if isinstance(rule, tuple) else (rule,)
    axes = tuple(a for a in axes if a not in used and (mesh is None or mesh.size(a) > 1))
    if axes and shape is not None and mesh is not None and shape[i] % mesh.size(axes):
      axes = ()
    used.update(axes)
    out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
  return tuple(out)


def update_layout(shape, layout, mesh: MeshShape, weight_update_sharding: bool) -> tuple:
  """Mesh axes of a parameter's optimizer state and update, from the parameter's own `layout`
  (logical_to_mesh's output). With weight-update sharding the largest dimension that is not
  already split and that the data axis divides is split over `data` too (a kernel split on
  `model` by columns is split on `data` by rows); with none, the state keeps the layout."""
  layout = list(layout)
  if weight_update_sharding and mesh.data > 1:
    dims = [i for i, n in enumerate(shape) if layout[i] is None and n % mesh.data == 0]
    if dims:
      layout[max(dims, key=lambda i: shape[i])] = "data"
  return tuple(layout)


def shard_shape(shape, layout, mesh: MeshShape) -> tuple:
  """The shape one device holds of an array of `shape` laid out as `layout`."""
  return tuple(n // (mesh.size(axis) if axis else 1) for n, axis in zip(shape, layout))


def axis_names(axis) -> tuple:
  """The mesh axes of one entry of a layout: () for None, (name,) or the tuple itself."""
  return () if axis is None else axis if isinstance(axis, tuple) else (axis,)


def param_axes(table, path: str, ndim: int) -> tuple:
  """Logical axes of the parameter at `path` ('encoder/layer_0/attention/query/kernel'): the
  first (regex, axes) of a workload's table whose regex matches the whole path."""
  for pattern, axes in table:
    if re.fullmatch(pattern, path):
      if len(axes) != ndim:
        raise ValueError(f"parameter {path}: table entry {pattern!r} names {len(axes)} axes "
                         f"for a {ndim}-d array")
      return tuple(axes)
  raise ValueError(f"parameter {path} matches no entry of the workload's param_axes table")
