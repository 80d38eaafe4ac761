"""GPipe in JAX (Huang et al. 2019): K stages on the mesh's `stage` axis, M micro-batches,
re-materialization; the schedule and the stage cut are harness/pipeline.py's.

A workload gives one function per stage, `stage_fn(params, x, inputs) -> (y, out)`: `x` is what
the previous stage sent (the first stage reads its micro-batch from `inputs` instead), `y` what
this stage sends on, `out` what it contributes to the step (the last stage's loss sum, every
stage's batch-norm statistics), summed over the micro-batches. `run` executes them per device
under shard_map: a scan of M + K - 1 iterations in which stage k runs micro-batch i - k through
its own branch of a lax.switch on its stage index, and the stage-to-stage shift is one
collective permute (ppermute k -> k + 1). With `remat`, each iteration is a jax.checkpoint
that saves nothing but its inputs (the stage's input and micro-batch), so the backward pass
recomputes the stage's forward and only the stage boundaries stay in memory.

Bubbles (iterations where a stage has no micro-batch yet, or no more) compute on zeros, not on
whatever is in the buffer: `x` is selected to zero before the stage runs and `out` to zero
after, so neither the forward values nor the gradients can take anything from a bubble (the
tests fill the buffers with NaN to prove it). A workload's parameters are whole on every
device (one psum over `stage` assembles each device's own stage's gradients), or, where it
owns stage weights (the Transformer), each stage's own live on its devices only and their
gradients stay there (jax_stage_weights.py).

Stages whose boundaries differ in shape (ResNet's blocks) send a flat buffer of the largest
boundary (`Boundary`); stages with one boundary shape (the Transformer's) send it as it is.
"""
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from harness.pipeline import stage_ranges
from workloads.parallel import jax_layers
from workloads.parallel.jax_runtime import DATA

STAGE = "stage"


def microbatches(tree, m):
  """(b, ...) -> (m, b / m, ...) for every leaf: micro-batch j is rows j*b/m ... of this
  device's batch."""
  return jax.tree.map(lambda x: x.reshape(m, x.shape[0] // m, *x.shape[1:]), tree)


def run(stage_fns, params, inputs, carry, *, stages, microbatches_count, remat=False):
  """Per device (inside shard_map over `stage`): runs the schedule over this device's batch
  `inputs` (leaves [b, ...]); `carry` is the boundary buffer's initial value (its shape is one
  micro-batch's boundary; its values never reach a result). -> (outs summed over this stage's
  micro-batches, the number of iterations run)."""
  k_count, m_count = stages, microbatches_count
  stage = jax.lax.axis_index(STAGE)
  per_micro = microbatches(inputs, m_count)

  def call(params, x, micro):
    if k_count == 1:
      return stage_fns[0](params, x, micro)
    return jax.lax.switch(stage, stage_fns, params, x, micro)

  if remat:
    call = jax.checkpoint(call, policy=jax.checkpoint_policies.nothing_saveable)
  first = jax.tree.map(lambda a: a[0], per_micro)
  out_zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                           jax.eval_shape(stage_fns[0], params, carry, first)[1])
  shift = [(k, k + 1) for k in range(k_count - 1)]

  def iteration(state, i):
    buffer, acc, count = state
    micro_index = i - stage
    valid = (micro_index >= 0) & (micro_index < m_count)
    x = jax.tree.map(lambda b: jnp.where(valid, b, jnp.zeros_like(b)), buffer)
    micro = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(
        a, jnp.clip(micro_index, 0, m_count - 1), keepdims=False), per_micro)
    y, out = call(params, x, micro)
    acc = jax.tree.map(lambda a, o: a + jnp.where(valid, o, jnp.zeros_like(o)), acc, out)
    if k_count > 1:
      y = jax.lax.ppermute(y, STAGE, shift)
    return (y, acc, count + 1), None

  (_, acc, count), _ = jax.lax.scan(iteration, (carry, out_zeros, jnp.int32(0)),
                                    jnp.arange(k_count + m_count - 1))
  return acc, count


def stage_functions(ranges, weights, apply_layers):
  """One `fn(params, x, micro)` per stage for `run`: `apply_layers(params, x, micro, start,
  end)` runs the stage's layers [start, end) on its own parameters (with stage-owned `weights`,
  jax_stage_weights.StageWeights, this device's row unpacked; None: the whole tree), dropout
  keyed by the micro-batch's global example indices (micro['example'])."""
  def make(k):
    start, end = ranges[k]

    def fn(params, x, micro):
      if weights is not None:
        params = weights.stage_params(params, k)
      with jax_layers.examples(micro["example"]):
        return apply_layers(params, x, micro, start, end)
    return fn
  return [make(k) for k in range(len(ranges))]


def reduced(loss, grads, iterations, weights=None):
  """Inside `sharded`: the step's loss summed over stage x data, its gradients summed as the
  parameters are kept (whole: over stage x data; stage-owned rows: over data only) and the
  iterations run."""
  every = (STAGE,) + DATA
  grads = (jax.lax.psum(grads, every) if weights is None
           else weights.sum_gradients(grads, every, DATA))
  return jax.lax.psum(loss, every), grads, jax.lax.pmax(iterations, every)


