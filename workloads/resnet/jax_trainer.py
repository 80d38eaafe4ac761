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
import optax
from flax.training import train_state

from workloads.optim import jax_optimizers, schedules
from workloads.parallel.jax_trainer_base import MeshTrainer
from workloads.resnet import input_pipeline, jax_model, spec



class TrainState(train_state.TrainState):
  batch_stats: dict


def cross_entropy(logits, labels, num_classes, label_smoothing):
  targets = optax.smooth_labels(jax.nn.one_hot(labels, num_classes, dtype=logits.dtype),
                                label_smoothing)
  return optax.softmax_cross_entropy(logits, targets).mean()


def loss_and_grads(apply_fn, params, batch_stats, batch, num_classes, label_smoothing):
  def loss_fn(p):
    logits, updates = apply_fn({"params": p, "batch_stats": batch_stats}, batch["image"],
                               train=True, mutable=["batch_stats"])
    return cross_entropy(logits, batch["label"], num_classes, label_smoothing), updates
  (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  return loss, grads, updates["batch_stats"]


def train_step(state, batch, *, runtime, num_classes, label_smoothing):
  kw = dict(num_classes=num_classes, label_smoothing=label_smoothing)
  if runtime.grouped_bn:                             # per device, BN pooled over groups
    step = runtime.grouped_bn_step(functools.partial(loss_and_grads, state.apply_fn, **kw))
    loss, grads, stats = step(state.params, state.batch_stats, batch)
  else:
    loss, grads, stats = loss_and_grads(state.apply_fn, state.params, state.batch_stats,
                                        batch, **kw)
  grads = runtime.constrain_update(grads)            # weight-update sharding: shard the update
  state = state.apply_gradients(grads=grads, batch_stats=stats)
  return state.replace(params=runtime.restore_param_layout(state.params)), loss


def eval_step(state, batch):
  logits = state.apply_fn({"params": state.params, "batch_stats": state.batch_stats},
                          batch["image"], train=False)
  correct = (jnp.argmax(logits, -1) == batch["label"]) * batch["mask"]
  return jnp.stack([correct.sum(), batch["mask"].sum()])


class ResNetTrainer(MeshTrainer):
  spec_module, pipeline = spec, input_pipeline

  def __init__(self, cfg, ctx):
    super().__init__(cfg, ctx)
    self.model = jax_model.ResNet(stage_sizes=cfg.model.stage_sizes, width=cfg.model.width,
                                  num_classes=cfg.model.num_classes, dtype=self.dtype,
                                  bn_axis_name="bn" if self.runtime.grouped_bn else None)
    self.schedule = schedules.warmup_poly_for(cfg.optimizer, cfg.train, self.train_examples)
    self.tx = jax_optimizers.make_optimizer(cfg.optimizer, self.schedule)   # one object: the
                                                          # state's pytree metadata must match
  def _create_state(self, rng):
    size = self.cfg.data.image_size
    variables = self.model.init(rng, jnp.zeros((1, size, size, 3)), train=False)
    return TrainState.create(apply_fn=self.model.apply, params=variables["params"], tx=self.tx,
                             batch_stats=variables["batch_stats"])

  def init(self):
    """Initialises the state on the mesh and compiles both steps (before run_start)."""
    rng = jax.random.key(self.ctx.seed)
    shardings = self.state_shardings(self._create_state, rng)
    self.state = self.initial_state(shardings, rng)
    step = functools.partial(train_step, runtime=self.runtime,
                             num_classes=self.cfg.model.num_classes,
                             label_smoothing=self.cfg.optimizer.label_smoothing)
    self.compile_steps(step, shardings)

  def eval_step(self, state, batch):
    return eval_step(state, batch)


def make_trainer(cfg, ctx):
  return ResNetTrainer(cfg, ctx)
