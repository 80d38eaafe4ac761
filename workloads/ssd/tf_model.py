"""SSD300-ResNet34 in Keras 3: the same architecture, names (flax module paths joined by '.'),
initialisation and output layout as jax_model.py, so weights convert one to one
(tf_layers.load_flax_variables). Given a tf_runtime.StrategyRuntime with several replicas,
batch norm pools statistics over replica groups (workloads/parallel/tf_layers.py). Under spatial
partitioning each replica's backbone computes its slab of rows (halo exchange at every padded
conv, statistics over the slabs), and the backbone's map is gathered whole for the extra layers
and heads, which every replica of the spatial group then computes alike (the loss counts each
image once: tf_trainer divides by the spatial size).
"""
import numpy as np
import keras
from keras import layers

from workloads.parallel import tf_layers
from workloads.ssd import spec

# Built per layer, after keras.utils.set_random_seed (an initializer draws its seed when made).
backbone_init = lambda: keras.initializers.VarianceScaling(2.0, "fan_out", "untruncated_normal")
head_init = lambda: keras.initializers.GlorotUniform()


def torch_bias_init(fan_in):
  bound = 1.0 / np.sqrt(fan_in)
  return keras.initializers.RandomUniform(-bound, bound)


_conv, _padded_conv = tf_layers.bias_free_convs(backbone_init)


def _basic_block(x, filters, strides, project, prefix, lay, rows):
  """rows: the image's own rows at the block's output (None: every row is the image's)."""
  dtype = lay.dtype
  y = _padded_conv(lay, 1, filters, 3, strides, f"{prefix}.conv1")(x)
  y = layers.ReLU(dtype=dtype)(lay.bn(f"{prefix}.bn1", real_rows=rows)(y))
  y = _padded_conv(lay, 1, filters, 3, 1, f"{prefix}.conv2")(y)
  y = lay.bn(f"{prefix}.bn2", real_rows=rows)(y)
  if project:
    x = lay.bn(f"{prefix}.downsample_bn", real_rows=rows)(
        _conv(filters, 1, strides, f"{prefix}.downsample_conv", dtype)(x))
  return layers.ReLU(dtype=dtype)(layers.Add(dtype=dtype)([x, y]))


def _head_conv(x, filters, kernel, stride, pad, name, dtype):
  c_in = x.shape[-1]
  return tf_layers.PaddedConv2D(filters, kernel, pad, strides=stride, name=name, dtype=dtype,
                                kernel_initializer=head_init(),
                                bias_initializer=torch_bias_init(c_in * kernel * kernel))(x)


def _by_anchor(x, per_anchor, k, dtype):
  """(N, H, W, per_anchor * k) -> (N, k * H * W, per_anchor), channel = value * k + anchor."""
  h, w = x.shape[1], x.shape[2]
  x = layers.Reshape((h, w, per_anchor, k), dtype=dtype)(x)
  x = layers.Permute((4, 1, 2, 3), dtype=dtype)(x)
  return layers.Reshape((k * h * w, per_anchor), dtype=dtype)(x)


def build(cfg, dtype="float32", runtime=None) -> keras.Model:
  """The model of the workload config `cfg` (cfg.model at cfg.data.image_size).
  dtype 'mixed_bfloat16' computes in bf16 with float32 variables, like the flax model;
  'float64' everywhere (the parity tests). Outputs (locs (N, A, 4), logits (N, A, C))."""
  m, size = cfg.model, cfg.data.image_size
  lay = tf_layers.RuntimeLayers(runtime, dtype, bn_momentum=m.bn_momentum, bn_epsilon=1e-5)
  io_dtype = "float64" if dtype == "float64" else "float32"
  spatial = runtime.spatial if runtime is not None else 1
  # this replica's row slab; under spatial partitioning the image is padded to rows that split
  # at every backbone level (spec.spatial_rows), and each level's rows past the image's own
  # extent are zeroed (the layers' `real`: None where nothing is padded)
  rows = spec.spatial_rows(cfg, spatial) if spatial > 1 else size
  real = spec.real_rows(size, m) if rows != size else [None] * (len(m.backbone_blocks) + 2)
  inputs = keras.Input((rows // spatial, size, 3), dtype=io_dtype)
  x = _padded_conv(lay, 3, m.backbone_width, 7, 2, "conv1")(inputs)
  x = layers.ReLU(dtype=dtype)(lay.bn("bn1", real_rows=real[0])(x))
  # torchvision pads the max pool with -inf; after a ReLU, zero padding gives the same maxima
  x = layers.MaxPooling2D(3, 2, padding="valid", dtype=dtype)(lay.pad(1)(x))
  if real[1] is not None:
    x = tf_layers.ImageRows(runtime, real[1], dtype=dtype)(x)
  n_layers, channels = len(m.backbone_blocks), m.backbone_width
  for i, blocks in enumerate(m.backbone_blocks):
    filters = m.backbone_width * 2**i
    for b in range(blocks):
      strides = 2 if b == 0 and 0 < i < n_layers - 1 else 1
      project = b == 0 and (strides != 1 or channels != filters)
      x = _basic_block(x, filters, strides, project, f"layer{i + 1}_{b}", lay, real[2 + i])
      channels = filters
  if spatial > 1:             # the extra layers' few rows do not split: the whole map on each
    x = tf_layers.SpatialGather(runtime, dtype=dtype)(x)
    if real[-1] is not None:  # the padding's last rows (56 px at spatial=2: 8 rows, 7 real)
      x = layers.Cropping2D(((0, x.shape[1] - real[-1]), (0, 0)), dtype=dtype)(x)
  maps = [x]
  for i, (middle, out, stride, pad) in enumerate(spec.extra_layers(m)):
    x = layers.ReLU(dtype=dtype)(_head_conv(x, middle, 1, 1, 0, f"extra{i}_conv1", dtype))
    x = layers.ReLU(dtype=dtype)(_head_conv(x, out, 3, stride, pad, f"extra{i}_conv2", dtype))
    maps.append(x)
  locs, logits = [], []
  for i, (fmap, k) in enumerate(zip(maps, m.anchors_per_location)):
    locs.append(_by_anchor(_head_conv(fmap, 4 * k, 3, 1, 1, f"loc{i}", dtype), 4, k, dtype))
    logits.append(_by_anchor(_head_conv(fmap, m.num_classes * k, 3, 1, 1, f"conf{i}", dtype),
                             m.num_classes, k, dtype))
  loc = layers.Activation("linear", dtype=io_dtype)(layers.Concatenate(1, dtype=dtype)(locs))
  conf = layers.Activation("linear", dtype=io_dtype)(layers.Concatenate(1, dtype=dtype)(logits))
  return keras.Model(inputs, [loc, conf], name="ssd")
