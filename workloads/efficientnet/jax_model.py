"""EfficientNet in flax: the same blocks (spec.blocks), initialisation and parameter names as
tf_model.py and keras.applications.EfficientNetB* (flax path block1a/expand_conv is Keras'
layer block1a_expand_conv), so weights copy one to one.

MBConv: 1x1 expand (skipped at ratio 1) -> BN -> swish -> depthwise kxk (stride) -> BN ->
swish -> squeeze-and-excite (global mean -> 1x1 to 0.25 x block input, swish -> 1x1 back,
sigmoid -> scale) -> 1x1 project -> BN (-> stochastic depth -> + input, when shapes allow).
Convs pad 'SAME' (TF's rule, which keras.applications' correct_pad equals at stride 2).
"""
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from workloads.common import conv_geometry
from workloads.efficientnet import spec
from workloads.parallel.jax_layers import remat_block

# keras.applications' initialisers: VarianceScaling(2, fan_out, truncated normal) for convs,
# (1/3, fan_out, uniform) for the classifier. A depthwise kernel is [k, k, C, 1] in Keras (fan
# out k*k) and [k, k, 1, C] in flax, whose fan *in* is that same k*k.
conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "truncated_normal")
depthwise_init = nn.initializers.variance_scaling(2.0, "fan_in", "truncated_normal")
dense_init = nn.initializers.variance_scaling(1.0 / 3.0, "fan_out", "uniform")


def depthwise_as_taps(x, kernel, stride):
  """A depthwise 'SAME' conv as the sum of its k x k taps (conv_geometry.DepthwiseTaps): the function
  of lax.conv_general_dilated with feature_group_count = channels, in ops XLA:CPU fuses."""
  n, h, w, c = x.shape
  taps = conv_geometry.DepthwiseTaps(h, w, kernel.shape[0], stride)
  x = jnp.pad(x, ((0, 0), taps.rows, taps.cols, (0, 0)))
  out = None
  for i, j, (top, left), (bottom, right) in taps:
    tap = lax.slice(x, (0, top, left, 0), (n, bottom, right, c), (1, stride, stride, 1))
    out = tap * kernel[i, j, 0] if out is None else out + tap * kernel[i, j, 0]
  return out


class DepthwiseConv(nn.Module):
  """nn.Conv with feature_group_count = channels, 'SAME', no bias (the same kernel parameter,
  [k, k, 1, C]): on the CPU backend computed as taps, elsewhere as the backend's grouped conv
  (cuDNN, TPU)."""
  kernel_size: int
  strides: int = 1
  dtype: Any = jnp.float32
  kernel_init: Any = None

  @nn.compact
  def __call__(self, x):
    channels = x.shape[-1]
    kernel = self.param("kernel", self.kernel_init,
                        (self.kernel_size, self.kernel_size, 1, channels), jnp.float32)
    x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=self.dtype)
    if jax.default_backend() == "cpu":
      return depthwise_as_taps(x, kernel, self.strides)
    return lax.conv_general_dilated(x, kernel, (self.strides,) * 2, "SAME",
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                    feature_group_count=channels)


class MBConv(nn.Module):
  block: spec.Block
  conv: Any
  norm: Any
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, inputs, train: bool):
    b = self.block
    x = inputs
    filters = b.filters_in * b.expand_ratio
    if b.expand_ratio != 1:
      x = self.conv(filters, (1, 1), name="expand_conv")(x)
      x = nn.swish(self.norm(name="expand_bn")(x))
    x = DepthwiseConv(b.kernel, b.strides, dtype=self.dtype, kernel_init=depthwise_init,
                      name="dwconv")(x)
    x = nn.swish(self.norm(name="bn")(x))
    se = jnp.mean(x, axis=(1, 2), keepdims=True)
    se = nn.swish(self.conv(b.se_filters, (1, 1), use_bias=True, name="se_reduce")(se))
    se = nn.sigmoid(self.conv(filters, (1, 1), use_bias=True, name="se_expand")(se))
    x = self.conv(b.filters_out, (1, 1), name="project_conv")(x * se)
    x = self.norm(name="project_bn")(x)
    if b.residual:
      # Stochastic depth: drop the whole branch per example, scale survivors by 1/(1 - rate).
      x = nn.Dropout(b.drop_rate, broadcast_dims=(1, 2, 3))(x, deterministic=not train)
      x = x + inputs
    return x


class EfficientNet(nn.Module):
  width_coefficient: float
  depth_coefficient: float
  dropout_rate: float
  num_classes: int = 1000
  drop_connect_rate: float = 0.2
  bn_momentum: float = spec.BN_MOMENTUM
  dtype: Any = jnp.float32          # compute dtype; parameters stay float32
  bn_axis_name: Any = None          # mesh axis whose devices pool batch statistics (shard_map)
  remat_policy: str = ""            # parallel.remat_policy, per MBConv block (jax_layers)

  @nn.compact
  def __call__(self, x, train: bool = True):
    conv = functools.partial(nn.Conv, use_bias=False, padding="SAME", dtype=self.dtype,
                             kernel_init=conv_init)
    norm = functools.partial(nn.BatchNorm, use_running_average=not train,
                             momentum=self.bn_momentum, epsilon=spec.BN_EPSILON, dtype=self.dtype,
                             axis_name=self.bn_axis_name if train else None)
    filters = functools.partial(spec.round_filters, width_coefficient=self.width_coefficient)
    x = x.astype(self.dtype)
    x = conv(filters(spec.STEM_FILTERS), (3, 3), strides=(2, 2), name="stem_conv")(x)
    x = nn.swish(norm(name="stem_bn")(x))
    for block in spec.blocks(self.width_coefficient, self.depth_coefficient,
                             self.drop_connect_rate):
      x = remat_block(MBConv, self.remat_policy, (2,))(block, conv, norm, self.dtype,
                                                       name=block.name)(x, train)
    x = conv(filters(spec.TOP_FILTERS), (1, 1), name="top_conv")(x)
    x = nn.swish(norm(name="top_bn")(x))
    x = jnp.mean(x, axis=(1, 2))
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)
    x = nn.Dense(self.num_classes, dtype=self.dtype, kernel_init=dense_init, name="predictions")(x)
    return x.astype(jnp.promote_types(self.dtype, jnp.float32))   # bf16 -> f32 logits


def build(cfg, dtype=jnp.float32, bn_axis_name=None) -> EfficientNet:
  """The model of the workload config `cfg` (cfg.model), computing in `dtype`; batch norm
  pools statistics over the mesh axis `bn_axis_name`."""
  m = cfg.model
  return EfficientNet(m.width_coefficient, m.depth_coefficient, m.dropout_rate, m.num_classes,
                      m.drop_connect_rate, m.bn_momentum, dtype=dtype, bn_axis_name=bn_axis_name,
                      remat_policy=cfg.parallel.remat_policy)
