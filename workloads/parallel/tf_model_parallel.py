"""Mesh-TF / Megatron model parallelism on tf.distribute: hand-written SPMD inside the
replicas of tf_runtime.StrategyRuntime (docs/architecture.md; why not DTensor: docs/platform.md).

A weight split over the `model` axis is a ShardedWeight: one ON_READ tf.Variable of the shard's
shape whose component on replica r holds shard m(r) (harness.mesh.MESH_ORDER), so a replica
holds only its shard. Layers read it with `local()` and pair it with Megatron's two operators,
tf.custom_gradient over the runtime's group collectives:
  copy_to_model(x)      forward identity, backward the sum over model peers (the input of a
                        column-parallel layer: each peer's partial input gradient);
  reduce_from_model(x)  forward the sum over model peers, backward identity (the output of a
                        row-parallel layer: each peer's partial product).
ParallelDense is keras.layers.Dense split either way. Which weights split, and on which
dimension, is the workload's PARAM_AXES through harness.mesh's rule table (`split_dim`), as
in JAX: a layer names its weights' flax paths (`in_path`), and a dense layer or projection is
column- or row-parallel by its kernel's split dimension. The vocabulary-parallel embedding looks
up the ids its shard holds and sums over peers; the vocabulary-parallel softmax cross entropy
reduces its maximum and sums over `model` and never gathers the logits. A sharded weight's
gradient is summed over its data peers only (runtime.data_sum); tf_runtime.ShardedUpdate (the
one sliced update, also weight-update sharding's) applies the optimizer's flat rule to the
shards, with whole-tensor norms (the shards' squares summed over `model`) for LAMB's trust
ratio, and with weight-update sharding splits them further over their data peers.

`gathered_weights()` is for the beam-search eval: tf.distribute cannot run a collective inside
the decoder's while loop (merge_call in control flow), so the eval all-gathers every sharded
weight once per batch, before the loop, and decodes with whole weights and no model-axis
collectives (every model peer decodes the same sentences; the trainer keeps one copy).
"""
import contextlib
import functools
import inspect
import threading

import keras
import numpy as np
import tensorflow as tf
from keras import layers, ops

from harness import mesh as mesh_lib

ON_READ = dict(synchronization=tf.VariableSynchronization.ON_READ,
               aggregation=tf.VariableAggregation.SUM, trainable=False)
# MirroredStrategy traces each replica's function in its own thread, at the same time: the
# gathered weights of one replica's eval are that thread's own.
_GATHERED = threading.local()


def _gathered():
  """{id(weight): whole value} inside this thread's gathered_weights, else None."""
  return getattr(_GATHERED, "values", None)


class ShardedWeight:
  """A weight of `full_shape` split over the model axis (or, an MoE layer's experts, over the
  expert axis: `axis`) along `dim`."""

  def __init__(self, runtime, name, full_shape, dim, initial_value, dtype, axis="model"):
    self.runtime, self.name, self.dim, self.axis = runtime, name, dim, axis
    self.full_shape = tuple(full_shape)
    self.parts = parts = runtime.axis_size(axis)
    if full_shape[dim] % parts:
      raise ValueError(f"{name}: dimension {dim} ({full_shape[dim]}) does not split over "
                       f"{axis}={parts}")
    layout = tuple(axis if i == dim else None for i in range(len(full_shape)))
    shape = mesh_lib.shard_shape(full_shape, layout, runtime.shape)
    with runtime.strategy.scope():
      self.variable = tf.Variable(tf.zeros(shape, dtype), name=name, **ON_READ)
    self.assign_full(initial_value)
    runtime.sharded_weights.append(self)

  def replica_shards(self):
    """(replica's coordinate on the axis, its component variable) for every local replica (of
    this process: global replica index process x local replicas + its own)."""
    first = self.runtime.process_index * self.runtime.local_replicas
    coords = [self.runtime.shape.coordinates(first + r)[self.axis]
              for r in range(len(self.variable.values))]
    return list(zip(coords, self.variable.values))

  def assign_full(self, value):
    parts = np.split(np.asarray(value), self.parts, axis=self.dim)
    for m, component in self.replica_shards():
      component.assign(parts[m].astype(component.dtype.as_numpy_dtype))

  def full_value(self) -> np.ndarray:
    """The whole weight, from the shards of the first data replica (host numpy; this process's
    replicas must hold every shard)."""
    shards = dict(reversed(self.replica_shards()))
    return np.concatenate([shards[m].numpy() for m in range(self.parts)], self.dim)

  def component(self):
    """In replica context: this replica's shard variable (for GradientTape.watch)."""
    return self.variable._get()  # pylint: disable=protected-access

  def local(self):
    """This replica's shard (or, under gathered_weights, the whole weight)."""
    gathered = _gathered()
    if gathered is not None:
      return gathered[id(self)]
    return tf.convert_to_tensor(self.component())

  def bytes_per_replica(self) -> int:
    return int(np.prod(self.variable.values[0].shape)) * self.variable.dtype.size


