"""DLRM-DCNv2 training and evaluation steps in JAX (flax + optax), behind the driver's Trainer
API. The batch is split over `data`, the embedding slab's rows over `model`
(embedding_plan.py), every dense weight replicated; GSPMD turns the slab's gather into each
peer's local lookup and a sum over `model`, and the slab's gradient stays with its rows."""
import functools

import jax
import jax.numpy as jnp
import optax
from flax.training import train_state

from workloads.dlrm import jax_model, spec
from workloads.optim import jax_optimizers
from workloads.parallel.jax_trainer_base import MeshTrainer, apply_update


def loss_fn(apply_fn, params, batch):
  """The mean binary cross entropy with logits over the global batch (torch's
  BCEWithLogitsLoss)."""
  logits = apply_fn({"params": params}, batch["dense"], batch["sparse"])
  return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, batch["label"]))


def train_step(state, batch, *, runtime):
  loss, grads = jax.value_and_grad(functools.partial(loss_fn, state.apply_fn))(state.params,
                                                                                batch)
  return apply_update(state, grads, runtime), loss


def eval_step(state, batch):
  """Every example's click probability, label and mask (the AUC is computed on the host)."""
  logits = state.apply_fn({"params": state.params}, batch["dense"], batch["sparse"])
  return {"score": jax.nn.sigmoid(logits), "label": batch["label"], "mask": batch["mask"]}


class DlrmTrainer(MeshTrainer):
  spec = spec.SPEC

  def __init__(self, cfg, ctx):
    super().__init__(cfg, ctx)
    self.model = jax_model.build(cfg, self.dtype, self.runtime.model)
    self.schedule = spec.schedule_for(cfg)
    self.tx = jax_optimizers.make_adagrad(cfg.optimizer, self.schedule)

  def create_state(self, rng):
    m = self.cfg.model
    variables = self.model.init(rng, jnp.zeros((1, m.dense_features)),
                                jnp.zeros((1, sum(m.multi_hot_sizes)), jnp.int32))
    return train_state.TrainState.create(apply_fn=self.model.apply, params=variables["params"],
                                         tx=self.tx)

  def train_step_fn(self, remat=None):
    del remat
    return functools.partial(train_step, runtime=self.runtime)

  def eval_step(self, state, batch):
    return eval_step(state, batch)


make_trainer = DlrmTrainer        # WorkloadSpec.trainer_modules: (cfg, ctx) -> the trainer
