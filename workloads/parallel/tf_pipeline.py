"""GPipe in TensorFlow: K stages on K devices, M micro-batches, re-materialization with
tf.recompute_grad; the schedule and the stage cut are harness/pipeline.py's (jax_pipeline.py
is JAX's).

The pipeline is one TF graph whose ops are placed per stage (`tf.device`), as Lingvo's GPipe
builds it: stage s of data replica d runs on device d * K + s, a micro-batch's activation
reaches the next stage as the graph's own cross-device copy (the shift), and the backward
pass runs where its forward ran (TF 2 colocates gradients). The executor starts an op as soon
as its inputs are there, so stage s works on micro-batch m while stage s + 1 works on m - 1:
the M + K - 1 iterations of the schedule below are the order the graph is written in, and
bubbles compute nothing. Why not tf.distribute's replica context, where every replica runs
the same function: replicas there must issue their collectives in one order (merge_call),
and a stage's replica issues other ops (its layers' batch-norm and dropout state updates)
than its neighbours; one graph has no such order to keep.

With `remat`, each stage call is a tf.recompute_grad: the forward's activations are dropped
and recomputed in the backward pass, and only the stage inputs are kept.
"""
import contextlib

import tensorflow as tf

from harness import pipeline


def on_stage_device(placement, layer):
  """The device scope where layer `layer`'s weights are made: its stage's device (stage s of
  data replica 0), or none without a pipeline. `placement`: [(device, (first, end layer))] per
  stage. Stages own their weights: a weight lives on the device of the stage that makes it
  (the Transformer's shared embedding: the first stage's; later stages read it from there),
  Keras makes an optimizer's slots beside their weight, and TF runs the update ops where the
  weight is, so a stage device holds its own layers' parameters and optimizer state."""
  for device, (start, end) in placement or ():
    if start <= layer < end:
      return tf.device(device)
  return contextlib.nullcontext()


def microbatches(tree, count):
  """{key: [b, ...]} -> `count` dicts of [b / count, ...] (rows in order)."""
  parts = {k: tf.split(v, count, axis=0) for k, v in tree.items()}
  return [{k: parts[k][j] for k in tree} for j in range(count)]


def _flat(fn, keys, sent):
  """fn(x tuple, micro dict) -> (y tuple, out) as f(*tensors) -> [*y, out], the form
  tf.recompute_grad differentiates (positional tensors in, a list of tensors out)."""
  def flat(*args):
    y, out = fn(tuple(args[:sent]), dict(zip(keys, args[sent:])))
    return list(y) + [out]
  return flat


def run(stage_fns, inputs, *, devices, stages, microbatches_count, data, remat=False):
  """Builds the pipelined forward of a global batch `inputs` ({key: [B, ...]}, B split over
  `data` replicas then each into M micro-batches). stage_fns[s](x, micro) -> (y, out): `x` is
  the tuple of tensors stage s - 1 sent (() on stage 0), `y` what this stage sends on (() on
  the last), `out` its scalar contribution to the step (the last stage's loss sum; 0
  elsewhere). -> (the outs summed, iterations per replica, bytes shifted between stages in the
  forward pass: the backward sends as many back)."""
  total, iterations = 0.0, pipeline.iterations(stages, microbatches_count)
  shifted = 0
  keys = sorted(inputs)
  for d, part in enumerate(microbatches(inputs, data)):
    micro = microbatches(part, microbatches_count)
    sent = [()] * microbatches_count                # what each micro-batch carries forward
    for row in pipeline.schedule(stages, microbatches_count):
      for s, m in enumerate(row):
        if m is None:
          continue                                  # a bubble: nothing to run
        with tf.device(devices[d * stages + s]):
          flat = _flat(stage_fns[s], keys, len(sent[m]))
          if remat:
            flat = tf.recompute_grad(flat)
          outputs = flat(*sent[m], *(micro[m][k] for k in keys))
          sent[m], out = tuple(outputs[:-1]), outputs[-1]
          total = total + out
          if s < stages - 1:
            shifted += sum(int(t.shape.num_elements()) * t.dtype.size for t in sent[m])
  return total, iterations, shifted


def forward_op_count() -> int:
  """While a step is traced, after its forward pass: the ops so far (kept_for_backward_bytes
  tells the forward's ops from the backward's by creation order)."""
  return len(tf.compat.v1.get_default_graph().get_operations())


def kept_for_backward_bytes(graph, forward_ops: int) -> int:
  """Bytes of the forward activations a traced step keeps for its backward pass: outputs of
  the first `forward_ops` ops (the forward) that later ops (the backward) read, other than
  weights, inputs and constants (static shapes). Under tf.recompute_grad a stage's
  activations are made again inside the backward pass: only its inputs are kept."""
  ops = graph.get_operations()
  forward = {op.name for op in ops[:forward_ops]}
  skip = {"Const", "Placeholder", "ReadVariableOp", "VarHandleOp", "Identity", "Shape"}
  kept = {}
  for op in ops[forward_ops:]:
    for t in op.inputs:
      if t.op.name in forward and t.op.type not in skip and t.shape.is_fully_defined():
        kept[t.name] = int(t.shape.num_elements()) * t.dtype.size
  return sum(kept.values())
