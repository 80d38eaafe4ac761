"""EfficientNet training and evaluation in JAX (flax + optax), behind the driver's Trainer API
(the loop and distribution: workloads/parallel/jax_trainer_base.py).

What is EfficientNet's: dropout and stochastic depth need a key per step (folded from the
step number, so a run is reproducible); TF-semantics RMSProp (optim/jax_optimizers.tf_rmsprop)
or, in the large_batch recipe, LARS with the L2 term in the loss (spec.loss_l2);
and an exponential moving average of the weights and batch-norm statistics, updated after
every step as tf.train.ExponentialMovingAverage(decay, num_updates=step) does, which eval uses
(rules/efficientnet.yaml: use_ema_weights).
"""
import functools

import jax

from workloads.common import jax_top1
from workloads.efficientnet import jax_model, spec
from workloads.optim import jax_optimizers
from workloads.parallel import jax_batch_norm, jax_runtime
from workloads.parallel.jax_trainer_base import apply_update


class TrainState(jax_batch_norm.TrainState):
  ema_params: dict
  ema_batch_stats: dict
  dropout_key: jax.Array


def ema_update(ema, new, decay, step):
  """One moving-average step of a pytree at update count `step` (jax_optimizers.ema_decay)."""
  d = jax_optimizers.ema_decay(decay, step)
  return jax.tree.map(lambda e, v: d * e + (1 - d) * v, ema, new)


def loss_and_grads(apply_fn, params, batch_stats, batch, key, num_classes, label_smoothing,
                   l2=0.0):
  """`l2`: the weight of the loss's L2 term (the LARS recipe's; RMSProp's is in the optimizer)."""
  def loss_of(logits, p):
    loss = jax_top1.cross_entropy(logits, batch["label"], num_classes, label_smoothing)
    if l2:
      loss = loss + jax_optimizers.l2_term(p, l2)
    return loss
  return jax_batch_norm.loss_and_grads(apply_fn, params, batch_stats, batch, loss_of,
                                       rngs={"dropout": key})


def train_step(state, batch, *, runtime, num_classes, label_smoothing, ema_decay, l2):
  key = jax.random.fold_in(state.dropout_key, state.step)
  kw = dict(num_classes=num_classes, label_smoothing=label_smoothing, l2=l2)

  def step_loss_and_grads(params, batch_stats, step_batch):
    step_key = key
    if runtime.grouped_bn:       # per device: each draws its own masks for its own examples
      step_key = jax.random.fold_in(key, jax.lax.axis_index(jax_runtime.DATA))
    return loss_and_grads(state.apply_fn, params, batch_stats, step_batch, step_key, **kw)
  loss, grads, stats = jax_batch_norm.grouped_or_global(state, batch, runtime,
                                                        step_loss_and_grads)
  state = apply_update(state, grads, runtime, batch_stats=stats)
  state = state.replace(
      ema_params=ema_update(state.ema_params, state.params, ema_decay, state.step),
      ema_batch_stats=ema_update(state.ema_batch_stats, stats, ema_decay, state.step))
  return state, loss


def eval_step(state, batch):
  """Top-1 counts of the moving-average model."""
  return jax_top1.eval_counts(
      state.apply_fn, {"params": state.ema_params, "batch_stats": state.ema_batch_stats}, batch)


class EfficientNetTrainer(jax_batch_norm.BatchNormTrainer):
  spec = spec.SPEC
  state_class = TrainState

  def __init__(self, cfg, ctx):
    super().__init__(cfg, ctx)
    self.model = jax_model.build(cfg, self.dtype, self.bn_axis)
    opt = cfg.optimizer
    self.schedule = spec.schedule_for(cfg, self.train_examples)
    self.tx = (jax_optimizers.make_optimizer(opt, self.schedule, opt.lars_weight_decay)
               if opt.name == "lars" else jax_optimizers.make_rmsprop(opt, self.schedule))

  def create_state(self, rng):
    params_key, dropout_key = jax.random.split(rng)
    variables = self.init_variables(params_key)
    return self.new_state(variables, ema_params=variables["params"],
                          ema_batch_stats=variables["batch_stats"],
                          dropout_key=jax.random.key_data(dropout_key))

  def train_step_fn(self, remat=None):
    del remat                                        # EfficientNet does not pipeline
    return functools.partial(train_step, runtime=self.runtime,
                             num_classes=self.cfg.model.num_classes,
                             label_smoothing=self.cfg.optimizer.label_smoothing,
                             ema_decay=self.cfg.optimizer.ema_decay,
                             l2=spec.loss_l2(self.cfg))

  def eval_step(self, state, batch):
    return eval_step(state, batch)


make_trainer = EfficientNetTrainer        # WorkloadSpec.trainer_modules: (cfg, ctx) -> the trainer
