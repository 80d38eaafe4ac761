"""Model FLOPs of a traced TF function, by TF's graph profiler (what `describe` reports as
train_flops_per_example for a TF trainer, and what bench/ counts on both sides of a peer
comparison).

The profiler counts only ops that have a registered 'flops' statistic, and TF registers none
for Einsum (every attention and projection of our BERT and Transformer, and of keras-hub's
layers: Keras' EinsumDense) or for the gradients of a depthwise conv. Uncounted, a
Transformer's step counted a fraction of its matmuls, and a peer built from other ops counted
more for the same model. So this module registers them, by the usual rule: 2 FLOPs (a multiply
and an add) per term of the contraction.
"""
import numpy as np
import tensorflow as tf
from tensorflow.python.framework import graph_util, ops


def _shape(graph, name):
  shape = graph_util.tensor_shape_from_node_def_name(graph, name)
  shape.assert_is_fully_defined()
  return shape.as_list()


def _labels(term, rank):
  """An einsum operand's index labels, '...' expanded to one label per dimension it covers."""
  if "..." not in term:
    return list(term)
  head, tail = term.split("...")
  return list(head) + [f"...{i}" for i in range(rank - len(head) - len(tail))] + list(tail)


def einsum_flops(equation, shapes) -> int:
  """2 x the product of every index's size (each output element sums the products over the
  contracted indices); '...' stands for the leading dimensions its operand has beyond its
  named ones. A one-operand einsum (a transpose or a sum) moves data: 0."""
  inputs = equation.replace(" ", "").split("->")[0].split(",")
  if len(inputs) < 2:
    return 0
  sizes = {}
  for term, shape in zip(inputs, shapes):
    for label, size in zip(_labels(term, len(shape)), shape):
      sizes[label] = max(sizes.get(label, 1), int(size))    # max: '...' may broadcast a 1
  return 2 * int(np.prod(list(sizes.values()), dtype=np.int64))


@ops.RegisterStatistics("Einsum", "flops")
def _einsum(graph, node):
  inputs = [i for i in node.input if not i.startswith("^")]
  return ops.OpStats("flops", einsum_flops(node.attr["equation"].s.decode(),
                                           [_shape(graph, i) for i in inputs]))


@ops.RegisterStatistics("DepthwiseConv2dNativeBackpropInput", "flops")
@ops.RegisterStatistics("DepthwiseConv2dNativeBackpropFilter", "flops")
def _depthwise_backprop(graph, node):
  """As the forward conv: 2 x kh x kw per element of the forward output (out_backprop), which
  covers the depth multiplier (the forward output has input channels x multiplier)."""
  filter_name = node.input[1] if node.op.endswith("Input") else node.name
  kh, kw = _shape(graph, filter_name)[:2]
  return ops.OpStats("flops", 2 * kh * kw * int(np.prod(_shape(graph, node.input[2]))))


def graph_flops(function, specs) -> float:
  """Floating-point ops of one trace of the tf.function `function` at `specs` (its one
  argument's TensorSpecs), by TF's graph profiler with the statistics above."""
  graph = function.get_concrete_function(specs).graph
  opts = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
  opts["output"] = "none"
  verbosity = tf.get_logger().level
  tf.get_logger().setLevel("ERROR")         # the v1 profiler warns that it is a v1 API
  try:
    info = tf.compat.v1.profiler.profile(graph, options=opts)
  finally:
    tf.get_logger().setLevel(verbosity)
  return float(info.total_float_ops) if info else float("nan")
