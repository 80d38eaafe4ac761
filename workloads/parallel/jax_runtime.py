"""The JAX distributed runtime: one jax.sharding.Mesh for any workload (DESIGN §4).

The named axes of harness/mesh.py become physical mesh axes ('replica', 'bn', 'spatial'): the
data axis is split into groups of `bn_group_size` ('bn') so batch-norm statistics can be pooled
over a sub-axis (PLATFORM_NOTES: axis_index_groups does not work under shard_map). Arrays are
laid out from their logical axis names through harness.mesh's rule table: a batch's 'batch'
dimension over DATA = ('replica', 'bn'), an image's 'height' over 'spatial' (XLA inserts the
halo exchange); parameters per the workload's param_axes table (replicated while the runtime
runs no model axis).
Weight-update sharding puts the optimizer state, and the update computed from it, on shards of
DATA; the new weights are all-gathered back to every replica (ZeRO-1).
"""
import collections
import math
import re

import jax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from harness import mesh as mesh_lib

DATA = ("replica", "bn")
PHYSICAL = {"data": DATA, "spatial": "spatial"}      # named mesh axis -> this mesh's axes
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")


def initialize_multihost(parallel):
  """jax.distributed.initialize for --num-processes > 1 (before any device is touched). A peer
  that stops answering for heartbeat_timeout_s seconds ends every process with an error."""
  if parallel.num_processes > 1 and not jax.distributed.is_initialized():
    jax.distributed.initialize(parallel.coordinator, num_processes=parallel.num_processes,
                               process_id=parallel.process_id, initialization_timeout=120,
                               heartbeat_timeout_seconds=parallel.heartbeat_timeout_s,
                               shutdown_timeout_seconds=30)


class MeshRuntime:
  def __init__(self, parallel, global_batch_size=0):
    initialize_multihost(parallel)
    devices = jax.devices()
    self.shape = shape = mesh_lib.mesh_shape(parallel, len(devices), global_batch_size)
    unsupported = [a for a in mesh_lib.AXES if shape.size(a) > 1 and a not in PHYSICAL]
    if unsupported:
      raise ValueError(f"--mesh axis {unsupported[0]}: the jax runtime does not run it yet; "
                       f"allowed axes: {', '.join(PHYSICAL)}")
    data, spatial, group = shape.data, shape.spatial, shape.bn_group_size
    self.parallel = parallel
    self.data, self.spatial, self.bn_group_size = data, spatial, group
    self.grouped_bn = group < data
    self.weight_update_sharding = parallel.weight_update_sharding
    self.num_devices = data * spatial
    self.mesh = jax.make_mesh((data // group, group, spatial), ("replica", "bn", "spatial"),
                              axis_types=(AxisType.Auto,) * 3, devices=devices[:data * spatial])
    self.replicated = NamedSharding(self.mesh, P())
    self.process_index, self.process_count = jax.process_index(), jax.process_count()

  @property
  def description(self):
    return self.shape.description

  def sharding(self, logical_axes):
    """The NamedSharding of an array whose dimensions have these logical names."""
    axes = mesh_lib.logical_to_mesh(logical_axes, self.shape)
    return NamedSharding(self.mesh, P(*(PHYSICAL[a] if a else None for a in axes)))

  def shard_batch(self, host_batch, logical_axes):
    """This host's slice of the global batch -> global arrays on the mesh."""
    return {k: jax.make_array_from_process_local_data(self.sharding(logical_axes[k]), v)
            for k, v in host_batch.items()}

  def update_sharding(self, shape):
    """Weight-update sharding of one array: its largest dimension divisible by the data
    replicas is split over DATA; arrays with none stay replicated."""
    if not self.weight_update_sharding:
      return self.replicated
    dims = [i for i, n in enumerate(shape) if n % self.data == 0]
    if self.data == 1 or not dims:
      return self.replicated
    dim = max(dims, key=lambda i: shape[i])
    spec = [None] * len(shape)
    spec[dim] = DATA
    return NamedSharding(self.mesh, P(*spec))

  def state_shardings(self, state_shapes, param_axes=()):
    """Params per the workload's param_axes table, other state (batch stats, step, keys)
    replicated, the optimizer state per `update_sharding`."""
    shardings = jax.tree.map(lambda _: self.replicated, state_shapes)
    params = shardings.params
    if param_axes:
      params = jax.tree_util.tree_map_with_path(
          lambda path, s: self.sharding(mesh_lib.param_axes(param_axes, path_name(path),
                                                            len(s.shape))),
          state_shapes.params)
    return shardings.replace(params=params, opt_state=jax.tree.map(
        lambda s: self.update_sharding(s.shape), state_shapes.opt_state))

  def constrain_update(self, tree):
    """Inside a step: lay gradients out like the optimizer state (a reduce-scatter)."""
    if not self.weight_update_sharding:
      return tree
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(
        x, self.update_sharding(x.shape)), tree)

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

  def replicate(self, tree):
    """Inside a step: all-gather updated weights back to every replica."""
    if not self.weight_update_sharding:
      return tree
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, self.replicated), tree)


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


def count_collectives(hlo_text: str) -> dict:
  """Collective ops in a compiled program's HLO, by kind (async pairs counted once)."""
  counts = collections.Counter()
  for kind in COLLECTIVES:
    counts[kind] = len(re.findall(rf"= [^=]*? {kind}(?:-start)?\(", hlo_text))
  return {k: v for k, v in counts.items() if v}
