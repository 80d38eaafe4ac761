import math

import jax
import jax.numpy as jnp

from workloads.resnet import jax_model, spec


def _count(model, size):
  variables = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, size, size, 3)),
                                                train=False))
  return sum(math.prod(x.shape) for x in jax.tree.leaves(variables["params"]))


def test_reference_resnet50_has_the_mlperf_parameter_count():
  cfg = spec.reference()
  model = jax_model.ResNet(stage_sizes=cfg.model.stage_sizes, width=cfg.model.width,
                           num_classes=cfg.model.num_classes)
  assert _count(model, 224) == 25_557_032


def test_parameter_count_formula_for_a_scaled_resnet():
  """Counts of a width-8, one-block-per-stage, 10-class ResNet, added up by hand."""
  width, classes = 8, 10
  total = 7 * 7 * 3 * width + 2 * width                  # stem conv + bn
  in_ch = width
  for stage in range(4):
    f = width * 2**stage
    total += in_ch * f + 2 * f                           # 1x1
    total += 9 * f * f + 2 * f                           # 3x3
    total += f * 4 * f + 2 * 4 * f                       # 1x1 expand
    total += in_ch * 4 * f + 2 * 4 * f                   # projection (every first block)
    in_ch = 4 * f
  total += in_ch * classes + classes
  model = jax_model.ResNet(stage_sizes=(1, 1, 1, 1), width=width, num_classes=classes)
  assert _count(model, 32) == total


def test_stride_sits_on_the_3x3_conv_v1_5():
  model = jax_model.ResNet(stage_sizes=(1, 1), width=4, num_classes=2)
  variables = model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)), train=False)
  _, state = model.apply(variables, jnp.ones((2, 32, 32, 3)), train=False,
                         capture_intermediates=True)
  block = state["intermediates"]["BottleneckBlock_1"]          # the downsampling block
  assert block["Conv_0"]["__call__"][0].shape == (2, 8, 8, 8)   # 1x1 keeps 8x8
  assert block["Conv_1"]["__call__"][0].shape == (2, 4, 4, 8)   # 3x3 strides to 4x4
  assert block["proj_conv"]["__call__"][0].shape == (2, 4, 4, 32)
