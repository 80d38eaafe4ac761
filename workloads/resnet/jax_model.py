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

from workloads.parallel.jax_layers import remat_block

# He-normal on fan-out for convs (as Keras' ResNet50 and the flax example); the MLPerf reference
# initialises the classifier with N(0, 0.01).
conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
dense_init = nn.initializers.normal(stddev=0.01)


class BottleneckBlock(nn.Module):
  filters: int
  strides: int
  conv: Any
  norm: Any                         # BatchNorm partial; use_running_average is given per call

  @nn.compact
  def __call__(self, x, train: bool = True):
    norm = functools.partial(self.norm, use_running_average=not train)
    residual = x
    y = self.conv(self.filters, (1, 1), padding="VALID")(x)
    y = nn.relu(norm()(y))
    y = self.conv(self.filters, (3, 3), strides=(self.strides, self.strides),
                  padding=((1, 1), (1, 1)))(y)
    y = nn.relu(norm()(y))
    y = self.conv(self.filters * 4, (1, 1), padding="VALID")(y)
    # Zero-init of the last BN scale: each block starts as the identity (MLPerf reference).
    y = norm(scale_init=nn.initializers.zeros)(y)
    if residual.shape != y.shape:
      residual = self.conv(self.filters * 4, (1, 1), strides=(self.strides, self.strides),
                           padding="VALID", name="proj_conv")(residual)
      residual = norm(name="proj_bn")(residual)
    return nn.relu(residual + y)


class ResNet(nn.Module):
  """The network as a list of layers (`layer(i, x, train)`): the bottleneck blocks, the stem
  riding with the first and the classifier with the last, which is where GPipe
  (workloads/parallel/jax_pipeline.py) may cut it. Submodules keep the names nn.compact gave
  them (stem_conv, stem_bn, BottleneckBlock_<i>, classifier)."""
  stage_sizes: Sequence[int]
  num_classes: int
  width: int = 64
  dtype: Any = jnp.float32          # compute dtype; parameters stay float32
  bn_axis_name: Any = None          # mesh axis whose devices pool batch statistics (shard_map)
  remat_policy: str = ""            # parallel.remat_policy, per bottleneck block (jax_layers)

  def setup(self):
    conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype, kernel_init=conv_init)
    norm = functools.partial(nn.BatchNorm, momentum=0.9, epsilon=1e-5, dtype=self.dtype,
                             axis_name=self.bn_axis_name)
    self.stem_conv = conv(self.width, (7, 7), strides=(2, 2), padding=((3, 3), (3, 3)))
    self.stem_bn = norm()
    self.blocks = [(stage, block) for stage, count in enumerate(self.stage_sizes)
                   for block in range(count)]
    for i, (stage, block) in enumerate(self.blocks):
      setattr(self, f"BottleneckBlock_{i}", remat_block(BottleneckBlock, self.remat_policy, (2,))(
          self.width * 2**stage, 2 if stage > 0 and block == 0 else 1, conv=conv, norm=norm))
    self.classifier = nn.Dense(self.num_classes, dtype=self.dtype, kernel_init=dense_init)

  @property
  def num_layers(self) -> int:
    return sum(self.stage_sizes)

  def layer(self, i, x, train: bool = True):
    """Layer i of the list: block i, the stem before block 0, the classifier after the last."""
    if i == 0:
      x = x.astype(self.dtype)
      x = nn.relu(self.stem_bn(self.stem_conv(x), use_running_average=not train))
      x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
    x = getattr(self, f"BottleneckBlock_{i}")(x, train)
    if i == self.num_layers - 1:
      x = jnp.mean(x, axis=(1, 2))
      x = self.classifier(x)
      x = x.astype(jnp.promote_types(self.dtype, jnp.float32))   # bf16 -> f32 logits
    return x

  def layers(self, x, start, end, train: bool = True):
    for i in range(start, end):
      x = self.layer(i, x, train)
    return x

  def __call__(self, x, train: bool = True):
    return self.layers(x, 0, self.num_layers, train)



def build(cfg, dtype=jnp.float32, bn_axis_name=None) -> ResNet:
  """The model of the workload config `cfg` (cfg.model), computing in `dtype`; batch norm
  pools statistics over the mesh axis `bn_axis_name`."""
  m = cfg.model
  return ResNet(stage_sizes=m.stage_sizes, num_classes=m.num_classes, width=m.width, dtype=dtype,
                bn_axis_name=bn_axis_name, remat_policy=cfg.parallel.remat_policy)