# The path (flax's, as the workload's PARAM_AXES names it) of the layer being built: each layer
# whose __init__ is decorated with `in_path` adds its name while it and its sublayers make their
# weights. Models are built in one thread; the tuple is that thread's.
_PATH = threading.local()


def in_path(init):
  """Decorates a Keras layer's __init__ (called with `name=`): the weights it and its
  sublayers make have its name in their path, as the flax module of that name's."""
  @functools.wraps(init)
  def wrapped(self, *args, **kwargs):
    saved = getattr(_PATH, "names", ())
    _PATH.names = saved + (kwargs["name"],)
    try:
      init(self, *args, **kwargs)
    finally:
      _PATH.names = saved
  wrapped.__signature__ = inspect.signature(init)   # Keras reads the arguments' names
  return wrapped


def weight_path(name):
  """The path of a weight `name` made now (by the layer whose __init__ is running)."""
  return "/".join(getattr(_PATH, "names", ()) + (name,))


def split_dim(runtime, path, shape, axis="model"):
  """The dimension of the weight at `path` that `axis` splits, or None: the workload's
  PARAM_AXES and harness.mesh's rule table on the runtime's mesh (a dimension the axis does not
  divide stays whole, as in JAX): the one layout source of both frameworks."""
  if runtime is None or runtime.axis_size(axis) == 1:
    return None
  logical = mesh_lib.param_axes(runtime.param_axes, path, len(shape))
  layout = mesh_lib.logical_to_mesh(logical, runtime.shape, shape=shape)
  dims = [d for d, axes in enumerate(layout) if axes == axis]
  return dims[0] if dims else None


def sharded_or_whole(layer, runtime, name, shape, initializer, axis="model", path=None):
  """A weight of `layer` laid out by the workload's PARAM_AXES (`path`: its flax path, by
  default weight_path(name)): a ShardedWeight drawn from `initializer` when the table splits a
  dimension of it over `axis`, else a Keras weight (in its policy's variable dtype)."""
  dtype = layer.dtype_policy.variable_dtype
  dim = split_dim(runtime, path or weight_path(name), shape, axis)
  if dim is None:
    return layer.add_weight(shape=shape, initializer=initializer, name=name, dtype=dtype)
  value = initializer(shape, dtype=dtype)
  return ShardedWeight(runtime, f"{layer.name}/{name}", shape, dim, value, dtype, axis)


def read(weight, dtype):
  """The tensor a layer computes with, in the compute dtype: a shard (a ShardedWeight is a
  tf.Variable, which Keras does not autocast), or a whole Keras weight."""
  value = weight.local() if isinstance(weight, ShardedWeight) else weight
  return tf.cast(value, dtype)


def is_sharded(weight):
  return isinstance(weight, ShardedWeight) and _gathered() is None


