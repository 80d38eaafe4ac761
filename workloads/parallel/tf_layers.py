"""Keras layers that run a convolutional model across replicas (tf_runtime.StrategyRuntime):
cross-replica batch norm over groups of replicas, the spatial halo exchange, and the global
average pool over a split image. With one replica each is the plain Keras computation. And
ExampleDropout, dropout keyed by example (jax_layers.py is JAX's); BuiltInInit, the build of a
layer or model that makes its weights in __init__.
"""
import contextlib
import threading

import keras
import numpy as np
import tensorflow as tf
from keras import layers

from workloads.common.conv_geometry import same_padding
from workloads.parallel import tf_model_parallel


class BuiltInInit:
  """Mixin (before the Keras base) of a layer or model whose weights are all made in __init__ or
  by its sublayers on their first call: its build only marks it built, so Keras does not trace
  call() with the input shapes alone."""

  def build(self, *args, **kwargs):
    del args, kwargs
    self.built = True


class BuiltInInitLayer(BuiltInInit, layers.Layer):
  """A Keras layer whose weights are made in __init__ (BuiltInInit)."""


class CrossReplicaBatchNorm(layers.BatchNormalization):
  """BatchNormalization whose training statistics pool `runtime.bn_group_size` consecutive
  replicas (1: local, all: global, Keras' synchronized=True). Two passes (mean, then the mean
  squared deviation), as Keras computes them on one device. The running statistics take the
  mean over all replicas of the group statistics, so every replica keeps the same ones (as
  the JAX runtime's pmean over groups). With `real_rows` (a spatially partitioned image padded
  to split evenly: SSD's 300 rows), the statistics count the image's own rows only and the
  padding rows come out zero, as the unpadded image's next conv would pad."""

  def __init__(self, runtime, real_rows=None, **kwargs):
    super().__init__(**kwargs)
    self.runtime = runtime
    self.real_rows = real_rows     # a padded image's slabs: rows past these are not the image's

  def call(self, inputs, training=None, mask=None):
    rt = self.runtime
    if self.real_rows is None:
      return self._normalize(inputs, training, mask)
    keep = image_rows(rt, inputs, self.real_rows)
    out = self._normalize(inputs, training, mask, keep)
    return tf.where(keep, out, tf.zeros_like(out))     # as the unpadded image's conv padding

  def _normalize(self, inputs, training, mask, keep=None):
    rt = self.runtime
    if not training or not rt.distributed:
      return super().call(inputs, training=training, mask=mask)
    # statistics in float32 (float64 for a float64 model: the equality tests)
    x = tf.cast(inputs, tf.float64 if inputs.dtype == tf.float64 else tf.float32)
    axes = list(range(x.shape.rank - 1))
    group = rt.bn_group_size
    if keep is None:
      count = rt.group_sum(tf.cast(tf.reduce_prod(tf.shape(x)[:-1]), x.dtype), group)
      mean = rt.group_sum(tf.reduce_sum(x, axes), group) / count
      variance = rt.group_sum(tf.reduce_sum(tf.square(x - mean), axes), group) / count
    else:              # over the image's own rows only (keep: [1, H, 1, 1])
      weight = tf.cast(keep, x.dtype)
      per_row = tf.cast(tf.shape(x)[0] * tf.shape(x)[2], x.dtype)
      count = rt.group_sum(tf.reduce_sum(weight) * per_row, group)
      mean = rt.group_sum(tf.reduce_sum(x * weight, axes), group) / count
      variance = rt.group_sum(tf.reduce_sum(tf.square(x - mean) * weight, axes), group) / count
    if group == rt.num_replicas:
      run_mean, run_var = mean, variance
    else:
      both = rt.all_sum(tf.stack([mean, variance])) / rt.num_replicas
      run_mean, run_var = tf.stop_gradient(both[0]), tf.stop_gradient(both[1])
    m = self.momentum
    self.moving_mean.assign(self.moving_mean * m + run_mean * (1.0 - m))
    self.moving_variance.assign(self.moving_variance * m + run_var * (1.0 - m))
    out = tf.nn.batch_normalization(x, mean, variance, self.beta, self.gamma, self.epsilon)
    return tf.cast(out, self.compute_dtype)


