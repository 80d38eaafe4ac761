"""The JAX distributed runtime: one jax.sharding.Mesh for any workload (docs/architecture.md).

Every named axis of harness/mesh.py is an axis of the mesh, in its MESH_ORDER, with the data
axis split into groups of `bn_group_size` ('replica' x 'bn') so batch-norm statistics can be
pooled over a sub-axis (PLATFORM_NOTES: axis_index_groups does not work under shard_map):
('replica', 'bn', 'stage', 'expert', 'model', 'spatial'), unused axes of size 1. Arrays are laid
out from their logical axis names through harness.mesh's one rule table: a batch's 'batch'
dimension over DATA, an image's 'height' over 'spatial' (XLA inserts the halo exchange), a
kernel's 'heads' / 'mlp' / 'vocab' over 'model' (Mesh-TF; GSPMD inserts the all-reduces of
the attention and feed-forward outputs). A dimension its axis does not divide stays whole.

The runtime owns the layouts: `state_shardings` places each parameter by the workload's
PARAM_AXES, the optimizer state like its parameter, and a train step ends with
`restore_param_layout`, which returns every updated parameter to its own layout. Weight-update
sharding composes with that (harness.mesh.update_layout): the optimizer state and the update
of a tensor are split over DATA along a dimension the parameter does not already split; the new
weights are all-gathered over DATA only (ZeRO-1). Norms over a sharded tensor (LAMB/LARS trust
ratios) are whole-tensor norms: GSPMD sums the shards' squares.

Activations carry logical names too: a model calls `constrain(x, ('batch', 'length', 'embed'))`
at its layer boundaries, which, while a step is traced under `runtime.tracing()` on a mesh with
a model axis, is a with_sharding_constraint to that layout (and otherwise nothing).

For `describe` of a layout larger than the machine (the v0.7 Transformer's data=2048,model=4)
the runtime builds an AbstractMesh: shardings, shard shapes and bytes per device come from
shapes; nothing is placed or compiled.
"""
import collections
import contextlib
import contextvars
import math
import re
import socket

import jax
import numpy as np
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec as P

from harness import cluster as cluster_lib
from harness import mesh as mesh_lib

DATA = ("replica", "bn")
PHYSICAL = {"data": DATA, "stage": "stage", "expert": "expert", "model": "model",
            "spatial": "spatial"}                   # named mesh axis -> this mesh's axes
MESH_AXES = tuple(a for axis in mesh_lib.MESH_ORDER
                  for a in (DATA if axis == "data" else (PHYSICAL[axis],)))
SUPPORTED_AXES = ("data", "model", "stage", "expert", "spatial")   # mesh.RUNTIME_AXES['jax']
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
_TRACING = contextvars.ContextVar("jax_runtime_tracing", default=None)


def initialize_multihost(parallel):
  """jax.distributed.initialize for several processes (before any device is touched): at the
  coordinator the flags, TF_CONFIG or the Kubernetes pod gave (harness/cluster.py), or, in an
  srun step, by JAX's own SLURM detection. A peer that stops answering for
  heartbeat_timeout_s seconds ends every process with an error."""
  if parallel.num_processes == 1 or jax.distributed.is_initialized():
    return
  timeouts = dict(initialization_timeout=120, shutdown_timeout_seconds=30,
                  heartbeat_timeout_seconds=parallel.heartbeat_timeout_s)
  if parallel.cluster == "slurm":
    # JAX gives a task the one local GPU SLURM_LOCALID names (a task per GPU) unless told
    # otherwise: with --gpus-per-task, Slurm shows each task only its own GPUs, all of them
    # its devices. (A CPU step's devices are the host's, --cpu-devices: JAX ignores the ids.)
    found = cluster_lib.detect()
    local = list(range(found.gpus_per_task)) if found.gpus_per_task else None
    jax.distributed.initialize(cluster_detection_method="slurm", local_device_ids=local,
                               **timeouts)
  else:
    jax.distributed.initialize(parallel.coordinator, num_processes=parallel.num_processes,
                               process_id=parallel.process_id, **timeouts)
  if (jax.process_count(), jax.process_index()) != (parallel.num_processes,
                                                    parallel.process_id):
    raise RuntimeError(f"jax.distributed found process {jax.process_index()} of "
                       f"{jax.process_count()}, the {parallel.cluster} environment said "
                       f"{parallel.process_id} of {parallel.num_processes}")


