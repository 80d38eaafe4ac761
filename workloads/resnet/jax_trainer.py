"""ResNet training and evaluation steps in JAX (flax + optax), behind the driver's Trainer API.

Distribution comes from workloads/parallel/jax_runtime.py: batches sharded over the data axes
(and image height over 'spatial'), parameters replicated, optimizer state sharded when
weight-update sharding is on. With global batch norm the step is plain jit (GSPMD computes
statistics over the whole batch); with grouped batch norm the forward/backward runs under
shard_map, batch norm pooling statistics over the 'bn' sub-axis only.
"""
import collections
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state
from jax.sharding import PartitionSpec as P

from workloads.optim import jax_optimizers, schedules
from workloads.parallel import jax_runtime
from workloads.parallel.jax_runtime import DATA
from workloads.resnet import input_pipeline, jax_model, spec

# tf.data only feeds the host here: keep TensorFlow off any GPU so JAX has all its memory.
input_pipeline.tf.config.set_visible_devices([], "GPU")


class TrainState(train_state.TrainState):
  batch_stats: dict


def cross_entropy(logits, labels, num_classes, label_smoothing):
  targets = optax.smooth_labels(jax.nn.one_hot(labels, num_classes), label_smoothing)
  return optax.softmax_cross_entropy(logits, targets).mean()


def loss_and_grads(apply_fn, params, batch_stats, batch, num_classes, label_smoothing):
  def loss_fn(p):
    logits, updates = apply_fn({"params": p, "batch_stats": batch_stats}, batch["image"],
                               train=True, mutable=["batch_stats"])
    return cross_entropy(logits, batch["label"], num_classes, label_smoothing), updates
  (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  return loss, grads, updates["batch_stats"]


def grouped_loss_and_grads(mesh, apply_fn, params, batch_stats, batch, **kw):
  """Per-device forward/backward with batch norm pooled over 'bn' (the model's axis_name);
  losses and gradients averaged over all replicas, running statistics over the groups."""
  def local(params, batch_stats, batch):
    loss, grads, stats = loss_and_grads(apply_fn, params, batch_stats, batch, **kw)
    return (jax.lax.pmean(loss, DATA), jax.lax.pmean(grads, DATA),
            jax.lax.pmean(stats, "replica"))
  return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(DATA)),
                       out_specs=(P(), P(), P()), check_vma=False)(params, batch_stats, batch)


def train_step(state, batch, *, runtime, num_classes, label_smoothing):
  kw = dict(num_classes=num_classes, label_smoothing=label_smoothing)
  if runtime.grouped_bn:
    loss, grads, stats = grouped_loss_and_grads(runtime.mesh, state.apply_fn, state.params,
                                                state.batch_stats, batch, **kw)
  else:
    loss, grads, stats = loss_and_grads(state.apply_fn, state.params, state.batch_stats,
                                        batch, **kw)
  grads = runtime.constrain_update(grads)            # weight-update sharding: shard the update
  state = state.apply_gradients(grads=grads, batch_stats=stats)
  return state.replace(params=runtime.replicate(state.params)), loss


def eval_step(state, batch):
  logits = state.apply_fn({"params": state.params, "batch_stats": state.batch_stats},
                          batch["image"], train=False)
  correct = (jnp.argmax(logits, -1) == batch["label"]) * batch["mask"]
  return jnp.stack([correct.sum(), batch["mask"].sum()])