def image_rows(runtime, x, real_rows):
  """[1, h, 1, 1] booleans: which rows of this replica's slab x [N, h, W, C] lie inside an
  image of `real_rows` rows at this level (slab j holds rows j * h ... (j + 1) * h - 1)."""
  h = x.shape[1]
  rows = tf.range(h) + tf.cast(runtime.spatial_index(), tf.int32) * h
  return tf.reshape(rows < real_rows, [1, h, 1, 1])


class ImageRows(layers.Layer):
  """Zeroes a padded image's slab rows past the image's `real_rows` at this level: they then
  read as the unpadded image's conv and pool padding."""

  def __init__(self, runtime, real_rows, **kwargs):
    super().__init__(**kwargs)
    self.runtime, self.real_rows = runtime, real_rows

  def call(self, x):
    return tf.where(image_rows(self.runtime, x, self.real_rows), x, tf.zeros_like(x))

  def compute_output_shape(self, shape):
    return shape


class PaddedConv2D(layers.Conv2D):
  """A Conv2D over its input zero-padded by `pad` rows and columns on every side, the padding
  done by the convolution itself (tf.nn.conv2d's explicit padding), not by a pad op before a
  VALID conv: XLA:CPU does not fold such a pad into the convolution, so the padded copy
  (forward) and its slice (backward) cost a ResNet-50 step about a sixth of its time. Same
  semantics as ZeroPadding2D(pad) then Conv2D(padding='valid'), same variables."""

  def __init__(self, filters, kernel_size, pad, **kwargs):
    super().__init__(filters, kernel_size, padding="valid", **kwargs)
    self.pad = pad

  def convolution_op(self, inputs, kernel):
    p = self.pad
    return tf.nn.conv2d(inputs, kernel, strides=self.strides,
                        padding=[[0, 0], [p, p], [p, p], [0, 0]], dilations=self.dilation_rate)

  def compute_output_shape(self, input_shape):
    b, h, w, _ = input_shape
    out = lambda n, k, s: None if n is None else (n + 2 * self.pad - k) // s + 1
    return (b, out(h, self.kernel_size[0], self.strides[0]),
            out(w, self.kernel_size[1], self.strides[1]), self.filters)

  def get_config(self):
    return {**super().get_config(), "pad": self.pad}


class HaloPad(layers.Layer):
  """Pads NHWC by (top, bottom) rows and (left, right) columns with `value`; under spatial
  partitioning the rows come from the neighbouring replicas' slabs (tf_runtime.halo_pad)."""

  def __init__(self, runtime, rows, cols, value=0.0, **kwargs):
    super().__init__(**kwargs)
    self.runtime, self.rows, self.cols, self.value = runtime, rows, cols, value

  def call(self, x):
    return self.runtime.halo_pad(x, *self.rows, *self.cols, value=self.value)

  def compute_output_shape(self, shape):
    b, h, w, c = shape
    return (b, h + sum(self.rows) if h is not None else None,
            w + sum(self.cols) if w is not None else None, c)


class SpatialGather(layers.Layer):
  """The whole image's rows on every replica of a spatial group (tf_runtime.spatial_gather):
  for the layers whose rows are too few to split (SSD's extra layers and heads)."""

  def __init__(self, runtime, **kwargs):
    super().__init__(**kwargs)
    self.runtime = runtime

  def call(self, x):
    return self.runtime.spatial_gather(x)

  def compute_output_shape(self, shape):
    b, h, w, c = shape
    return (b, h * self.runtime.spatial if h is not None else None, w, c)


class SpatialGlobalAveragePool(layers.Layer):
  """Mean over H and W of the whole image: the slab sums added over the spatial group."""

  def __init__(self, runtime, **kwargs):
    super().__init__(**kwargs)
    self.runtime = runtime

  def call(self, x):
    rt = self.runtime
    total = rt.group_sum(tf.reduce_sum(tf.cast(x, tf.float32), [1, 2]), rt.spatial)
    mean = total / float(x.shape[1] * rt.spatial * x.shape[2])
    return tf.cast(mean, self.compute_dtype)

  def compute_output_shape(self, shape):
    return (shape[0], shape[3])