_HOSTS = []


def process_hosts(timeout_s=60):
  """Every process's host name, by index, through the coordination service's key-value store
  (a lost peer is then named by its host: harness/faults.py); None in a one-process run or
  where the store is not reachable. Asked once per process (a key is set once)."""
  if jax.process_count() == 1:
    return None
  if not _HOSTS:
    from jax._src import distributed   # pylint: disable=import-outside-toplevel  # its client
    client = getattr(distributed.global_state, "client", None)
    if client is None:
      return None
    client.key_value_set(f"harness/host/{jax.process_index()}", socket.gethostname())
    _HOSTS.extend(client.blocking_key_value_get(f"harness/host/{i}", timeout_s * 1000)
                  for i in range(jax.process_count()))
  return list(_HOSTS)


class MeshRuntime:
  def __init__(self, parallel, global_batch_size=0, describing=False):
    """`describing`: a mesh of more devices than this machine has (every axis given in --mesh)
    becomes an AbstractMesh, enough for shardings and bytes per device."""
    initialize_multihost(parallel)
    self.process_hosts = None if describing else process_hosts()
    devices = jax.devices()
    axes = parallel.axes()
    wanted = math.prod(axes.values()) if axes["data"] else 0
    self.abstract = describing and wanted > len(devices)
    self.shape = shape = mesh_lib.mesh_shape(parallel, wanted if self.abstract else len(devices),
                                             global_batch_size)
    mesh_lib.check_runtime_axes("jax", shape, parallel, SUPPORTED_AXES)
    data, group = shape.data, shape.bn_group_size
    self.parallel = parallel
    self.data, self.model, self.spatial = data, shape.model, shape.spatial
    self.stage, self.microbatches = shape.stage, parallel.microbatches
    self.expert = shape.expert
    self.bn_group_size = group
    self.grouped_bn = group < data
    self.weight_update_sharding = parallel.weight_update_sharding
    self.num_devices = shape.devices
    sizes = tuple(data // group if a == "replica" else group if a == "bn" else shape.size(a)
                  for a in MESH_AXES)
    auto = (AxisType.Auto,) * len(MESH_AXES)
    if self.abstract:
      self.mesh = AbstractMesh(sizes, MESH_AXES, axis_types=auto)
    else:
      self.mesh = jax.make_mesh(sizes, MESH_AXES, axis_types=auto,
                                devices=devices[:shape.devices])
    self.replicated = NamedSharding(self.mesh, P())
    self.process_index, self.process_count = jax.process_index(), jax.process_count()
    self.param_layouts = {}      # parameter path -> its mesh axes (state_shardings fills it)

  @property
  def description(self):
    return self.shape.description

  def _named(self, layout):
    """A layout (per dimension: None, a mesh axis or a tuple of them) on this mesh."""
    def physical(axis):
      names = tuple(p for a in mesh_lib.axis_names(axis)
                    for p in (DATA if a == "data" else (PHYSICAL[a],)))
      return names[0] if len(names) == 1 else names or None
    return NamedSharding(self.mesh, P(*(physical(a) for a in layout)))

  def sharding(self, logical_axes, shape=None):
    """The NamedSharding of an array whose dimensions have these logical names (with `shape`,
    a dimension its axis does not divide stays whole)."""
    return self._named(mesh_lib.logical_to_mesh(logical_axes, self.shape, shape=shape))

  def shard_batch(self, host_batch, logical_axes):
    """This host's slice of the global batch -> global arrays on the mesh."""
    return {k: jax.make_array_from_process_local_data(self.sharding(logical_axes[k]), v)
            for k, v in host_batch.items()}

  # ------------------------------------------------------------------ parameter layouts
  def param_layout(self, path, shape):
    """A parameter's mesh axes (state_shardings recorded them); unknown paths: whole."""
    layout = self.param_layouts.get(path)
    fits = layout is not None and len(layout) == len(shape) and all(
        a is None or n % self.shape.size(a) == 0 for n, a in zip(shape, layout))
    return layout if fits else (None,) * len(shape)

  def update_sharding(self, shape, path=None):
    """The layout of the optimizer state and update of the parameter at `path` (or of an array
    of this shape that is no parameter): its own layout, split over DATA on a further dimension
    under weight-update sharding (harness.mesh.update_layout)."""
    return self._named(mesh_lib.update_layout(shape, self.param_layout(path, shape), self.shape,
                                              self.weight_update_sharding))

  def state_shardings(self, state_shapes, param_axes=()):
    """Params per the workload's param_axes table, the optimizer state like its parameter (the
    leaf whose path ends with the parameter's, e.g. '0/mu/<param path>') per `update_sharding`,
    other state (batch stats, step, keys) replicated."""
    # param_layouts_extra: layouts of leaves no table names (stage-owned rows: split on stage)
    self.param_layouts = dict(getattr(self, "param_layouts_extra", {}))
    if param_axes:
      for path, leaf in jax.tree_util.tree_leaves_with_path(state_shapes.params):
        name = path_name(path)
        if name in self.param_layouts:
          continue
        self.param_layouts[name] = mesh_lib.logical_to_mesh(
            mesh_lib.param_axes(param_axes, name, len(leaf.shape)), self.shape, shape=leaf.shape)
    shardings = jax.tree.map(lambda _: self.replicated, state_shapes)
    params = jax.tree_util.tree_map_with_path(
        lambda path, s: self._named(self.param_layout(path_name(path), s.shape)),
        state_shapes.params)
    opt_state = jax.tree_util.tree_map_with_path(
        lambda path, s: self.update_sharding(s.shape, self._param_path_of(path_name(path))),
        state_shapes.opt_state)
    return shardings.replace(params=params, opt_state=opt_state)

  def _param_path_of(self, state_path):
    """The parameter an optimizer-state leaf belongs to: the longest parameter path its own
    path ends with."""
    parts = state_path.split("/")
    for i in range(len(parts)):
      if "/".join(parts[i:]) in self.param_layouts:
        return "/".join(parts[i:])
    return None

  def constrain_update(self, tree):
    """Inside a step: lay gradients out like the optimizer state (under weight-update sharding
    a reduce-scatter over DATA; a gradient split on `model` stays split there)."""
    if not self.weight_update_sharding:
      return tree
    return jax.tree_util.tree_map_with_path(lambda path, x: jax.lax.with_sharding_constraint(
        x, self.update_sharding(x.shape, path_name(path))), tree)

  def restore_param_layout(self, params):
    """Inside a step: every updated parameter back in its own layout (under weight-update
    sharding an all-gather over DATA; a parameter split on `model` stays split)."""
    return jax.tree_util.tree_map_with_path(lambda path, x: jax.lax.with_sharding_constraint(
        x, self._named(self.param_layout(path_name(path), x.shape))), params)

  replicate = restore_param_layout        # the name before parameters had layouts of their own

  def layout_summary(self, param_axes):
    """{'split': {path: layout}, 'whole': {path: logical dims the mesh would split but does
    not divide}} for `describe`: which parameters the mesh's non-data axes split."""
    split, whole = {}, {}
    extra = getattr(self, "param_layouts_extra", {})
    for path, layout in self.param_layouts.items():
      if path in extra:                  # no parameter of the model's own (stage-owned rows)
        continue
      if any(a not in (None, "data") for a in layout):
        split[path] = layout
      logical = mesh_lib.param_axes(param_axes, path, len(layout))
      wanted = mesh_lib.logical_to_mesh(logical, self.shape)
      missed = [name for name, want, got in zip(logical, wanted, layout) if want and not got]
      if missed:
        whole[path] = missed
    return {"split": split, "whole": whole}

  def collectives_by_axis(self, hlo_text):
    """{(kind, axes): [ops, tensors, bytes]} over a compiled program's collectives: `axes`
    names the mesh axes its replica groups span ('model', 'data', 'data+model'), `tensors`
    counts operands (XLA's combiner merges several into one op), bytes are the results' (per
    device, per step). An op whose groups are single devices is left out: XLA keeps such an
    all-reduce over an axis of size 1 (the stage-owned rows' gradient at data=1), and no
    byte moves."""
    sizes = [self.mesh.shape[a] for a in MESH_AXES]
    out = collections.defaultdict(lambda: [0, 0, 0])
    for kind, result, groups in _collective_ops(hlo_text):
      if not groups:                       # replica_groups={}: one group of every device
        groups = [list(range(math.prod(sizes)))]
      if all(len(group) < 2 for group in groups):
        continue
      spans = set()
      for group in groups:
        coords = np.array(np.unravel_index(np.asarray(group), sizes)).T
        spans |= {MESH_AXES[i] for i in range(len(sizes)) if len(set(coords[:, i])) > 1}
      named = [axis for axis, phys in PHYSICAL.items()
               if spans & set(phys if isinstance(phys, tuple) else (phys,))]
      entry = out[(kind, "+".join(named))]
      entry[0] += 1
      entry[1] += max(1, len(re.findall(r"[a-z]+\d*\[[\d,]*\]", result)))
      entry[2] += _bytes_of(result)
    return dict(out)

  # ------------------------------------------------------------------ activations
  @contextlib.contextmanager
  def tracing(self):
    """While a step is traced: `constrain` resolves logical names on this mesh."""
    token = _TRACING.set(self)
    try:
      yield self
    finally:
      _TRACING.reset(token)

  def grouped_bn_step(self, local_fn):
    """Grouped batch norm for any conv net (ResNet, SSD, EfficientNet): local_fn(params,
    batch_stats, batch) -> (loss, grads, new_batch_stats), whose model normalises over the
    'bn' axis (flax BatchNorm(axis_name='bn')), runs per device under shard_map; the result
    has loss and gradients averaged over all replicas, running statistics over the groups."""
    def local(params, batch_stats, batch):
      loss, grads, stats = local_fn(params, batch_stats, batch)
      return (jax.lax.pmean(loss, DATA), jax.lax.pmean(grads, DATA),
              jax.lax.pmean(stats, "replica"))
    return jax.shard_map(local, mesh=self.mesh, in_specs=(P(), P(), P(DATA)),
                         out_specs=(P(), P(), P()), check_vma=False)


