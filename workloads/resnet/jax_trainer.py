"""ResNet training and evaluation steps in JAX (flax + optax), behind the driver's Trainer API.

One jax.sharding.Mesh with a 'data' axis over all devices: batches are sharded on 'data',
parameters and optimizer state replicated; jit inserts the gradient all-reduce, and batch-norm
statistics are computed over the global batch.
"""
import collections
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state
from jax.sharding import NamedSharding, PartitionSpec as P

from workloads.optim import jax_optimizers, schedules
from workloads.resnet import input_pipeline, jax_model

# tf.data only feeds the host here: keep TensorFlow off any GPU so JAX has all its memory.
input_pipeline.tf.config.set_visible_devices([], "GPU")


class TrainState(train_state.TrainState):
  batch_stats: dict


def cross_entropy(logits, labels, num_classes, label_smoothing):
  targets = optax.smooth_labels(jax.nn.one_hot(labels, num_classes), label_smoothing)
  return optax.softmax_cross_entropy(logits, targets).mean()


def train_step(state, batch, *, num_classes, label_smoothing):
  def loss_fn(params):
    logits, updates = state.apply_fn({"params": params, "batch_stats": state.batch_stats},
                                     batch["image"], train=True, mutable=["batch_stats"])
    return cross_entropy(logits, batch["label"], num_classes, label_smoothing), updates

  (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  state = state.apply_gradients(grads=grads, batch_stats=updates["batch_stats"])
  return state, loss


def eval_step(state, batch):
  logits = state.apply_fn({"params": state.params, "batch_stats": state.batch_stats},
                          batch["image"], train=False)
  correct = (jnp.argmax(logits, -1) == batch["label"]) * batch["mask"]
  return jnp.stack([correct.sum(), batch["mask"].sum()])


class ResNetTrainer:
  def __init__(self, cfg, ctx):
    self.cfg, self.ctx = cfg, ctx
    devices = jax.devices()
    self.num_devices = len(devices)
    self.device_kind = devices[0].device_kind
    self.mesh = jax.make_mesh((self.num_devices,), ("data",),
                              axis_types=(jax.sharding.AxisType.Auto,))
    self.replicated = NamedSharding(self.mesh, P())
    self.batch_sharding = NamedSharding(self.mesh, P("data"))
    self.train_examples = cfg.data.train_examples
    self.eval_examples = cfg.data.eval_examples
    gbs = cfg.train.global_batch_size
    if gbs % self.num_devices:
      raise ValueError(f"train.global_batch_size={gbs} is not divisible by the "
                       f"{self.num_devices} devices")
    dtype = jnp.bfloat16 if cfg.train.precision == "bfloat16" else jnp.float32
    self.model = jax_model.ResNet(stage_sizes=cfg.model.stage_sizes, width=cfg.model.width,
                                  num_classes=cfg.model.num_classes, dtype=dtype)
    self.schedule = schedules.warmup_poly_for(cfg.optimizer, cfg.train, self.train_examples)
    self._train_iter = self._eval_data = None

  # --------------------------------------------------------------- shapes and init
  def _batch_shapes(self, batch_size, with_mask=False):
    size = self.cfg.data.image_size
    shapes = {"image": jax.ShapeDtypeStruct((batch_size, size, size, 3), jnp.float32,
                                            sharding=self.batch_sharding),
              "label": jax.ShapeDtypeStruct((batch_size,), jnp.int32, sharding=self.batch_sharding)}
    if with_mask:
      shapes["mask"] = jax.ShapeDtypeStruct((batch_size,), jnp.float32, sharding=self.batch_sharding)
    return shapes

  def _create_state(self, rng):
    size = self.cfg.data.image_size
    variables = self.model.init(rng, jnp.zeros((1, size, size, 3)), train=False)
    tx = jax_optimizers.make_optimizer(self.cfg.optimizer, self.schedule)
    return TrainState.create(apply_fn=self.model.apply, params=variables["params"], tx=tx,
                             batch_stats=variables["batch_stats"])

  def init(self):
    """Initialises the state on the mesh and compiles both steps (before run_start)."""
    rng = jax.random.key(self.ctx.seed)
    self.state = jax.jit(self._create_state, out_shardings=self.replicated)(rng)
    step = functools.partial(train_step, num_classes=self.cfg.model.num_classes,
                             label_smoothing=self.cfg.optimizer.label_smoothing)
    self._train_step = jax.jit(step, donate_argnums=0).lower(
        self.state, self._batch_shapes(self.cfg.train.global_batch_size)).compile()
    self._eval_step = jax.jit(eval_step).lower(
        self.state, self._batch_shapes(self._eval_batch_size(), with_mask=True)).compile()

  def _eval_batch_size(self):
    per_device = math.ceil(self.cfg.data.eval_batch_size / self.num_devices)
    return per_device * self.num_devices

  # --------------------------------------------------------------- data
  def _device_batches(self, dataset):
    """Puts host batches on the mesh two steps ahead, so the copy overlaps compute."""
    queue = collections.deque()
    for batch in dataset:
      queue.append(jax.device_put(batch, self.batch_sharding))
      if len(queue) == 2:
        yield queue.popleft()
    yield from queue

  def _synthetic_batches(self):
    gbs, size = self.cfg.train.global_batch_size, self.cfg.data.image_size
    key_img, key_lbl = jax.random.split(jax.random.key(self.ctx.seed + 1))
    batch = {"image": jax.random.normal(key_img, (gbs, size, size, 3), jnp.float32),
             "label": jax.random.randint(key_lbl, (gbs,), 0, self.cfg.model.num_classes)}
    batch = jax.device_put(batch, self.batch_sharding)
    while True:
      yield batch

  def _train_batches(self):
    if self._train_iter is None:        # first use is after run_start: no data read before
      if self.cfg.data.source == "synthetic":
        self._train_iter = self._synthetic_batches()
      else:
        ds = input_pipeline.train_dataset(self.cfg, self.cfg.train.global_batch_size,
                                          seed=self.ctx.seed, data_dir=self.ctx.data_dir)
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
      self._eval_data = input_pipeline.eval_dataset(self.cfg, self._eval_batch_size(),
                                                    data_dir=self.ctx.data_dir)
    totals = jnp.zeros(2)
    for batch in self._device_batches(self._eval_data.as_numpy_iterator()):
      totals = totals + self._eval_step(self.state, batch)
    correct, count = np.asarray(totals)
    return {"accuracy": float(correct / count), "count": int(round(count))}

  def describe(self):
    params = sum(math.prod(x.shape) for x in jax.tree.leaves(self.state.params))
    cost = self._train_step.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops = float(cost.get("flops", float("nan"))) if cost else float("nan")
    return {"parameters": params,
            "train_flops_per_example": flops / self.cfg.train.global_batch_size}


def make_trainer(cfg, ctx):
  return ResNetTrainer(cfg, ctx)