keras.saving.register_keras_serializable("harness")(CrossReplicaBatchNorm)


def kernel_variables(model):
  """The weights LARS decays and trust-ratios: conv, depthwise-conv and dense kernels, found
  by layer role, not by matching names (biases and batch norm are left out)."""
  kinds = (layers.Conv2D, layers.DepthwiseConv2D, layers.Dense)
  return [layer.kernel for layer in model.layers if isinstance(layer, kinds)]


def bias_free_convs(init):
  """(conv, padded_conv) of a backbone whose convolutions a batch norm follows (no bias), each
  kernel from a new `init()` (an initializer draws its seed when made: after
  keras.utils.set_random_seed, the same every build). conv(filters, kernel, strides, name,
  dtype): VALID; padded_conv(lay, pad, filters, kernel, strides, name): `lay`'s (RuntimeLayers)
  symmetric zero pad, as torchvision's convs and the MLPerf references' `fixed_padding`."""
  def conv(filters, kernel, strides=1, name=None, dtype=None):
    return layers.Conv2D(filters, kernel, strides=strides, padding="valid", use_bias=False,
                         kernel_initializer=init(), name=name, dtype=dtype)

  def padded_conv(lay, pad, filters, kernel, strides, name):
    return lay.padded_conv(pad, filters, kernel, strides, use_bias=False,
                           kernel_initializer=init(), name=name, dtype=lay.dtype)
  return conv, padded_conv


class RuntimeLayers:
  """The layers of a conv net that change when it runs across replicas, for every conv-net
  workload (ResNet, SSD's backbone, EfficientNet): batch norm pooled over replica groups,
  padding that takes neighbouring slabs' rows under spatial partitioning, the max pool and
  the global average pool over slabs. With runtime None: the plain Keras layers."""

  def __init__(self, runtime, dtype, bn_momentum=0.9, bn_epsilon=1e-5):
    self.runtime, self.dtype = runtime, dtype
    self.bn_momentum, self.bn_epsilon = bn_momentum, bn_epsilon

  def bn(self, name, zero_init=False, real_rows=None):
    """real_rows: under spatial partitioning of a padded image, the image's own rows at this
    level (statistics over them only, the rest zeroed: CrossReplicaBatchNorm)."""
    kw = dict(momentum=self.bn_momentum, epsilon=self.bn_epsilon, name=name, dtype=self.dtype,
              gamma_initializer="zeros" if zero_init else "ones")
    if self.runtime is None:
      return layers.BatchNormalization(**kw)
    return CrossReplicaBatchNorm(self.runtime, real_rows, **kw)

  def pad(self, amount):
    if self.runtime is None:
      return layers.ZeroPadding2D(amount, dtype=self.dtype)
    return HaloPad(self.runtime, (amount, amount), (amount, amount), dtype=self.dtype)

  def padded_conv(self, pad, filters, kernel, strides=1, **conv_kwargs):
    """x -> a VALID conv of x zero-padded by `pad` on every side (a symmetric pad, as the
    MLPerf references' `fixed_padding`); under spatial partitioning the rows come from the
    neighbouring slabs (HaloPad), else the conv pads (PaddedConv2D: no separate pad op)."""
    if self.runtime is not None and self.runtime.spatial > 1:
      padding = self.pad(pad)
      conv = layers.Conv2D(filters, kernel, strides=strides, padding="valid", **conv_kwargs)
      return lambda x: conv(padding(x))
    return PaddedConv2D(filters, kernel, pad, strides=strides, **conv_kwargs)

  def max_pool(self, x, image_height):
    """3x3/2 'same' max pool; across slabs: -inf padding of the global 'same' amounts."""
    if self.runtime is None or self.runtime.spatial == 1:
      return layers.MaxPooling2D(3, 2, padding="same", dtype=self.dtype)(x)
    rows = same_padding(image_height, 3, 2)
    cols = same_padding(x.shape[2], 3, 2)
    x = HaloPad(self.runtime, rows, cols, value=float("-inf"), dtype=self.dtype)(x)
    return layers.MaxPooling2D(3, 2, padding="valid", dtype=self.dtype)(x)

  def global_pool(self, x):
    if self.runtime is None or self.runtime.spatial == 1:
      return layers.GlobalAveragePooling2D(dtype=self.dtype)(x)
    return SpatialGlobalAveragePool(self.runtime, dtype=self.dtype)(x)


