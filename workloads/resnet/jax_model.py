"""ResNet v1.5 in flax (the MLPerf reference architecture).

v1.5 = the stride-2 of a downsampling bottleneck sits on its 3x3 conv, not on the first 1x1.
Convs have no bias (batch norm follows each); 3x3 and 7x7 convs pad symmetrically as the
MLPerf TF reference's `fixed_padding` does. At stage_sizes=(3, 4, 6, 3), width=64 and 1000
classes the model has exactly 25,557,032 parameters.
"""
import functools
from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp

# He-normal on fan-out for convs (as Keras' ResNet50 and the flax example); the MLPerf reference
# initialises the classifier with N(0, 0.01).
conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
dense_init = nn.initializers.normal(stddev=0.01)


class BottleneckBlock(nn.Module):
  filters: int
  strides: int
  conv: Any
  norm: Any

  @nn.compact
  def __call__(self, x):
    residual = x
    y = self.conv(self.filters, (1, 1), padding="VALID")(x)
    y = nn.relu(self.norm()(y))
    y = self.conv(self.filters, (3, 3), strides=(self.strides, self.strides),
                  padding=((1, 1), (1, 1)))(y)
    y = nn.relu(self.norm()(y))
    y = self.conv(self.filters * 4, (1, 1), padding="VALID")(y)
    # Zero-init of the last BN scale: each block starts as the identity (MLPerf reference).
    y = self.norm(scale_init=nn.initializers.zeros)(y)
    if residual.shape != y.shape:
      residual = self.conv(self.filters * 4, (1, 1), strides=(self.strides, self.strides),
                           padding="VALID", name="proj_conv")(residual)
      residual = self.norm(name="proj_bn")(residual)
    return nn.relu(residual + y)


class ResNet(nn.Module):
  stage_sizes: Sequence[int]
  num_classes: int
  width: int = 64
  dtype: Any = jnp.float32          # compute dtype; parameters stay float32
  bn_axis_name: Any = None          # mesh axis whose devices pool batch statistics (shard_map)

  @nn.compact
  def __call__(self, x, train: bool = True):
    conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype, kernel_init=conv_init)
    norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9,
                             epsilon=1e-5, dtype=self.dtype,
                             axis_name=self.bn_axis_name if train else None)
    x = x.astype(self.dtype)
    x = conv(self.width, (7, 7), strides=(2, 2), padding=((3, 3), (3, 3)), name="stem_conv")(x)
    x = nn.relu(norm(name="stem_bn")(x))
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
    for stage, num_blocks in enumerate(self.stage_sizes):
      for block in range(num_blocks):
        strides = 2 if stage > 0 and block == 0 else 1
        x = BottleneckBlock(self.width * 2**stage, strides, conv=conv, norm=norm)(x)
    x = jnp.mean(x, axis=(1, 2))
    x = nn.Dense(self.num_classes, dtype=self.dtype, kernel_init=dense_init, name="classifier")(x)
    return x.astype(jnp.promote_types(self.dtype, jnp.float32))   # bf16 -> f32 logits


ResNet50 = functools.partial(ResNet, stage_sizes=(3, 4, 6, 3))
