"""ResNet training and evaluation steps in JAX (flax + optax), behind the driver's Trainer API.

Distribution comes from workloads/parallel/jax_runtime.py: batches sharded over the data axes
(and image height over 'spatial'), parameters replicated, optimizer state sharded when
weight-update sharding is on. With global batch norm the step is plain jit (GSPMD computes
statistics over the whole batch); with grouped batch norm the forward/backward runs per device
(jax_runtime.MeshRuntime.grouped_bn_step), batch norm pooling statistics over 'bn'.
"""
import functools

import jax
import jax.numpy as jnp

from harness.pipeline import stage_ranges
from workloads.common import jax_top1
from workloads.optim import jax_optimizers, schedules
from workloads.parallel import jax_batch_norm, jax_pipeline
from workloads.parallel.jax_runtime import DATA
from workloads.parallel.jax_trainer_base import apply_update
from workloads.resnet import jax_model, spec


def loss_and_grads(apply_fn, params, batch_stats, batch, num_classes, label_smoothing):
  return jax_batch_norm.loss_and_grads(
      apply_fn, params, batch_stats, batch,
      lambda logits, _: jax_top1.cross_entropy(logits, batch["label"], num_classes,
                                               label_smoothing))


def pipelined_loss_and_grads(model, runtime, cut, params, batch_stats, batch, *, num_classes,
                             label_smoothing, remat=False, bubble_fill=0.0, weights=None):
  """GPipe (workloads/parallel/jax_pipeline.py): the blocks cut into stages per `cut`, each
  data replica's batch in runtime.microbatches micro-batches, batch norm per micro-batch (over
  the data axis), its moving averages moved by the mean of the micro-batches' statistics.
  `weights`: the stage-owned layout (jax_stage_weights.StageWeights) `params` are stored in,
  or None for the whole tree on every device (the batch-norm statistics stay whole).
  -> (loss, grads in the form of `params`, batch_stats, iterations run)."""
  stages, count = runtime.stage, runtime.microbatches
  ranges = stage_ranges(cut)
  global_batch = batch["label"].shape[0]
  rows = global_batch // runtime.data // count
  example = jax.ShapeDtypeStruct((rows,) + batch["image"].shape[1:], batch["image"].dtype)
  whole = (lambda: params) if weights is None else (lambda: weights.full(params))  # traced only
  shapes = jax_pipeline.stage_input_shapes(
      lambda x, a, b: model.apply({"params": whole(), "batch_stats": batch_stats}, x, a, b,
                                  False, method=jax_model.ResNet.layers), example, ranges)
  boundary = jax_pipeline.Boundary(shapes, model.dtype)

  def stage_fn(k):
    start, end = ranges[k]

    def fn(p, x, micro):
      if weights is not None:              # this device's row: stage k's own parameters
        p = weights.stage_params(p, k)
      h = micro["image"] if k == 0 else boundary.unpack(x, k)
      y, updates = model.apply({"params": p, "batch_stats": batch_stats}, h, start, end, True,
                               method=jax_model.ResNet.layers, mutable=["batch_stats"])
      delta = jax.tree.map(jnp.subtract, updates["batch_stats"], batch_stats)
      if k < stages - 1:
        return boundary.pack(y), {"loss": jnp.zeros((), y.dtype), "stats": delta}
      loss = jax_top1.cross_entropy(y, micro["label"], num_classes, label_smoothing) * rows
      return boundary.empty(rows), {"loss": loss, "stats": delta}
    return fn

  fns = [stage_fn(k) for k in range(stages)]

  def local(params, batch_stats, batch):
    def loss_fn(p):
      acc, iterations = jax_pipeline.run(fns, p, batch, boundary.empty(rows, bubble_fill),
                                         stages=stages, microbatches_count=count, remat=remat)
      return acc["loss"] / global_batch, (acc["stats"], iterations)
    (loss, (stats, iterations)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    every = (jax_pipeline.STAGE,) + DATA
    stats = jax.lax.pmean(jax.lax.psum(stats, jax_pipeline.STAGE), DATA)
    stats = jax.tree.map(lambda old, d: old + d / count, batch_stats, stats)
    grads = (jax.lax.psum(grads, every) if weights is None
             else weights.sum_gradients(grads, every, DATA))
    return jax.lax.psum(loss, every), grads, stats, jax.lax.pmax(iterations, every)

  specs = None if weights is None else weights.specs(params)
  return jax_pipeline.sharded(runtime, local, 2, param_specs=specs, outputs=4)(
      params, batch_stats, batch)


def train_step(state, batch, *, runtime, num_classes, label_smoothing, pipelined=None):
  """`pipelined`: pipelined_loss_and_grads with its model, runtime and cut bound, or None."""
  kw = dict(num_classes=num_classes, label_smoothing=label_smoothing)
  if pipelined is not None:                          # GPipe over 'stage' and micro-batches
    loss, grads, stats, _ = pipelined(state.params, state.batch_stats, batch, **kw)
  else:
    loss, grads, stats = jax_batch_norm.grouped_or_global(
        state, batch, runtime, functools.partial(loss_and_grads, state.apply_fn, **kw))
  return apply_update(state, grads, runtime, batch_stats=stats), loss


def eval_step(state, batch):
  return jax_top1.eval_counts(state.apply_fn,
                              {"params": state.params, "batch_stats": state.batch_stats}, batch)


class ResNetTrainer(jax_batch_norm.BatchNormTrainer):
  spec = spec.SPEC
  owns_stage_weights = True

  def __init__(self, cfg, ctx):
    super().__init__(cfg, ctx)
    self.model = jax_model.build(cfg, self.dtype, self.bn_axis)
    self.schedule = schedules.warmup_poly_for(cfg.optimizer, cfg.train, self.train_examples)
    self.tx = jax_optimizers.make_optimizer(cfg.optimizer, self.schedule)

  def layer_profile(self, rows):
    """[(forward FLOPs, output bytes)] per pipeline layer on `rows` images (simulate)."""
    state = jax.eval_shape(self.create_state, jax.random.key(0))
    variables = {"params": state.params, "batch_stats": state.batch_stats}
    size = self.cfg.data.image_size

    def layer(v, x, i):
      return self.model.apply(v, x, i, i + 1, True, method=jax_model.ResNet.layers,
                              mutable=["batch_stats"])[0]
    example = jax.ShapeDtypeStruct((rows, size, size, 3), jnp.float32)
    return jax_pipeline.layer_profile(layer, variables, example,
                                      sum(self.cfg.model.stage_sizes))

  def train_step_fn(self, remat=None):
    """The train step; `remat` overrides parallel.remat (describe compiles both)."""
    return functools.partial(train_step, runtime=self.runtime,
                             num_classes=self.cfg.model.num_classes,
                             label_smoothing=self.cfg.optimizer.label_smoothing,
                             pipelined=self.pipelined(pipelined_loss_and_grads, remat))

  def eval_step(self, state, batch):
    return eval_step(state, batch)


make_trainer = ResNetTrainer        # WorkloadSpec.trainer_modules: (cfg, ctx) -> the trainer
