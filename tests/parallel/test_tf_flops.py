"""tf_flops: TF's graph profiler counts Einsum and depthwise-conv gradients too, the same as
the matmul or conv that computes the same thing (2 FLOPs per multiply-add)."""
import numpy as np
import pytest
import tensorflow as tf

from workloads.parallel.tf_flops import einsum_flops, graph_flops

A, B = tf.TensorSpec((8, 16, 32), tf.float32), tf.TensorSpec((32, 64), tf.float32)


@pytest.mark.parametrize("equation", ["bld,dv->blv", "...d,dv->...v", "bld,dv->bv"])
def test_an_einsum_counts_as_the_matmul_it_computes(equation):
  einsum = tf.function(lambda pair: tf.einsum(equation, *pair))
  matmul = tf.function(lambda pair: tf.matmul(tf.reshape(pair[0], (-1, 32)), pair[1]))
  assert graph_flops(einsum, (A, B)) == graph_flops(matmul, (A, B)) == 2 * 8 * 16 * 32 * 64


def test_einsum_formula():
  # attention logits: b q n h, b k n h -> b n q k
  assert einsum_flops("bqnh,bknh->bnqk", [(2, 5, 4, 8), (2, 7, 4, 8)]) == 2 * 2 * 5 * 7 * 4 * 8
  assert einsum_flops("...ij,...jk->...ik", [(1, 3, 4, 5), (6, 3, 5, 2)]) == 2 * 6 * 3 * 4 * 5 * 2
  assert einsum_flops("bij->bji", [(2, 3, 4)]) == 0          # a transpose: no arithmetic


def test_depthwise_conv_gradients_count_as_its_forward():
  kernel = tf.Variable(tf.ones((3, 3, 6, 2)))
  x = tf.TensorSpec((2, 9, 9, 6), tf.float32)
  forward = 2 * 3 * 3 * (2 * 9 * 9 * 12)       # 2 x taps x output elements (6 channels x 2)

  @tf.function
  def step(images):
    with tf.GradientTape() as tape:
      tape.watch(images)
      y = tf.nn.depthwise_conv2d(images, kernel, [1, 1, 1, 1], "SAME")
    return tape.gradient(y, [images, kernel])   # the output gradient: ones, no arithmetic

  assert graph_flops(step, x) == 3 * forward
  assert np.isfinite(graph_flops(tf.function(lambda images: images * 2.0), x))


def test_model_flops_are_three_forward_passes_wherever_the_padding_sits():
  """A 3x3 conv with its zero padding inside the conv op, or as a pad op before a VALID conv:
  the same model FLOPs (3 x the forward conv), though TF counts the second's gradients over
  the padded input."""
  import keras
  from workloads.parallel.tf_flops import model_flops
  from workloads.parallel.tf_layers import PaddedConv2D
  x = tf.TensorSpec((2, 8, 8, 4), tf.float32)
  inside = PaddedConv2D(5, 3, 1, use_bias=False)
  before = keras.Sequential([keras.layers.ZeroPadding2D(1),
                             keras.layers.Conv2D(5, 3, padding="valid", use_bias=False)])

  def step_graph(layer):
    layer(tf.zeros((2, 8, 8, 4)))

    @tf.function
    def step(images):
      with tf.GradientTape() as tape:
        y = tf.reduce_sum(layer(images))
      return tape.gradient(y, layer.trainable_variables)
    return step, step.get_concrete_function(x).graph

  forward = 2 * 3 * 3 * 4 * (2 * 8 * 8 * 5)
  for layer in (inside, before):
    step, graph = step_graph(layer)
    assert model_flops(graph) == 3 * forward
  assert graph_flops(step_graph(before)[0], x) > graph_flops(step_graph(inside)[0], x)