# ------------------------------------------------------------------ example-keyed dropout
_EXAMPLES = threading.local()       # per replica thread (tf.distribute traces one per replica)


@contextlib.contextmanager
def examples(step, ids):
  """While a model is applied in training: `step` (the optimizer's iteration) and `ids` [b],
  the global batch indices of its rows, consecutive (a replica's or a micro-batch's share);
  ExampleDropout keys its masks by them."""
  saved = getattr(_EXAMPLES, "value", None)
  _EXAMPLES.value = {"step": step, "ids": ids, "calls": {}}
  try:
    yield
  finally:
    _EXAMPLES.value = saved


class ExampleDropout(layers.Dropout):
  """Dropout whose mask for one example depends on (step, layer, call, example) only, as
  jax_layers.ExampleDropout: a GPipe run's masks do not depend on the stage cut or the
  micro-batches. `key` numbers the layer in its model (the model sets it); each call of the
  layer inside one `examples` context counts as another call site (a residual dropout used
  twice), and a re-materialized stage opens its context again, so it redraws the same masks.
  Outside an `examples` context: Keras' dropout.

  The mask of a step's call is one Philox stream over the whole global batch ([B, ...] in row
  order; key: the layer and call, counter's high word: the step), of which a call draws only
  its rows: the `examples` ids are consecutive, and Philox's counter skips to the first row's
  element (4 numbers per counter value), so a slice costs what Keras' dropout costs.
  (A draw per example, vectorized_map over fold-in seeds, traced into a loop: TF Transformer
  steps ran 3x slower.)"""
  key = 0

  def call(self, inputs, training=False):
    context = getattr(_EXAMPLES, "value", None)
    if not training or self.rate == 0.0 or context is None:
      return super().call(inputs, training=training)
    keep = example_uniform(context, self.key, tf.shape(inputs, out_type=tf.int64)) >= self.rate
    scale = tf.cast(1.0 / (1.0 - self.rate), inputs.dtype)
    return tf.where(keep, inputs * scale, tf.zeros_like(inputs))