class ResNetTrainer:
  def __init__(self, cfg, ctx):
    self.cfg, self.ctx = cfg, ctx
    self.runtime = runtime = jax_runtime.MeshRuntime(cfg.parallel)
    self.num_devices = runtime.num_devices
    self.data_replicas = runtime.data
    self.mesh_description = runtime.description
    self.device_kind = jax.devices()[0].device_kind
    self.train_examples = cfg.data.train_examples
    self.eval_examples = cfg.data.eval_examples
    gbs = cfg.train.global_batch_size
    if gbs % runtime.data:
      raise ValueError(f"train.global_batch_size={gbs} is not divisible by the "
                       f"{runtime.data} devices of the data axis")
    dtype = jnp.bfloat16 if cfg.train.precision == "bfloat16" else jnp.float32
    self.model = jax_model.ResNet(stage_sizes=cfg.model.stage_sizes, width=cfg.model.width,
                                  num_classes=cfg.model.num_classes, dtype=dtype,
                                  bn_axis_name="bn" if runtime.grouped_bn else None)
    self.schedule = schedules.warmup_poly_for(cfg.optimizer, cfg.train, self.train_examples)
    self.tx = jax_optimizers.make_optimizer(cfg.optimizer, self.schedule)   # one object: the
    self._train_iter = self._eval_data = None             # state's pytree metadata must match

  # --------------------------------------------------------------- shapes and init
  def _eval_batch_size(self):
    """cfg.data.eval_batch_size rounded up to a multiple of the data replicas and hosts."""
    unit = math.lcm(self.runtime.data, self.runtime.process_count)
    return math.ceil(self.cfg.data.eval_batch_size / unit) * unit

  def _batch_shapes(self, batch_size, with_mask=False):
    return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=self.runtime.batch_sharding(len(shape)))
            for k, (shape, dtype) in spec.batch_layout(self.cfg, batch_size, with_mask).items()}

  def _create_state(self, rng):
    size = self.cfg.data.image_size
    variables = self.model.init(rng, jnp.zeros((1, size, size, 3)), train=False)
    return TrainState.create(apply_fn=self.model.apply, params=variables["params"], tx=self.tx,
                             batch_stats=variables["batch_stats"])

  def init(self):
    """Initialises the state on the mesh and compiles both steps (before run_start)."""
    rng = jax.random.key(self.ctx.seed)
    shardings = self.runtime.state_shardings(jax.eval_shape(self._create_state, rng))
    self.state = jax.jit(self._create_state, out_shardings=shardings)(rng)
    step = functools.partial(train_step, runtime=self.runtime,
                             num_classes=self.cfg.model.num_classes,
                             label_smoothing=self.cfg.optimizer.label_smoothing)
    self._train_step = jax.jit(step, donate_argnums=0, out_shardings=(
        shardings, self.runtime.replicated)).lower(
            self.state, self._batch_shapes(self.cfg.train.global_batch_size)).compile()
    self._eval_step = jax.jit(eval_step).lower(
        self.state, self._batch_shapes(self._eval_batch_size(), with_mask=True)).compile()

  # --------------------------------------------------------------- data
  def _device_batches(self, dataset):
    """Puts host batches on the mesh two steps ahead, so the copy overlaps compute."""
    queue = collections.deque()
    for batch in dataset:
      queue.append(self.runtime.shard_batch(batch))
      if len(queue) == 2:
        yield queue.popleft()
    yield from queue

  def _synthetic_batches(self):
    gbs, size = self.cfg.train.global_batch_size, self.cfg.data.image_size
    key_img, key_lbl = jax.random.split(jax.random.key(self.ctx.seed + 1))
    shapes = self._batch_shapes(gbs)
    make = jax.jit(lambda: {
        "image": jax.random.normal(key_img, (gbs, size, size, 3), jnp.float32),
        "label": jax.random.randint(key_lbl, (gbs,), 0, self.cfg.model.num_classes)},
        out_shardings={k: s.sharding for k, s in shapes.items()})
    batch = make()
    while True:
      yield batch

  def _train_batches(self):
    if self._train_iter is None:        # first use is after run_start: no data read before
      if self.cfg.data.source == "synthetic":
        self._train_iter = self._synthetic_batches()
      else:
        ds = input_pipeline.train_dataset(
            self.cfg, self.cfg.train.global_batch_size, seed=self.ctx.seed,
            data_dir=self.ctx.data_dir, process_index=self.runtime.process_index,
            process_count=self.runtime.process_count)
        self._train_iter = self._device_batches(ds.as_numpy_iterator())
    return self._train_iter

  # --------------------------------------------------------------- the Trainer API
  def train(self, num_steps):
    batches = self._train_batches()
    losses = []
    for _ in range(num_steps):
      self.state, loss = self._train_step(self.state, next(batches))
      losses.append(loss)
    step = int(self.state.step)                         # the one host sync of the block
    return {"loss": float(jnp.mean(jnp.stack(losses))),
            "lr": float(self.schedule(step - 1)), "step": step}

  def evaluate(self):
    if self.cfg.data.source == "synthetic":
      raise ValueError("a synthetic run has no eval split")
    if self._eval_data is None:
      self._eval_data = input_pipeline.eval_dataset(
          self.cfg, self._eval_batch_size(), data_dir=self.ctx.data_dir,
          process_index=self.runtime.process_index, process_count=self.runtime.process_count)
    totals = jnp.zeros(2)
    for batch in self._device_batches(self._eval_data.as_numpy_iterator()):
      totals = totals + self._eval_step(self.state, batch)     # summed over all hosts
    correct, count = np.asarray(totals)
    return {"accuracy": float(correct / count), "count": int(round(count))}

  def describe(self):
    params = sum(math.prod(x.shape) for x in jax.tree.leaves(self.state.params))
    cost = self._train_step.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops = float(cost.get("flops", float("nan"))) if cost else float("nan")
    return {"parameters": params,
            "train_flops_per_example": flops / self.cfg.train.global_batch_size,
            "optimizer_state_bytes_per_device": jax_runtime.per_device_bytes(self.state.opt_state),
            "collectives_in_train_step": jax_runtime.count_collectives(self._train_step.as_text())}


def make_trainer(cfg, ctx):
  return ResNetTrainer(cfg, ctx)
