"""The TensorFlow distributed runtime on tf.distribute (docs/architecture.md), the twin of jax_runtime.py.

Replicas are numbered r = d * spatial + j: d is the data-parallel index, j the row slab of the
image the replica holds when spatial partitioning is on. One host: MirroredStrategy over the
GPUs, or over N logical CPU devices (`--cpu-devices N`). Several processes: MultiWorkerMirrored-
Strategy with the cluster resolver of how they were started (`cluster_resolver`: an srun step,
TF_CONFIG, or --coordinator/--num-processes/--process-id on one host).

Everything here runs in replica context inside the training tf.function and uses only the
strategy's own collectives (ReplicaContext.all_reduce / all_gather), which carry gradients and
work the same under MirroredStrategy and MultiWorkerMirroredStrategy:
- grouped batch norm sums statistics over groups of k consecutive replicas (`group_sum`);
- the spatial halo exchange fetches the neighbouring slabs' edge rows (`halo_pad`);
- gathers are all-reduces of zero-padded slots (`all_gather` says why);
- weight-update sharding keeps each replica's slice of the flattened optimizer state in
  SyncOnRead variables (one different value per replica) — see `ShardedUpdate`.

Sub-group collectives: tf.distribute has no API for a collective over a subset of replicas
(raw CollectiveReduceV2 with per-group keys needs ordering tokens and hangs in eager; see
PLATFORM_NOTES), so a group sum is one all-reduce of a [groups, ...] tensor in which each
replica fills its group's row. It is exact; it moves groups x the bytes of a true sub-group
all-reduce, which for batch-norm statistics (2 x channels floats) is small.
"""
import json
import os

import numpy as np
import tensorflow as tf

from harness import cluster as cluster_lib
from harness import mesh as mesh_lib

SUPPORTED_AXES = ("data", "model", "stage", "expert", "spatial")  # mesh.RUNTIME_AXES['tf']
CPU_DEVICES_ENV = "HARNESS_CPU_DEVICES"      # set by the CLI's --cpu-devices for --framework tf
SUM = tf.distribute.ReduceOp.SUM


def use_logical_cpus(count):
  """Splits the host CPU into `count` logical devices (must run before TF executes any op)."""
  cpu = tf.config.list_physical_devices("CPU")[0]
  current = tf.config.get_logical_device_configuration(cpu) or [None]
  if count <= 1 or len(current) == count:
    return
  try:
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * count)
  except RuntimeError:
    raise ValueError(f"--cpu-devices {count}: TensorFlow already started with "
                     f"{len(current)} CPU device(s) in this process") from None


def tf_config(parallel):
  """TF_CONFIG for worker `process_id`: worker i at the coordinator's host, port + i."""
  host, _, port = parallel.coordinator.rpartition(":")
  workers = [f"{host}:{int(port) + i}" for i in range(parallel.num_processes)]
  return {"cluster": {"worker": workers},
          "task": {"type": "worker", "index": parallel.process_id}}


class _SlurmResolver(tf.distribute.cluster_resolver.SlurmClusterResolver):
  """SlurmClusterResolver with task i of the step listening on the port base + i (SLURM_PROCID),
  not + its index on its node: two nodes that share one host's addresses (SLURM's
  multiple-slurmd mode: docs/cluster/local_slurm.sh) would otherwise both bind the base."""

  def cluster_spec(self):
    spec = super().cluster_spec().as_dict()
    index, renumbered = 0, {}
    for job in sorted(spec):              # the resolver's own order: its task ids follow it
      for address in spec[job]:
        renumbered.setdefault(job, []).append(
            f"{address.rsplit(':', 1)[0]}:{self._port_base + index}")
        index += 1
    self._cluster_allocation = renumbered
    return tf.train.ClusterSpec(renumbered)


