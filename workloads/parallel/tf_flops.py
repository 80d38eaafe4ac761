"""FLOPs of a traced TF function, by TF's graph profiler: `graph_flops`, every counted op of a
train step (what `describe` reports as train_flops_per_example for a TF trainer), and
`model_flops`, 3 x the forward pass's matmuls and convolutions (describe's
model_flops_per_example, and what bench/ compares on both sides of a peer comparison).

Why two: the whole step's count depends on how a model is written, not only on what it computes.
TF counts a conv's input and filter gradients over the shapes the conv op sees, so a model that
zero-pads before a VALID conv counts its backward over the padded input, and the same ResNet-50
counted 2.68 or 2.04 GFLOP a 64 px sample by where its padding sat. The forward's matmuls and
convs are what the architecture fixes; 3x them (forward, and the two gradients of each) is the
usual model-FLOP convention of MFU figures.

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


DENSE_OPS = ("Conv2D", "DepthwiseConv2dNative", "MatMul", "BatchMatMul", "BatchMatMulV2",
             "BatchMatMulV3", "Einsum")


def model_flops(graph) -> float:
  """3 x the FLOPs of the graph's forward matmuls and convolutions: the dense ops outside the
  'gradient_tape/' name scope, where tf.GradientTape puts the backward pass."""
  forward = [op for op in graph.get_operations()
             if op.type in DENSE_OPS and not op.name.startswith("gradient_tape/")]
  return 3.0 * sum(ops.get_stats_for_node_def(graph, op.node_def, "flops").value or 0
                   for op in forward)


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
