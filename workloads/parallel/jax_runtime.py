"""The JAX distributed runtime: one jax.sharding.Mesh for any workload (DESIGN §4).

Mesh axes ('replica', 'bn', 'spatial'): the data-parallel replicas are split into groups of
`bn_group_size` ('bn') so batch-norm statistics can be pooled over a sub-axis (PLATFORM_NOTES:
axis_index_groups does not work under shard_map); batches are sharded over DATA = ('replica',
'bn') and, for images, their height over 'spatial' (XLA inserts the halo exchange).
Weight-update sharding puts the optimizer state, and the update computed from it, on shards of
DATA; the new weights are all-gathered back to every replica (ZeRO-1).
"""
import collections
import re

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from harness import config

DATA = ("replica", "bn")
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
  def __init__(self, parallel):
    initialize_multihost(parallel)
    devices = jax.devices()
    data, spatial, group = config.mesh_shape(parallel, len(devices))
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
    return f"data={self.data}" + (f",spatial={self.spatial}" if self.spatial > 1 else "")

  def batch_sharding(self, ndim):
    """Images [B, H, W, C]: B over DATA and H over 'spatial'; other arrays: B over DATA."""
    if ndim == 4:
      return NamedSharding(self.mesh, P(DATA, "spatial"))
    return NamedSharding(self.mesh, P(DATA))

  def batch_shardings(self, shapes):
    return jax.tree.map(lambda s: self.batch_sharding(len(s.shape)), shapes)

  def shard_batch(self, host_batch):
    """This host's slice of the global batch -> global arrays on the mesh."""
    return {k: jax.make_array_from_process_local_data(self.batch_sharding(np.ndim(v)), v)
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

  def state_shardings(self, state_shapes):
    """Params and batch stats replicated; optimizer state per `update_sharding`."""
    shardings = jax.tree.map(lambda _: self.replicated, state_shapes)
    return shardings.replace(opt_state=jax.tree.map(
        lambda s: self.update_sharding(s.shape), state_shapes.opt_state))

  def constrain_update(self, tree):
    """Inside a step: lay gradients out like the optimizer state (a reduce-scatter)."""
    if not self.weight_update_sharding:
      return tree
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(
        x, self.update_sharding(x.shape)), tree)

  def replicate(self, tree):
    """Inside a step: all-gather updated weights back to every replica."""
    if not self.weight_update_sharding:
      return tree
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, self.replicated), tree)


def per_device_bytes(tree) -> int:
  """Bytes of `tree` held by one device (the first addressable shard of each array)."""
  return int(sum(leaf.addressable_shards[0].data.nbytes for leaf in jax.tree.leaves(tree)))


def count_collectives(hlo_text: str) -> dict:
  """Collective ops in a compiled program's HLO, by kind (async pairs counted once)."""
  counts = collections.Counter()
  for kind in COLLECTIVES:
    counts[kind] = len(re.findall(rf"= [^=]*? {kind}(?:-start)?\(", hlo_text))
  return {k: v for k, v in counts.items() if v}