def constrain(x, logical_axes):
  """An activation laid out by its logical names on the mesh of the step being traced, when
  that mesh has a model or an expert axis (Mesh-TF's layer-boundary layouts; GShard's
  dispatch). Without one, GSPMD's own propagation from the batch already gives the
  data-parallel layout, and the constraint would only add ops: then, and outside
  `MeshRuntime.tracing`, x is returned as it is."""
  runtime = _TRACING.get()
  if runtime is None or (runtime.model == 1 and runtime.expert == 1):
    return x
  sharding = runtime.sharding(logical_axes, x.shape)
  manual = set(getattr(jax.sharding.get_abstract_mesh(), "manual_axes", ()) or ())
  if not manual:
    return jax.lax.with_sharding_constraint(x, sharding)
  # inside a partially manual shard_map (the pipeline: manual over stage and data, GSPMD over
  # model): only the automatic axes, named on the context's mesh
  def auto(entry):
    names = tuple(a for a in (entry if isinstance(entry, tuple) else (entry,))
                  if a is not None and a not in manual)
    return names if len(names) > 1 else (names[0] if names else None)
  return jax.lax.with_sharding_constraint(x, P(*(auto(e) for e in sharding.spec)))


def path_name(path) -> str:
  """A pytree key path as the param_axes tables spell it: 'layer_0/query/kernel'."""
  return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def per_device_bytes(tree) -> int:
  """Bytes of `tree` held by one device (the first addressable shard of each array; a shape
  with a sharding, when describing, counts its shard's shape)."""
  def shard_bytes(leaf):
    if isinstance(leaf, jax.ShapeDtypeStruct):
      return math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
    return leaf.addressable_shards[0].data.nbytes
  return int(sum(shard_bytes(leaf) for leaf in jax.tree.leaves(tree)))