def cluster_resolver(parallel):
  """The tf.distribute cluster resolver of a multi-process run (harness/cluster.py): in an
  srun step, SlurmClusterResolver (tasks per node from SLURM_STEP_TASKS_PER_NODE, the ports
  from the one JAX's SLURM detection uses, + the task's index in the step: _SlurmResolver); from
  TF_CONFIG,
  TFConfigClusterResolver; from the flags, the same on a TF_CONFIG built here (one host:
  worker i at the coordinator's port + i)."""
  resolvers = tf.distribute.cluster_resolver
  if parallel.cluster == "slurm":
    found = cluster_lib.detect()
    if found.gpus_on_node:
      return _SlurmResolver(port_base=found.slurm_port, gpus_per_node=found.gpus_on_node,
                            gpus_per_task=found.gpus_per_task or None)
    # A CPU step: the resolver pairs each task with GPUs; give each a notional one and
    # leave CUDA_VISIBLE_DEVICES alone.
    return _SlurmResolver(port_base=found.slurm_port, gpus_per_node=found.num_processes,
                          gpus_per_task=1, auto_set_gpu=False)
  if parallel.cluster != "tf_config":
    os.environ["TF_CONFIG"] = json.dumps(tf_config(parallel))
  return resolvers.TFConfigClusterResolver()


_MIRRORED = {}


_KEYS_PER_STRATEGY = 1 << 16       # group keys apart between two strategies of one process


def _mirrored_strategy(devices):
  """One MirroredStrategy per device set and process: two strategies over the same devices
  draw the same collective group and instance keys, and the collective executor then matches
  one strategy's op with the other's ("shape mismatch in the collective instance").
  Strategies over different device sets (8 replicas, then 4) get disjoint group keys: every
  MirroredStrategy numbers its groups from 1 + `_collective_key_base` (0 unless set)."""
  if devices not in _MIRRORED:
    cls = tf.distribute.MirroredStrategy
    cls._collective_key_base = _KEYS_PER_STRATEGY * len(_MIRRORED)  # pylint: disable=protected-access
    try:
      _MIRRORED[devices] = cls(list(devices))
    finally:
      cls._collective_key_base = 0  # pylint: disable=protected-access
  return _MIRRORED[devices]


def _row(stacked, index):
  """stacked[index] (a replica's row of an all-reduced [n, ...] tensor) as a one-hot sum: exact
  for finite values, and its gradient stays dense. tf.gather's gradient is IndexedSlices, which
  the all-reduce's own gradient then reduces as slices (an all-gather of indices and values per
  tensor): ~0.3 s more tracing per batch-norm layer and a sparse collective in every step."""
  onehot = tf.one_hot(index, stacked.shape[0], dtype=stacked.dtype)
  return tf.reduce_sum(tf.reshape(onehot, [-1] + [1] * (stacked.shape.rank - 1)) * stacked, 0)


def _as_row(x, index, rows):
  """x as row `index` of an otherwise zero [rows, ...] tensor (the inverse of _row, and for the
  same reason a one-hot product): summed over replicas, row i is the sum of the x of the
  replicas that put theirs in row i (one replica each: every replica's x, stacked)."""
  onehot = tf.one_hot(index, rows, dtype=x.dtype)
  return tf.reshape(onehot, [rows] + [1] * x.shape.rank) * x[None]


