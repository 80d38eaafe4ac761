"""The speed-relevant structure of every TF trainer's step, read from its traced graphs (no
timing, so it cannot be flaky):

- (one replica: the tests see 8 logical CPUs, and several replicas run the step as a TF graph)
- `train(n)` is one tf.function call whose tf.range loop runs n steps: traced once for every n
  (num_steps is a tensor), the optimizer's iterations advanced by exactly n;
- the loop body is the input pipeline's IteratorGetNext, one call of the XLA-compiled step
  (_XlaMustCompile) and the loss total's add: nothing else runs between steps;
- every variable write (the optimizer update of each weight, batch-norm statistics) is inside
  that compiled step, and no op anywhere calls back into Python or prints (a host round trip);
- no batched matmul broadcasts one operand over the other's batch (activations [B, L, d]
  against a [d, n] weight, as keras.ops.einsum writes a projection): its weight gradient is
  one matmul per batch row summed afterwards (about 5% of the Transformer's step, where the
  logits and projections did it).
"""
import pytest
import tensorflow as tf

from harness import registry
from harness.workload import RunContext

LOOP_BODY_OPS = {"IteratorGetNext", "StatefulPartitionedCall", "AddV2", "AddN", "Cast", "Const",
                 "Identity", "NoOp"}
HOST_CALLBACKS = {"PyFunc", "PyFuncStateless", "EagerPyFunc", "Print", "PrintV2"}


def _writes(op):
  return op.startswith(("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
                        "ResourceApply", "ResourceScatter"))


def _called(node):
  return [v.func.name for v in node.attr.values() if v.HasField("func")]


def _trainer(name):
  spec = registry.get(name)
  vocab = ["model.vocab_size=64"] if name == "transformer" else []   # mini's, without its corpus
  cfg = spec.configure("tiny", ["data.source=synthetic", "parallel.mesh=data=1", *vocab])
  return spec.make_trainer("tf", cfg, RunContext(seed=0, preset="tiny"))


# The loop is the TF trainer base's, the same for every workload; EfficientNet's tiny step
# (XLA-compiled here, ~25 CPU s) is left out: suite time. Its step's structure is below.
@pytest.mark.parametrize("name", [n for n in registry.names() if n != "efficientnet"])
def test_tf_train_loop_is_one_call_of_n_compiled_steps(name):
  trainer = _trainer(name)
  trainer.init()
  start = int(trainer.iterations.numpy())
  trainer.train(2)
  trainer.train(3)
  assert int(trainer.iterations.numpy()) - start == 5
  assert trainer._train_loop.experimental_get_tracing_count() == 1

  graph = trainer._train_loop.get_concrete_function(trainer._train_iter, tf.constant(1)).graph
  graph_def = graph.as_graph_def()
  library = {f.signature.name: f for f in graph_def.library.function}
  loops = [n for n in graph_def.node if n.op == "While"]
  assert len(loops) == 1
  body = library[loops[0].attr["body"].func.name]
  assert {n.op for n in body.node_def} <= LOOP_BODY_OPS
  calls = [n for n in body.node_def if n.op == "StatefulPartitionedCall"]
  assert len(calls) == 1 and calls[0].attr["_XlaMustCompile"].b
  assert sum(n.op == "IteratorGetNext" for n in body.node_def) == 1

  def reachable(names):                    # the compiled step's functions, nested ones too
    seen, todo = set(), list(names)
    while todo:
      f = todo.pop()
      if f in library and f not in seen:
        seen.add(f)
        todo += [g for n in library[f].node_def for g in _called(n)]
    return seen

  step = reachable(_called(calls[0]))
  outside = [n.op for n in graph_def.node] + [n.op for f in set(library) - step
                                               for n in library[f].node_def]
  inside = [n.op for f in step for n in library[f].node_def]
  assert not [op for op in outside if _writes(op)]
  assert sum(_writes(op) for op in inside) >= len(trainer.model.trainable_variables)
  assert not HOST_CALLBACKS & set(outside + inside)


@pytest.mark.parametrize("name", registry.names())
def test_tf_step_has_no_matmul_broadcast_over_the_batch(name):
  trainer = _trainer(name)
  trainer.build()
  graph = trainer._step.get_concrete_function(trainer.batch_spec(2)).graph
  matmuls = [op for op in graph.get_operations() if op.type.startswith("BatchMatMul")]
  broadcast = [(op.name, [t.shape.as_list() for t in op.inputs]) for op in matmuls
               if op.inputs[0].shape[:-2] != op.inputs[1].shape[:-2]]
  assert not broadcast