_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4,
                "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16}
_OP = re.compile(r"= (.*?) (" + "|".join(COLLECTIVES) + r")(?:-start)?\((.*)$", re.M)


def _bytes_of(shapes: str) -> int:
  """Bytes of an HLO result type: 'f32[2,64]{1,0}' or a tuple of them."""
  return sum(_DTYPE_BYTES.get(dtype, 4) * math.prod(int(d) for d in dims.split(",") if d)
             for dtype, dims in re.findall(r"([a-z]+\d*)\[([\d,]*)\]", shapes))


def _replica_groups(attributes: str):
  """An HLO op's replica groups as lists of device ids, from any of XLA's spellings: listed
  '{{0,1},{2,3}}'; iota '[2,4]<=[4,2]T(1,0)' (ids 0..n-1 reshaped, transposed, then grouped);
  mesh "mesh['axis_0'=2,'axis_1'=2] {'axis_1'}" (ids over that mesh, a group per value of
  the unnamed axes), whose ids may be an iota of their own ("device_ids=([2,2]T(1,0))"); or
  a permute's source_target_pairs."""
  listed = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", attributes)
  if listed:
    return [[int(i) for i in g.split(",") if i]
            for g in re.findall(r"\{([\d,]*)\}", listed.group(1))]
  iota = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?",
                   attributes)
  if iota:
    groups_shape = [int(d) for d in iota.group(1).split(",")]
    ids = np.arange(math.prod(groups_shape)).reshape([int(d) for d in iota.group(2).split(",")])
    if iota.group(3):
      ids = ids.transpose([int(d) for d in iota.group(3).split(",")])
    return ids.reshape(groups_shape[0], -1).tolist()
  on_mesh = re.search(r"replica_groups=mesh\[([^\]]*)\](?:, device_ids=\(\[([\d,]+)\]"
                      r"(?:T\(([\d,]+)\))?\))? \{([^}]*)\}", attributes)
  if on_mesh:
    axes = re.findall(r"'([^']+)'=(\d+)", on_mesh.group(1))
    names, sizes = [a for a, _ in axes], [int(n) for _, n in axes]
    inside = [names.index(a) for a in re.findall(r"'([^']+)'", on_mesh.group(4))]
    outside = [i for i in range(len(names)) if i not in inside]
    ids = np.arange(math.prod(sizes))
    if on_mesh.group(2):        # the mesh's device ids: an iota reshaped (and transposed)
      ids = ids.reshape([int(d) for d in on_mesh.group(2).split(",")])
      if on_mesh.group(3):
        ids = ids.transpose([int(d) for d in on_mesh.group(3).split(",")])
    ids = ids.reshape(sizes).transpose(outside + inside)
    return ids.reshape(-1, math.prod(sizes[i] for i in inside)).tolist()
  pairs = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", attributes)
  if pairs:
    return [[int(a), int(b)] for a, b in re.findall(r"\{(\d+),(\d+)\}", pairs.group(1))]
  return []


def _collective_ops(hlo_text):
  """(kind, result type, replica groups) of every collective op (async pairs once)."""
  for match in _OP.finditer(hlo_text):
    yield match.group(2), match.group(1), _replica_groups(match.group(3))


def count_collectives(hlo_text: str) -> dict:
  """Collective ops in a compiled program's HLO, by kind (async pairs counted once)."""
  counts = collections.Counter()
  for kind in COLLECTIVES:
    counts[kind] = len(re.findall(rf"= [^=]*? {kind}(?:-start)?\(", hlo_text))
  return {k: v for k, v in counts.items() if v}