def example_uniform(context, key, shape):
  """Uniform [0, 1) float32 numbers of `shape` ([rows, ...]) for the context's rows: the
  call's slice of one Philox stream over the global batch (ExampleDropout says how)."""
  call = context["calls"][key] = context["calls"].get(key, -1) + 1
  per_example = tf.reduce_prod(shape[1:])
  start = tf.cast(context["ids"][0], tf.int64) * per_example     # first element drawn
  skip = start % 4
  counter = tf.cast(tf.stack([start // 4, tf.cast(context["step"], tf.int64)]), tf.uint64)
  uniform = tf.raw_ops.StatelessRandomUniformV2(
      shape=[shape[0] * per_example + skip], key=tf.constant([key * 1024 + call], tf.uint64),
      counter=counter, alg=tf.random.Algorithm.PHILOX.value, dtype=tf.float32)
  return tf.reshape(uniform[skip:], shape)


class ExampleNoise:
  """Uniform noise keyed by example as ExampleDropout's masks (an MoE router's random second
  choice): `key` numbers it among the model's keyed layers; outside an `examples` context
  (or `examples` of other rows than the noise's) a stateless draw from `seed`."""
  key = 0

  def __call__(self, shape, seed):
    context = getattr(_EXAMPLES, "value", None)
    if context is None:
      return tf.random.stateless_uniform(shape, seed)
    return example_uniform(context, self.key, tf.cast(shape, tf.int64))


# ------------------------------------------------------------------- flax parameter paths
# One convention for the five TF models. A Keras variable's path is the key flax's
# traverse_util.flatten_dict gives the same value among the JAX model's variables: the
# collection ('params' or 'batch_stats'), the module path, the leaf. A subclassed model lists
# its modules in sublayers() ({flax module name: Keras layer, variable or dict}); a functional
# model names each layer that has weights by its module path joined with MODULE_SEPARATOR.
MODULE_SEPARATOR = "."
_LEAF_OF_KERAS_NAME = {"gamma": ("params", "scale"), "beta": ("params", "bias"),
                       "embeddings": ("params", "embedding"),
                       "moving_mean": ("batch_stats", "mean"),
                       "moving_variance": ("batch_stats", "var")}


def _leaf(name):
  return _LEAF_OF_KERAS_NAME.get(name, ("params", name))


def _layer_variables(layer):
  """{(collection, leaf): variable} of a layer without sublayers: its Keras weights under
  flax's names, and its ShardedWeights (which Keras does not track)."""
  out = {_leaf(var.name): var for var in layer.weights}
  for value in vars(layer).values():
    if isinstance(value, tf_model_parallel.ShardedWeight):
      out[_leaf(value.name.rsplit("/", 1)[-1])] = value
  return out


def _walk(module_path, node, out):
  if isinstance(node, dict):
    for name, child in node.items():
      _walk(module_path + (name,), child, out)
  elif hasattr(node, "sublayers"):
    _walk(module_path, node.sublayers(), out)
  elif isinstance(node, (tf.Variable, keras.Variable, tf_model_parallel.ShardedWeight)):
    collection, leaf = _leaf(module_path[-1])
    out[(collection,) + module_path[:-1] + (leaf,)] = node
  else:
    for (collection, leaf), var in _layer_variables(node).items():
      out[(collection,) + module_path + (leaf,)] = var


def variables_by_path(model):
  """{flax variable path ('params', 'layer_0', 'query', 'kernel'): Keras variable or
  ShardedWeight} for every variable of `model`; an error if one is left without a path."""
  out = {}
  if hasattr(model, "sublayers"):
    _walk((), model.sublayers(), out)
  else:
    for layer in model.layers:
      if layer.weights:
        _walk(tuple(layer.name.split(MODULE_SEPARATOR)), layer, out)
  covered = {id(v) for v in out.values()}
  missing = [v.path for v in model.weights if id(v) not in covered]
  if missing:
    raise ValueError(f"{model.name}: {len(missing)} variables have no flax path, e.g. "
                     f"{missing[0]}")
  return out


def load_flax_variables(model, variables):
  """Copies a flax variables tree ({'params': ..., 'batch_stats': ...}) into `model`, each
  value reshaped to its Keras variable (a depthwise kernel is flax's [k, k, 1, C] and Keras'
  [k, k, C, 1]; BERT's attention kernels are [H, heads, head_dim] in flax and [H, H] in
  Keras); every Keras variable must be filled and every flax value used."""
  by_path = variables_by_path(model)
  flat = {}

  def flatten(prefix, tree):
    for key, value in tree.items():
      if isinstance(value, dict) or hasattr(value, "items"):
        flatten(prefix + (key,), value)
      else:
        flat[prefix + (key,)] = value
  flatten((), variables)
  if set(flat) != set(by_path):
    extra, lacking = sorted(set(flat) - set(by_path)), sorted(set(by_path) - set(flat))
    raise ValueError(f"{model.name}: the flax variables differ from the model's: "
                     f"{len(extra)} not in the model (e.g. {extra[:1]}), {len(lacking)} "
                     f"missing (e.g. {lacking[:1]})")
  for path, var in by_path.items():
    value = np.asarray(flat[path])
    if isinstance(var, tf_model_parallel.ShardedWeight):
      var.assign_full(value.reshape(var.full_shape))
    else:
      var.assign(value.reshape(var.shape).astype(var.dtype))
  return model


def params_by_path(model):
  """variables_by_path's 'params' collection keyed as the flax params tree is: ('layer_0',
  'query', 'kernel')."""
  return {path[1:]: var for path, var in variables_by_path(model).items() if path[0] == "params"}
