"""SSD300-ResNet34 in flax (the MLPerf reference's ssd300.py; geometry in spec.py).

Names follow torchvision's ResNet-34 (conv1, bn1, layer1_0/conv1, ..., layer3_0/downsample_conv)
so an ImageNet checkpoint maps one to one (checkpoint.py); tf_model.py uses the same names
joined by '_'. Initialisation as the reference: the backbone as torchvision (He normal on
fan-out, batch norm 1/0) when no checkpoint is loaded; extra layers and heads Xavier-uniform
kernels and torch's default bias, U(+-1/sqrt(fan_in)).

The heads' outputs are laid out as the reference's `view(N, 4, -1)` of an NCHW map: channel
c = coordinate * k + anchor, and anchors ordered (anchor, row, column) within a map, maps in
order -- the order of boxes.default_boxes.
"""
import functools
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from workloads.parallel.jax_layers import remat_block
from workloads.ssd import spec

backbone_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")   # not truncated
head_init = nn.initializers.xavier_uniform()


def torch_bias_init(fan_in):
  """torch.nn.Conv2d's default bias: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
  bound = 1.0 / np.sqrt(fan_in)
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound,
                                                                   bound)


class BasicBlock(nn.Module):
  """torchvision's BasicBlock: 3x3 (stride) -> BN -> ReLU -> 3x3 -> BN, plus the identity or a
  1x1 projection (when the stride or the width changes)."""
  filters: int
  strides: int
  project: bool
  conv: Any
  norm: Any

  @nn.compact
  def __call__(self, x):
    s = (self.strides, self.strides)
    y = self.conv(self.filters, (3, 3), strides=s, padding=((1, 1), (1, 1)), name="conv1")(x)
    y = nn.relu(self.norm(name="bn1")(y))
    y = self.conv(self.filters, (3, 3), padding=((1, 1), (1, 1)), name="conv2")(y)
    y = self.norm(name="bn2")(y)
    if self.project:
      x = self.conv(self.filters, (1, 1), strides=s, padding="VALID", name="downsample_conv")(x)
      x = self.norm(name="downsample_bn")(x)
    return nn.relu(x + y)


class SSD(nn.Module):
  model_cfg: Any                    # spec.ModelConfig
  feature_sizes: Sequence[int]      # rows of each map the heads read (spec.feature_maps)
  dtype: Any = jnp.float32          # compute dtype; parameters stay float32
  bn_axis_name: Any = None          # mesh axis whose devices pool batch statistics (shard_map)
  remat_policy: str = ""            # parallel.remat_policy, per backbone block (jax_layers)

  @nn.compact
  def __call__(self, x, train: bool = True):
    m = self.model_cfg
    conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype, kernel_init=backbone_init)
    norm = functools.partial(nn.BatchNorm, use_running_average=not train,
                             momentum=m.bn_momentum, epsilon=1e-5, dtype=self.dtype,
                             axis_name=self.bn_axis_name if train else None)
    x = x.astype(self.dtype)
    x = conv(m.backbone_width, (7, 7), strides=(2, 2), padding=((3, 3), (3, 3)), name="conv1")(x)
    x = nn.relu(norm(name="bn1")(x))
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    layers = len(m.backbone_blocks)
    channels = m.backbone_width
    for i, blocks in enumerate(m.backbone_blocks):
      filters = m.backbone_width * 2**i
      for b in range(blocks):
        # the last layer (ResNet-34's layer3) keeps stride 1: a 38x38 map at 300 px
        strides = 2 if b == 0 and 0 < i < layers - 1 else 1
        project = b == 0 and (strides != 1 or channels != filters)
        x = remat_block(BasicBlock, self.remat_policy)(filters, strides, project, conv, norm,
                                                       name=f"layer{i + 1}_{b}")(x)
        channels = filters
    maps = [x]
    for i, (middle, out, stride, pad) in enumerate(spec.extra_layers(m)):
      x = self._conv(middle, 1, 1, 0, channels, f"extra{i}_conv1")(x)
      x = nn.relu(x)
      x = self._conv(out, 3, stride, pad, middle, f"extra{i}_conv2")(x)
      x = nn.relu(x)
      maps.append(x)
      channels = out
    locs, logits = [], []
    for i, (fmap, k) in enumerate(zip(maps, m.anchors_per_location)):
      c_in = fmap.shape[-1]
      locs.append(_by_anchor(self._conv(4 * k, 3, 1, 1, c_in, f"loc{i}")(fmap), 4, k))
      logits.append(_by_anchor(self._conv(m.num_classes * k, 3, 1, 1, c_in, f"conf{i}")(fmap),
                               m.num_classes, k))
    out = jnp.promote_types(self.dtype, jnp.float32)
    return jnp.concatenate(locs, 1).astype(out), jnp.concatenate(logits, 1).astype(out)

  def _conv(self, filters, kernel, stride, pad, c_in, name):
    return nn.Conv(filters, (kernel, kernel), strides=(stride, stride),
                   padding=((pad, pad), (pad, pad)), dtype=self.dtype, kernel_init=head_init,
                   bias_init=torch_bias_init(c_in * kernel * kernel), name=name)


def _by_anchor(x, per_anchor, k):
  """(N, H, W, per_anchor * k) -> (N, k * H * W, per_anchor), channel = value * k + anchor."""
  n, h, w, _ = x.shape
  x = x.reshape(n, h, w, per_anchor, k).transpose(0, 4, 1, 2, 3)
  return x.reshape(n, k * h * w, per_anchor)


def build(cfg, dtype=jnp.float32, bn_axis_name=None) -> SSD:
  """The model of the workload config `cfg` (cfg.model at cfg.data.image_size), computing in
  `dtype`; batch norm pools statistics over the mesh axis `bn_axis_name`."""
  return SSD(cfg.model, tuple(s for s, _ in spec.feature_maps(cfg)), dtype=dtype,
             bn_axis_name=bn_axis_name, remat_policy=cfg.parallel.remat_policy)


# ----------------------------------------------------------------------------- the loss

def smooth_l1(x):
  ax = jnp.abs(x)
  return jnp.where(ax < 1.0, 0.5 * x * x, ax - 0.5)


def hardest(values, k):
  """(N, A) bool: each row's k largest values, ties to the lower index: the anchors whose
  rank in a stable descending sort is below k (the reference's sort, then its first k). One
  sort of the values and a count, instead of ranking by two argsorts (SSD mini train step
  ~5 ms less of ~200 on 2 CPU cores)."""
  last = jnp.clip(k - 1, 0, values.shape[1] - 1)[:, None]
  kth = jnp.take_along_axis(-jnp.sort(-values, axis=1), last, axis=1)       # the k-th largest
  above, tie = values > kth, values == kth
  room = k[:, None] - above.sum(1, keepdims=True)          # how many of the ties fit in k
  return above | (tie & (jnp.cumsum(tie, axis=1) <= room))


def ssd_loss(locs, logits, gt_offsets, gt_labels, neg_ratio=3):
  """Per image: (sum of smooth-L1 over positives + cross entropy over positives and the
  neg_ratio x positives hardest negatives) / positives; images without positives count 0; the
  batch mean. Negatives rank by their loss, descending, ties by anchor index (stable sort)."""
  positive = gt_labels > 0
  num_pos = positive.sum(1)
  loc_loss = (smooth_l1(locs - gt_offsets).sum(-1) * positive).sum(1)
  con = optax.softmax_cross_entropy_with_integer_labels(logits, gt_labels)
  con_neg = jax.lax.stop_gradient(jnp.where(positive, 0.0, con))
  negative = hardest(con_neg, jnp.minimum(neg_ratio * num_pos, con.shape[1]))
  con_loss = (con * (positive | negative)).sum(1)
  per_image = (loc_loss + con_loss) * (num_pos > 0) / jnp.maximum(num_pos, 1e-6)
  return per_image.mean()