class StrategyRuntime:
  def __init__(self, parallel, global_batch_size=0):
    self.parallel = parallel
    self.process_index, self.process_count = parallel.process_id, parallel.num_processes
    self.process_hosts = None
    if parallel.num_processes > 1:
      resolver = cluster_resolver(parallel)
      # every worker's host, by index (a lost peer is named by its host: harness/faults.py)
      self.process_hosts = [address.rsplit(":", 1)[0] for address in
                            resolver.cluster_spec().as_dict().get("worker", [])] or None
      self.strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
      # A dead peer is found by the strategy's health check (a ping to every worker each
      # heartbeat_timeout_s), which aborts the pending collectives with an error. A per-op
      # collective timeout would not do: workers legitimately wait on each other for as long
      # as one of them spends tracing or compiling.
      extended = self.strategy.extended
      extended._check_health_interval = parallel.heartbeat_timeout_s  # pylint: disable=protected-access
      extended._check_health_timeout = parallel.heartbeat_timeout_s  # pylint: disable=protected-access
      available = self.strategy.num_replicas_in_sync
      devices = None
    else:
      use_logical_cpus(int(os.environ.get(CPU_DEVICES_ENV) or 0))
      devices = [d.name for d in tf.config.list_logical_devices("GPU")
                 or tf.config.list_logical_devices("CPU")]
      available = len(devices)
    self.shape = shape = mesh_lib.mesh_shape(parallel, available, global_batch_size)
    mesh_lib.check_runtime_axes("tf", shape, parallel, SUPPORTED_AXES)
    data, spatial, group = shape.data, shape.spatial, shape.bn_group_size
    self.model, self.expert = shape.model, shape.expert
    # The batch is split over data x expert (harness.mesh's 'batch' rule): to everything that
    # splits the batch (input, gradient sums of whole weights), the expert axis's replicas
    # are data replicas; a weight split over experts (tf_model_parallel.ShardedWeight, axis
    # 'expert') is summed over the replicas holding the same experts (`data_sum`).
    data *= self.expert
    if devices is None and data * spatial * self.model != available:
      raise ValueError(f"--mesh data={data},model={self.model},spatial={spatial}: a "
                       f"multi-worker TF run uses every replica of every worker ({available})")
    # GPipe (tf_pipeline.py): one graph placed over stage x data devices, no replicas
    self.stage, self.microbatches = shape.stage, parallel.microbatches
    self.pipelined = self.stage > 1 or self.microbatches > 1
    self.pipeline_devices = devices[:data * self.stage] if self.pipelined else []
    self.num_replicas = 1 if self.pipelined else data * self.model * spatial
    if devices is not None:
      self.strategy = (_mirrored_strategy(tuple(devices[:self.num_replicas]))
                       if self.num_replicas > 1 else tf.distribute.get_strategy())
    self.local_replicas = local = self.num_replicas // self.process_count
    if spatial > 1 and local % spatial:
      raise ValueError(f"--spatial-partitions {spatial}: a spatial group must sit on one host "
                       f"({local} replica(s) per host here)")
    # A data shard's replicas (its model peers and slabs: `copies`) read the same examples. On
    # hosts of fewer replicas than that (a model axis across processes) consecutive hosts hold
    # one shard's replicas and read its batch alike: each input pipeline serves that many.
    k = self.model * spatial
    if local and (local % k if k <= local else k % local):
      raise ValueError(f"--mesh model={self.model}: a host's {local} replica(s) must hold whole "
                       f"model groups, or a model group whole hosts")
    self.hosts_per_shard = max(1, k // max(local, 1))
    self.input_hosts = self.process_count // self.hosts_per_shard
    self.input_host = self.process_index // self.hosts_per_shard
    self.data, self.spatial = data, spatial
    self.bn_group_size = group * spatial            # replicas pooling batch-norm statistics
    self.weight_update_sharding = parallel.weight_update_sharding and self.num_replicas > 1
    self.sharded_weights = []       # tf_model_parallel.ShardedWeight, made by the model's layers
    self.param_axes = ()            # the workload's PARAM_AXES (the trainer sets it): layouts
    # tf.distribute collectives issued by the traced step, by kind (those of their
    # gradients, which tf.distribute adds in the backward pass, not counted)
    self.collective_calls = {}
    self.collective_bytes = {}

  @property
  def distributed(self):
    return self.num_replicas > 1

  @property
  def num_devices(self):
    return len(self.pipeline_devices) if self.pipelined else self.num_replicas

  @property
  def description(self):
    return self.shape.description

  @property
  def copies(self) -> int:
    """Replicas computing on the same examples (a model group's peers, a spatial group's
    slabs): a sum over every replica counts each example this many times, and a loss or count
    summed so is divided by it (harness.mesh.COMPOSITION keeps one of the two at 1)."""
    return self.model * self.spatial

  # ------------------------------------------------------------------ replica-context collectives
  def _count(self, kind, x=None):
    """At trace time: one collective of `kind` and the bytes it reduces (static shapes)."""
    self.collective_calls[kind] = self.collective_calls.get(kind, 0) + 1
    nbytes = sum(int(np.prod(t.shape)) * t.dtype.size for t in tf.nest.flatten(x)
                 if t.shape.is_fully_defined())
    self.collective_bytes[kind] = self.collective_bytes.get(kind, 0) + nbytes

  @staticmethod
  def replica_id():
    return tf.distribute.get_replica_context().replica_id_in_sync_group

  def spatial_index(self):
    return self.replica_id() % self.spatial

  def spatial_gather(self, x):
    """A row slab [N, h, W, C] -> the whole image's rows [N, spatial * h, W, C] on every
    replica of the spatial group (its gradient: each slab's rows of the summed gradients)."""
    if self.spatial == 1:
      return x
    stacked = self.group_sum(_as_row(x, self.spatial_index(), self.spatial), self.spatial)
    return tf.concat(tf.unstack(stacked), axis=1)

  def data_index(self):
    """This replica's coordinate on the data axis (harness.mesh.MESH_ORDER), a tensor."""
    return self.replica_id() // (self.spatial * self.model)

  @staticmethod
  def as_row(x, index, rows):
    """x as row `index` of an otherwise zero [rows, ...] tensor (summed over the replicas that
    fill different rows: their x stacked)."""
    return _as_row(x, index, rows)

  def model_index(self):
    """This replica's coordinate on the model axis (harness.mesh.MESH_ORDER), a tensor."""
    return self.axis_index("model")

  def axis_size(self, axis):
    return self.model if axis == "model" else self.expert

  def _stride(self, axis):
    """Replicas between two neighbours on `axis` ('model' or 'expert'): the sizes of the axes
    inside it in harness.mesh.MESH_ORDER (data, expert, model, spatial)."""
    return self.spatial * (self.model if axis == "expert" else 1)

  def axis_index(self, axis):
    """This replica's coordinate on `axis` ('model' or 'expert'), a tensor."""
    return (self.replica_id() // self._stride(axis)) % self.axis_size(axis)

  def shard_copies(self, axis):
    """Of the replicas holding one shard of a weight split over `axis` (its data peers), how
    many compute on the same examples as each other: an expert's holders include the model
    peers of each (every one routes the same tokens), a model shard's have none."""
    return self.copies // (self.model if axis == "model" else 1)

  def axis_sum(self, x, axis):
    """Sum over this replica's peers on `axis` ('model' or 'expert')."""
    self._count(f"all_reduce_over_{axis}", x)
    return self.group_sum(x, self.axis_size(axis), self._stride(axis))

  def axis_gather(self, x, axis):
    """[size, ...]: every peer's x on `axis`, in axis order."""
    if self.axis_size(axis) == 1:
      return x[None]
    return self.axis_sum(_as_row(x, self.axis_index(axis), self.axis_size(axis)), axis)

  def all_to_all(self, x, axis):
    """[peers, n, ...] per replica -> [peers, n, ...] whose row p is peer p's row for this
    replica (the all-to-all over the peers on `axis`). Built from a gather of every peer's
    tensor and a slice (tf.distribute has no all-to-all): exact, with gradients (those of the
    all-reduce), moving `peers` times the bytes of a true all-to-all."""
    self._count(f"all_to_all_over_{axis}", x)
    return tf.gather(self.axis_gather(x, axis), self.axis_index(axis), axis=1)

  def emulated_costs(self, bytes_by_kind):
    """{kind: (bytes a replica sends, bytes a true all-to-all sends)} for each all-to-all of
    `bytes_by_kind` (a step's counted tensors, per replica). Each is an all-reduce of a
    tensor `peers` times the size (axis_gather), of which a ring all-reduce sends 2 (p - 1) / p,
    where an all-to-all sends the (p - 1) / p of its tensor bound for other peers: 2 p times
    fewer bytes (docs/platform.md)."""
    costs = {}
    for kind, nbytes in bytes_by_kind.items():
      if kind.startswith("all_to_all_over_"):
        peers = self.axis_size(kind[len("all_to_all_over_"):])
        costs[kind] = (2 * (peers - 1) * nbytes, (peers - 1) * nbytes // peers)
    return costs

  def data_sum(self, x, axis="model"):
    """Sum over the replicas holding the same shard of a weight split over `axis` ('model' or
    'expert') as this one (its data peers)."""
    size = self.axis_size(axis)
    if size == 1:
      return self.all_sum(x)
    if self.num_replicas == size:
      return x
    self._count("all_reduce_over_data", x)
    m = self.axis_index(axis)
    return _row(tf.distribute.get_replica_context().all_reduce(SUM, _as_row(x, m, size)), m)

  def all_sum(self, x):
    if not self.distributed:
      return x
    self._count("all_reduce", x)
    return tf.distribute.get_replica_context().all_reduce(SUM, x)

  def all_gather(self, x):
    """[n, ...] per replica -> [replicas * n, ...], in replica order. Built on all_reduce (each
    replica fills its own slot of a zero tensor): MirroredStrategy's all_gather launches its
    collectives from the replica threads, whose instance keys can differ between replicas
    when several gathers are traced in one step ("shape mismatch in the collective
    instance"); all_reduce goes through merge_call, which orders them."""
    if not self.distributed:
      return x
    self._count("all_gather", x)
    n = self.num_replicas
    gathered = tf.distribute.get_replica_context().all_reduce(
        SUM, _as_row(x, self.replica_id(), n))
    return tf.reshape(gathered, [n * x.shape[0]] + x.shape[1:].as_list())

  def group_sum(self, x, group_size, stride=1):
    """Sum of x over the `group_size` replicas of this replica's group: consecutive ones, or
    every `stride`-th (a mesh axis with axes inside it: replicas r, r + stride, ...)."""
    if group_size == 1 or not self.distributed:
      return x
    if group_size == self.num_replicas:
      return self.all_sum(x)
    groups = self.num_replicas // group_size
    r = self.replica_id()
    slot = r // (group_size * stride) * stride + r % stride      # the group's index
    return _row(self.all_sum(_as_row(x, slot, groups)), slot)

  def halo_pad(self, x, top, bottom, left, right, value=0.0):
    """Pads an NHWC row slab as if the whole image were padded: `top` rows from the slab above
    and `bottom` rows from the slab below (`value` at the image's own edges); W padded with
    `value`. Without spatial partitioning it is plain constant padding."""
    x = tf.pad(x, [[0, 0], [0, 0], [left, right], [0, 0]], constant_values=value)
    if self.spatial == 1:
      return tf.pad(x, [[0, 0], [top, bottom], [0, 0], [0, 0]], constant_values=value)
    rows = x.shape[1]
    if max(top, bottom) > rows:
      raise ValueError(f"--spatial-partitions {self.spatial}: a layer needs a halo of "
                       f"{max(top, bottom)} rows from slabs of {rows}; use fewer partitions")
    j, r = self.spatial_index(), self.replica_id()
    parts = []
    if top:            # the last `top` rows of replica r - 1
      edges = self.all_gather(x[None, :, rows - top:])
      above = _row(edges, tf.maximum(r - 1, 0))
      parts.append(tf.where(j > 0, above, tf.fill(tf.shape(above), tf.cast(value, x.dtype))))
    parts.append(x)
    if bottom > 0:     # the first `bottom` rows of replica r + 1
      edges = self.all_gather(x[None, :, :bottom])
      below = _row(edges, tf.minimum(r + 1, self.num_replicas - 1))
      last = j < self.spatial - 1
      parts.append(tf.where(last, below, tf.fill(tf.shape(below), tf.cast(value, x.dtype))))
    elif bottom < 0:   # the window never reaches the last rows (e.g. a strided 1x1 conv)
      parts[-1] = x[:, :rows + bottom]
    return tf.concat(parts, axis=1)

  # ------------------------------------------------------------------ input
  def distribute(self, dataset_fn, global_batch_size, logical_axes):
    """A distributed dataset from `dataset_fn(process_index, process_count)`, which yields this
    host's slice of each global batch; each replica gets its consecutive per-replica slice (its
    slab of the dimension the rule table puts on 'spatial' under spatial partitioning).
    `logical_axes`: {key: the logical names of that array's dimensions}."""
    if not self.distributed:
      return dataset_fn(self.process_index, self.process_count)
    per_replica = global_batch_size // self.data
    # this host's input pipeline: its own, or the one it shares with the hosts of its data
    # shard (a model axis across processes); tf.distribute's ids would be the process's
    return self.strategy.distribute_datasets_from_function(
        lambda ctx: self._per_replica(dataset_fn(self.input_host, self.input_hosts),
                                      per_replica, logical_axes))

  def _per_replica(self, dataset, per_replica, logical_axes):
    # the model peers of a data shard (and its spatial slabs) read the same examples (expert
    # peers are data shards of their own: self.data counts them)
    local, k = self.local_replicas, self.spatial * self.model
    if k == 1 or local < k:                 # (a model group over hosts: each its batch whole)
      return dataset.rebatch(per_replica)

    def slabs(batch):                       # host batch -> `local` (data shard, slab) parts
      out = {}
      for key, x in batch.items():
        shards = tf.reshape(x, [local // k, per_replica] + x.shape[1:].as_list())
        mesh_axes = mesh_lib.logical_to_mesh(logical_axes[key], self.shape)
        if "spatial" in mesh_axes:          # split that dimension into k slabs, slab-major
          dim = mesh_axes.index("spatial") + 1          # +1: the leading shard dimension
          shape = shards.shape.as_list()
          shards = tf.reshape(shards, shape[:dim] + [k, shape[dim] // k] + shape[dim + 1:])
          order = list(range(len(shape) + 1))
          order.insert(1, order.pop(dim))
          shards = tf.transpose(shards, order)
        else:
          shards = tf.repeat(shards[:, None], k, axis=1)
        out[key] = tf.reshape(shards, [local] + shards.shape[2:].as_list())
      return tf.data.Dataset.from_tensor_slices(out)
    return dataset.flat_map(slabs)


class ShardedUpdate:
  """The optimizer's update where replicas hold slices or shards of what they update: the one
  weight-update-sharding update (ZeRO-1, "automatic cross-replica sharding of weight update")
  and the update of model/expert-parallel shards. The optimizer's flat rule (tf_optimizers:
  the same formula as its per-variable update) runs on one flat vector of `tensors`, padded
  to a multiple of the slicing group, with its slots (that slice's) in ON_READ variables:

  - `group='replicas'`: the Keras model's replicated weights, on gradients already summed over
    replicas (on CPU TF has no reduce-scatter kernel, so the reduce-scatter is the trainer's
    all-reduce followed by taking the slice): replica r owns elements [r*S, (r+1)*S); the new
    slices all-gathered and written into every replica's weights;
  - `group='data'`: this replica's shards of the sharded weights (ShardedWeight.component), on
    gradients summed over their data peers: data peer d owns slice d of the shards' vector;
    the new slices gathered over the data peers;
  - `group=None`: this replica's shards, updated whole by the replica holding them.
  Per-tensor norms (LARS's and LAMB's trust ratios) are the squares of each tensor's elements
  summed per tensor (segment sums) and then over the replicas holding its other parts: every
  replica when sliced (each element has one owner), the shard's `norm_axis` peers when not
  (one axis, or one per tensor: expert shards beside model shards).
  `decayed`: per tensor, whether weight decay (and a trust ratio) applies. Without `step`
  and `lr` at apply, the update counts its own iterations and reads `schedule`.
  """

  def __init__(self, runtime, tensors, optimizer, decayed, group="replicas", norm_axis=None,
               schedule=None, name="wus"):
    self.runtime, self.tensors, self.optimizer = runtime, list(tensors), optimizer
    self.rule, slot_names = optimizer.flat_update_rule()
    self.group, self.schedule = group, schedule
    variables = [t() for t in self.tensors]
    # per tensor (and None for the padding's segment), the axis its norm is summed over
    self.norm_axes = ([norm_axis] * len(variables) if isinstance(norm_axis, str) or
                      norm_axis is None else list(norm_axis)) + [None]
    # the variables' own dtype (float32, or float64 in the equality tests)
    self.dtype = tf.as_dtype(variables[0].dtype) if variables else tf.float32
    self.parts = {"replicas": runtime.num_replicas, "data": runtime.data}.get(group, 1)
    self.shapes = [v.shape for v in variables]
    sizes = [int(np.prod(shape)) for shape in self.shapes]
    self.total = sum(sizes)
    self.shard = -(-self.total // self.parts)
    padded = self.shard * self.parts
    layer = np.repeat(np.arange(len(sizes)), sizes)
    self.num_layers = len(sizes) + 1                 # the padding is its own "layer"
    self.layer_ids = tf.constant(np.pad(layer, (0, padded - self.total),
                                        constant_values=len(sizes)), tf.int32)
    mask = np.repeat([float(d) for d in decayed], sizes)
    self.decay_mask = tf.constant(np.pad(mask, (0, padded - self.total)), self.dtype)
    on_read = dict(synchronization=tf.VariableSynchronization.ON_READ,
                   aggregation=tf.VariableAggregation.SUM, trainable=False)
    with runtime.strategy.scope():
      self.slots = {slot: tf.Variable(tf.zeros([self.shard], self.dtype), name=f"{name}_{slot}",
                                      **on_read)
                    for slot in slot_names}
      # its own update count, where it runs on its own schedule (not at a caller's step)
      self.iterations = None if schedule is None else tf.Variable(
          0, dtype=tf.int64, trainable=False, name=f"{name}_iterations",
          aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

  def _index(self):
    return {"replicas": self.runtime.replica_id,
            "data": self.runtime.data_index}.get(self.group, lambda: 0)()

  def _flat(self, tensors):
    flat = tf.concat([tf.reshape(tf.cast(t, self.dtype), [-1]) for t in tensors], 0)
    return tf.pad(flat, [[0, self.shard * self.parts - self.total]])

  def _slice(self, flat):
    if self.parts == 1:
      return flat
    return tf.slice(flat, [self._index() * self.shard], [self.shard])

  def _norm_sum(self, x):
    """Per-tensor sums of squares `x` [tensors + 1] -> summed over each tensor's owners."""
    rt = self.runtime
    if self.parts > 1:
      return rt.all_sum(x)
    axes = sorted({a for a in self.norm_axes if a})
    if len(axes) <= 1:                    # every shard on one axis (the padding's sum is 0)
      return rt.axis_sum(x, axes[0]) if axes else x
    total = tf.zeros_like(x)
    for axis in axes:                     # each axis' tensors summed over their own peers
      mine = tf.constant([a == axis for a in self.norm_axes])
      total += rt.axis_sum(tf.where(mine, x, tf.zeros_like(x)), axis)
    return total

  def _gather(self, new):
    rt = self.runtime
    if self.parts == 1:
      return new
    if self.group == "replicas":
      return rt.all_gather(new)
    if self.group == "data":
      return tf.reshape(rt.data_sum(rt.as_row(new, rt.data_index(), rt.data)), [-1])
    return new

  def apply(self, grads, step=None, lr=None):
    """In replica context: `grads` (one per tensor, summed as the group needs) at update
    count `step` (from 1) with learning rate `lr`, or the update's own count and schedule
    (then the optimizer's clipping of the whole gradient first, as its own apply would)."""
    if step is None:
      grads = self.optimizer._clip_gradients(list(grads))  # pylint: disable=protected-access
      step = self.iterations + 1
      lr = self.schedule(self.iterations)
      self.iterations.assign(step)
    variables = [t() for t in self.tensors]
    g = self._slice(self._flat(grads))
    w = self._slice(self._flat([tf.convert_to_tensor(v) for v in variables]))
    ids, mask = self._slice(self.layer_ids), self._slice(self.decay_mask)

    def layer_norm(x):
      sums = self._norm_sum(tf.math.unsorted_segment_sum(tf.square(x), ids, self.num_layers))
      return tf.gather(tf.sqrt(sums), ids)

    slots = {name: (var.read_value() if self.group == "replicas" else
                    tf.convert_to_tensor(var._get()))  # pylint: disable=protected-access
             for name, var in self.slots.items()}
    new_w, new_slots = self.rule(w, g, slots, tf.cast(lr, self.dtype), step, mask, layer_norm)
    for name, value in new_slots.items():
      slot = self.slots[name]
      (slot._get() if self.group != "replicas" else slot).assign(value)  # pylint: disable=protected-access
    full = self._gather(new_w)[:self.total]
    offset = 0
    for var, shape in zip(variables, self.shapes):
      size = int(np.prod(shape))
      var.assign(tf.reshape(full[offset:offset + size], shape))
      offset += size

  def state(self):
    """The update's per-replica state (the slots' components)."""
    return [c for s in self.slots.values() for c in s.values]

  def state_bytes_per_replica(self):
    return self.dtype.size * self.shard * len(self.slots)
