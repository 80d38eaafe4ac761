"""ResNet v1.5 in Keras 3: the same architecture, layer order and initialisation as
jax_model.py, so parameters convert one to one (tf_layers.load_flax_variables: a layer with
weights is named by its flax module path).

v1.5: the stride of a downsampling bottleneck sits on its 3x3 conv. Convs have no bias; 3x3 and
7x7 convs pad symmetrically, as the MLPerf TF reference's `fixed_padding` does, inside the conv
op (tf_layers.PaddedConv2D: a separate pad op cost a sixth of the step). At
stage_sizes=(3, 4, 6, 3), width=64, 1000 classes: 25,557,032 params.

Given a tf_runtime.StrategyRuntime with several replicas, batch norm pools statistics across
replicas (groups of bn_group_size) and, under spatial partitioning, the model sees a slab of
H/k image rows: every padding before a conv or pool whose window crosses a slab edge takes the
neighbours' rows (halo exchange) and the global average pool sums over the slabs
(workloads/parallel/tf_layers.py).
"""
import keras
from keras import layers

from workloads.parallel import tf_layers, tf_pipeline
from workloads.resnet.spec import check_spatial_partitions  # neutral: cli checks it too

# Flax's variance_scaling(2.0, 'fan_out', 'normal') is a truncated normal: Keras' equivalent.
# Built per layer, after keras.utils.set_random_seed: an initializer made without a seed draws
# its own seed when constructed, so one made at import would differ from process to process.
conv_init = lambda: keras.initializers.VarianceScaling(2.0, "fan_out", "truncated_normal")
dense_init = lambda: keras.initializers.RandomNormal(stddev=0.01)
_conv, _padded_conv = tf_layers.bias_free_convs(conv_init)


def _bottleneck(x, filters, strides, prefix, lay):
  dtype = lay.dtype
  residual = x
  y = _conv(filters, 1, name=f"{prefix}.Conv_0", dtype=dtype)(x)
  y = layers.ReLU(dtype=dtype)(lay.bn(f"{prefix}.BatchNorm_0")(y))
  y = _padded_conv(lay, 1, filters, 3, strides, f"{prefix}.Conv_1")(y)
  y = layers.ReLU(dtype=dtype)(lay.bn(f"{prefix}.BatchNorm_1")(y))
  y = _conv(filters * 4, 1, name=f"{prefix}.Conv_2", dtype=dtype)(y)
  y = lay.bn(f"{prefix}.BatchNorm_2", zero_init=True)(y)   # each block starts as identity
  if residual.shape[-1] != filters * 4 or strides != 1:
    residual = _conv(filters * 4, 1, strides, name=f"{prefix}.proj_conv", dtype=dtype)(residual)
    residual = lay.bn(f"{prefix}.proj_bn")(residual)
  return layers.ReLU(name=f"{prefix}_out", dtype=dtype)(layers.Add(dtype=dtype)([residual, y]))


def block_names(stage_sizes):
  """The flax module name of every bottleneck, in order: the Keras layers of block i are
  named 'BottleneckBlock_<i>.Conv_0' and so on (tf_layers' path convention)."""
  return [f"BottleneckBlock_{i}" for i in range(sum(stage_sizes))]


def build(cfg, dtype="float32", runtime=None, stages=None) -> keras.Model:
  """The model of the workload config `cfg` (cfg.model, for cfg.data.image_size images).
  dtype 'mixed_bfloat16' computes in bf16 with float32 variables, like the flax model;
  'float64' everywhere (the parity tests). `runtime`: a distributed
  tf_runtime.StrategyRuntime, or None for one replica. `stages`: a pipeline's placement
  [(device, (first block, end block))]: each block's weights made on its stage's device (the
  stem with the first block, the classifier with the last; tf_pipeline.on_stage_device)."""
  stage_sizes, image_size, width = cfg.model.stage_sizes, cfg.data.image_size, cfg.model.width
  if runtime is not None:
    check_spatial_partitions(stage_sizes, image_size, runtime.spatial)
  lay = tf_layers.RuntimeLayers(runtime, dtype, bn_momentum=0.9, bn_epsilon=1e-5)
  rows = image_size // (runtime.spatial if runtime is not None else 1)
  io_dtype = "float64" if dtype == "float64" else "float32"     # logits in float32 otherwise
  inputs = keras.Input((rows, image_size, 3), dtype=io_dtype)
  with tf_pipeline.on_stage_device(stages, 0):
    x = _padded_conv(lay, 3, width, 7, 2, "stem_conv")(inputs)
    x = layers.ReLU(dtype=dtype)(lay.bn("stem_bn")(x))
    x = lay.max_pool(x, image_size // 2)
  names = block_names(stage_sizes)
  blocks = iter(enumerate(names))
  for stage, num_blocks in enumerate(stage_sizes):
    for block in range(num_blocks):
      strides = 2 if stage > 0 and block == 0 else 1
      index, name = next(blocks)
      with tf_pipeline.on_stage_device(stages, index):
        x = _bottleneck(x, width * 2**stage, strides, name, lay)
  with tf_pipeline.on_stage_device(stages, len(names) - 1):
    x = lay.global_pool(x)
    x = layers.Dense(cfg.model.num_classes, kernel_initializer=dense_init(), name="classifier",
                     dtype=dtype)(x)
  outputs = layers.Activation("linear", dtype=io_dtype)(x)
  return keras.Model(inputs, outputs, name="resnet")


def stage_models(model, stage_sizes, ranges):
  """GPipe's stages (spec.pipeline_layers: the stem with the first block, the classifier with
  the last): Keras models over the same layers from one block's output to another's."""
  names = block_names(stage_sizes)
  edge = lambda i: model.get_layer(f"{names[i]}_out").output
  return [keras.Model(model.input if start == 0 else edge(start - 1),
                      model.output if end == len(names) else edge(end - 1))
          for start, end in ranges]


def decayed_variables(model):
  """The weights LARS decays and trust-ratios: conv and dense kernels, found by layer role
  (Conv2D / Dense own a `kernel`), not by matching names."""
  return [layer.kernel for layer in model.layers if isinstance(layer, (layers.Conv2D, layers.Dense))]
