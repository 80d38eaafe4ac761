"""EfficientNet in Keras 3: the architecture of jax_model.py (blocks from spec.blocks), with
keras.applications.EfficientNetB*'s layers and initialisers, so parameter counts equal
keras.applications', and flax weights copy one to one (tf_layers.load_flax_variables): a layer
is named by its flax module path, `block1a.expand_conv` (keras.applications' block1a_expand_conv)
is flax module block1a/expand_conv.

Given a tf_runtime.StrategyRuntime with several replicas, batch norm pools statistics over
groups of replicas (workloads/parallel/tf_layers.py). No spatial partitioning.
"""
import keras
import tensorflow as tf
from keras import layers

from workloads.common import conv_geometry
from workloads.efficientnet import spec
from workloads.parallel import tf_layers

# Built per layer, after keras.utils.set_random_seed (see resnet/tf_model.py on seeding).
conv_init = lambda: keras.initializers.VarianceScaling(2.0, "fan_out", "truncated_normal")
dense_init = lambda: keras.initializers.VarianceScaling(1.0 / 3.0, "fan_out", "uniform")


def _conv(filters, kernel, name, dtype, strides=1, use_bias=False, activation=None):
  return layers.Conv2D(filters, kernel, strides=strides, padding="same", use_bias=use_bias,
                       activation=activation, kernel_initializer=conv_init(), name=name,
                       dtype=dtype)


class DepthwiseConv2DTaps(layers.DepthwiseConv2D):
  """Keras' DepthwiseConv2D ('same', no bias; the same kernel variable) computed as the sum of
  its k x k taps (conv_geometry.DepthwiseTaps), for a step XLA compiles for a CPU: XLA:CPU's grouped
  conv is a naive loop nest. TF's own CPU kernel (no XLA) is fast and stays."""

  def call(self, inputs):
    _, h, w, _ = inputs.shape
    stride = self.strides[0]
    taps = conv_geometry.DepthwiseTaps(h, w, self.kernel_size[0], stride)
    x = tf.pad(inputs, [(0, 0), taps.rows, taps.cols, (0, 0)])
    kernel = tf.cast(self.kernel, x.dtype)
    out = None
    for i, j, (top, left), (bottom, right) in taps:
      tap = x[:, top:bottom:stride, left:right:stride, :] * kernel[i, j, :, 0]
      out = tap if out is None else out + tap
    return out


def _mbconv(inputs, b, lay, depthwise):
  dtype, x = lay.dtype, inputs
  filters = b.filters_in * b.expand_ratio
  if b.expand_ratio != 1:
    x = _conv(filters, 1, f"{b.name}.expand_conv", dtype)(x)
    x = layers.Activation("swish", dtype=dtype)(lay.bn(f"{b.name}.expand_bn")(x))
  x = depthwise(b.kernel, b.strides, padding="same", use_bias=False,
                depthwise_initializer=conv_init(), name=f"{b.name}.dwconv", dtype=dtype)(x)
  x = layers.Activation("swish", dtype=dtype)(lay.bn(f"{b.name}.bn")(x))
  se = layers.GlobalAveragePooling2D(keepdims=True, dtype=dtype)(x)
  se = _conv(b.se_filters, 1, f"{b.name}.se_reduce", dtype, use_bias=True, activation="swish")(se)
  se = _conv(filters, 1, f"{b.name}.se_expand", dtype, use_bias=True, activation="sigmoid")(se)
  x = layers.Multiply(dtype=dtype)([x, se])
  x = _conv(b.filters_out, 1, f"{b.name}.project_conv", dtype)(x)
  x = lay.bn(f"{b.name}.project_bn")(x)
  if b.residual:
    if b.drop_rate > 0:           # stochastic depth: one draw per example
      x = layers.Dropout(b.drop_rate, noise_shape=(None, 1, 1, 1), dtype=dtype)(x)
    x = layers.Add(dtype=dtype)([x, inputs])
  return x


def build(cfg, dtype="float32", runtime=None, depthwise_taps=False) -> keras.Model:
  """The model of the workload config `cfg` (cfg.model, for cfg.data.image_size images).
  dtype 'mixed_bfloat16' computes in bf16 with float32 variables; 'float64' (parity tests).
  `runtime`: a distributed tf_runtime.StrategyRuntime, or None for one replica.
  depthwise_taps: depthwise convs as DepthwiseConv2DTaps (for a step XLA compiles for a CPU)."""
  depthwise = DepthwiseConv2DTaps if depthwise_taps else layers.DepthwiseConv2D
  m, image_size = cfg.model, cfg.data.image_size
  lay = tf_layers.RuntimeLayers(runtime, dtype, bn_momentum=m.bn_momentum,
                                bn_epsilon=spec.BN_EPSILON)
  io_dtype = "float64" if dtype == "float64" else "float32"
  inputs = keras.Input((image_size, image_size, 3), dtype=io_dtype)
  x = _conv(spec.round_filters(spec.STEM_FILTERS, m.width_coefficient), 3, "stem_conv", dtype,
            strides=2)(inputs)
  x = layers.Activation("swish", dtype=dtype)(lay.bn("stem_bn")(x))
  for block in spec.blocks(m.width_coefficient, m.depth_coefficient, m.drop_connect_rate):
    x = _mbconv(x, block, lay, depthwise)
  x = _conv(spec.round_filters(spec.TOP_FILTERS, m.width_coefficient), 1, "top_conv", dtype)(x)
  x = layers.Activation("swish", dtype=dtype)(lay.bn("top_bn")(x))
  x = layers.GlobalAveragePooling2D(dtype=dtype)(x)
  if m.dropout_rate > 0:
    x = layers.Dropout(m.dropout_rate, dtype=dtype)(x)
  x = layers.Dense(m.num_classes, kernel_initializer=dense_init(), name="predictions",
                   dtype=dtype)(x)
  outputs = layers.Activation("linear", dtype=io_dtype)(x)
  return keras.Model(inputs, outputs, name=f"efficientnet_{m.variant}")


def batch_norm_variables(model):
  """gamma and beta of every batch norm: the variables without the L2 term (by layer role)."""
  return [w for layer in model.layers if isinstance(layer, layers.BatchNormalization)
          for w in (layer.gamma, layer.beta)]