def summed_loss_and_grads(runtime, cut, params, batch, carry, layers, denominators, loss_of, *,
                          remat=False, weights=None):
  """The pipelined loss of a model whose stages hand on one boundary (BERT's, the
  Transformer's) and whose last stage sums its loss's numerators: the stages cut per `cut`
  run `layers(params, x, micro, start, end)` -> (what the stage hands on, its sums) on
  micro-batches whose examples are numbered (dropout keyed by example: no number depends on K
  or M), from `carry` (one micro-batch's boundary). Per device (inside `sharded`),
  `denominators(batch)` (summed over DATA) and `loss_of(sums over this device's micro-batches,
  denominators)` give the loss. `weights`: the stage-owned layout (jax_stage_weights.
  StageWeights) `params` are stored in, or None for the whole tree on every device.
  -> (loss, grads in the form of `params`, iterations run)."""
  global_batch = jax.tree.leaves(batch)[0].shape[0]      # every feature's rows: the examples
  batch = {**batch, "example": jnp.arange(global_batch)}   # split over DATA like the rows
  fns = stage_functions(stage_ranges(cut), weights, layers)

  def local(params, batch):
    per_batch = denominators(batch)

    def loss_fn(p):
      sums, iterations = run(fns, p, batch, carry, stages=runtime.stage,
                             microbatches_count=runtime.microbatches, remat=remat)
      return loss_of(sums, per_batch), iterations
    (loss, iterations), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    return reduced(loss, grads, iterations, weights)

  specs = None if weights is None else weights.specs(params)
  return sharded(runtime, local, 1, param_specs=specs)(params, batch)


def sharded(runtime, local_fn, replicated_args, param_specs=None, outputs=3):
  """local_fn(*args, batch) per device under shard_map, manual over `stage` and DATA: the
  first `replicated_args` arguments whole on every device, the batch split over DATA; every
  output must be the same on all devices (local_fn reduces it over `stage` and DATA).
  `param_specs`: the first argument's specs instead (stage-owned weights: their rows split
  over `stage`, jax_stage_weights.py), and the second of the `outputs` (its gradient) the same."""
  manual = {STAGE, *DATA}
  in_specs, out_specs = (P(),) * replicated_args + (P(DATA),), P()
  if param_specs is not None:
    in_specs = (param_specs,) + in_specs[1:]
    out_specs = (P(), param_specs) + (P(),) * (outputs - 2)
  return jax.shard_map(local_fn, mesh=runtime.mesh, in_specs=in_specs, out_specs=out_specs,
                       axis_names=manual, check_vma=False)


class Boundary:
  """One flat buffer for stage boundaries of different shapes: each micro-batch example's
  activation flattened and zero-padded to the largest boundary."""

  def __init__(self, shapes, dtype):
    """`shapes`: per stage, the per-example shape it receives (None for the first stage)."""
    self.shapes = shapes
    self.size = max([math.prod(s) for s in shapes if s is not None] or [1])
    self.dtype = dtype

  def empty(self, rows, fill=0.0):
    return jnp.full((rows, self.size), fill, self.dtype)

  def pack(self, y):
    flat = y.reshape(y.shape[0], -1).astype(self.dtype)
    return jnp.pad(flat, ((0, 0), (0, self.size - flat.shape[1])))

  def unpack(self, buffer, stage):
    shape = self.shapes[stage]
    return buffer[:, :math.prod(shape)].reshape(buffer.shape[0], *shape)


def stage_input_shapes(layer_fn, example, ranges):
  """Per stage, the per-example shape of its input (None for stage 0), by tracing `layer_fn(x,
  start, end)` over the stages in order from `example` (one micro-batch's input)."""
  shapes, x = [], example
  for k, (start, end) in enumerate(ranges):
    shapes.append(None if k == 0 else tuple(x.shape[1:]))
    x = jax.eval_shape(lambda h, a=start, b=end: layer_fn(h, a, b), x)
  return shapes


def layer_profile(layer_fn, variables, example, count):
  """[(forward FLOPs, output bytes)] of each of `count` layers, `layer_fn(variables, x, i)`
  (layer i on x, a pytree) chained from `example` (shapes only): XLA's cost analysis of each
  layer's lowered forward, and the bytes of what it hands on (`simulate` times a pipeline's
  stages and shifts from these)."""
  out, x = [], example
  for i in range(count):
    fn = jax.jit(lambda v, h, i=i: layer_fn(v, h, i))
    cost = fn.lower(variables, x).cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    x = jax.eval_shape(fn, variables, x)
    nbytes = sum(math.prod(a.shape) * a.dtype.itemsize for a in jax.tree.leaves(x))
    out.append((float(cost.get("flops", 0.0)), int(nbytes)))
  return out


def hidden_state_profile(trainer, method, rows):
  """layer_profile of a model whose pipeline stages hand on one hidden state [rows, length,
  hidden] and read the batch (BERT's encoder, Llama's decoder): `method` is its
  pipeline_layers(x, batch, start, end, train) -> (x, heads or None); a stage cut after a layer
  sends that layer's hidden state (the batch's features ride along to every stage, but are not
  sent)."""
  cfg = trainer.cfg
  params = jax.eval_shape(trainer.create_state, jax.random.key(0)).params
  batch = {k: jax.ShapeDtypeStruct(s.shape, s.dtype)
           for k, s in trainer.batch_shapes(rows).items()}
  hidden = jax.ShapeDtypeStruct((rows, cfg.data.max_seq_length, cfg.model.hidden_size),
                                trainer.dtype)

  def layer(p, carry, i):
    x, _ = trainer.model.apply({"params": p}, carry["x"], carry["batch"], i, i + 1, False,
                               method=method)
    return {"x": x, "batch": carry["batch"]}

  profile = layer_profile(layer, params, {"x": hidden, "batch": batch}, cfg.model.num_layers)
  batch_bytes = sum(math.prod(s.shape) * s.dtype.itemsize for s in batch.values())
  return [(flops, nbytes - batch_bytes) for flops, nbytes in profile]