class ParallelDense(layers.Layer):
  """keras.layers.Dense (kernel, bias; weights made here, not on a first call) split over the
  model axis as PARAM_AXES lays it out: a kernel split on its output units is Megatron's
  'column' layer (the bias split alike), on its input units the 'row' one (the bias, whole,
  added after the sum over peers)."""

  @in_path
  def __init__(self, in_units, units, runtime, activation=None,
               kernel_initializer="glorot_uniform", **kwargs):
    super().__init__(**kwargs)
    self.runtime = runtime
    self.activation = keras.activations.get(activation)
    self.kernel = sharded_or_whole(self, runtime, "kernel", (in_units, units),
                                   keras.initializers.get(kernel_initializer))
    self.bias = sharded_or_whole(self, runtime, "bias", (units,), keras.initializers.Zeros())
    self.parallel = (None if not isinstance(self.kernel, ShardedWeight) else
                     "column" if self.kernel.dim == 1 else "row")

  def call(self, x):
    sharded = is_sharded(self.kernel)
    if sharded and self.parallel == "column":
      x = copy_to_model(self.runtime, x)
    y = ops.matmul(x, read(self.kernel, x.dtype))
    if sharded and self.parallel == "row":
      y = reduce_from_model(self.runtime, y)
    return self.activation(y + read(self.bias, y.dtype))


def copy_to_model(runtime, x):
  """Megatron's f: identity forward, gradient summed over the model peers."""
  if runtime is None or runtime.model == 1 or _gathered() is not None:
    return x

  @tf.custom_gradient
  def f(x):
    return tf.identity(x), lambda dy: runtime.axis_sum(dy, "model")
  return f(x)


def reduce_from_model(runtime, x):
  """Megatron's g: the sum over the model peers forward, identity backward."""
  if runtime is None or runtime.model == 1 or _gathered() is not None:
    return x

  @tf.custom_gradient
  def g(x):
    return runtime.axis_sum(x, "model"), lambda dy: dy
  return g(x)


def vocab_parallel_lookup(runtime, table, ids):
  """Embedding lookup from a vocab-split table [V/M, H]: each peer looks up the ids in its
  range (zeros elsewhere) and the sum over peers is the whole lookup."""
  local = read(table, table.variable.dtype)
  if not is_sharded(table):
    return tf.gather(local, ids)
  rows = local.shape[0]
  start = tf.cast(runtime.model_index(), ids.dtype) * rows
  offset = ids - start
  inside = (offset >= 0) & (offset < rows)
  found = tf.gather(local, tf.where(inside, offset, tf.zeros_like(offset)))
  return reduce_from_model(runtime, found * tf.cast(inside, found.dtype)[..., None])


def vocab_parallel_smoothed_cross_entropy(runtime, logits, labels, confidence, low, constant):
  """Per-token smoothed cross entropy (soft targets: `confidence` on the label, `low`
  elsewhere, summing to 1; minus `constant`) from logits split over the vocabulary
  [..., V/M]: log-softmax's maximum and sum and the soft-target products are reduced over
  `model`; the logits are never gathered."""
  rows = logits.shape[-1]
  start = tf.cast(runtime.model_index(), labels.dtype) * rows
  offset = labels - start
  # the maximum only steadies exp(): the same value on every peer, no gradient (a gather of
  # the peers' maxima: tf.distribute's all_reduce has no MAX)
  shift = tf.stop_gradient(tf.reduce_max(runtime.axis_gather(tf.reduce_max(logits, -1), "model"), 0))
  shifted = logits - shift[..., None]
  total_exp = reduce_from_model(runtime, tf.reduce_sum(tf.exp(shifted), -1))
  soft = tf.one_hot(offset, rows, on_value=confidence, off_value=low, dtype=logits.dtype)
  target = reduce_from_model(runtime, tf.reduce_sum(soft * shifted, -1))
  # sum_v soft_v * log_softmax_v = target - log(total_exp) (the soft targets sum to 1)
  return -(target - tf.math.log(total_exp)) - constant


@contextlib.contextmanager
def gathered_weights(runtime):
  """In replica context: every sharded weight all-gathered once; layers then compute with
  whole weights and issue no model-axis collective (see the module docstring)."""
  if runtime is None or not runtime.sharded_weights:
    yield
    return
  values = {}
  for weight in runtime.sharded_weights:
    parts = runtime.axis_gather(tf.convert_to_tensor(weight.component()), weight.axis)
    values[id(weight)] = tf.concat(tf.unstack(parts), weight.dim)
  _GATHERED.values = values
  try:
    yield
  finally:
    _GATHERED.values = None
