"""DLRM-DCNv2 training and evaluation steps in JAX (flax + optax), behind the driver's Trainer
API. The batch is split over `data`, the embedding slab's rows over `model`
(embedding_plan.py), every dense weight replicated; GSPMD turns the slab's gather into each
peer's local lookup and a sum over `model`, and the slab's gradient stays with its rows.

The slab's update is sparse by default (sparse_train_step, TorchRec's fused EXACT_ADAGRAD):
the gradient of the looked-up rows summed per unique row, Adagrad's accumulator and the slab
read and written at those rows only; `DlrmTrainer.sparse_tables = False` is the dense update
(the slab's whole gradient and Adagrad over every row). The eval's AUC is computed on the
devices (jax_auc.py)."""
import functools

import jax
import jax.numpy as jnp
import optax
from flax.training import train_state

from workloads.dlrm import jax_auc, jax_model, spec
from workloads.optim import jax_optimizers
from workloads.parallel.jax_trainer_base import MeshTrainer, apply_update


def loss_fn(apply_fn, params, batch):
  """The mean binary cross entropy with logits over the global batch (torch's
  BCEWithLogitsLoss)."""
  logits = apply_fn({"params": params}, batch["dense"], batch["sparse"])
  return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, batch["label"]))


def train_step(state, batch, *, runtime):
  """The dense update: the slab's gradient is a slab-sized array (the gather's transpose)
  and Adagrad reads and writes every row (DlrmTrainer.sparse_tables=False)."""
  loss, grads = jax.value_and_grad(functools.partial(loss_fn, state.apply_fn))(state.params,
                                                                                batch)
  return apply_update(state, grads, runtime), loss


def summed_row_gradients(rows, grads, size, fill):
  """(unique rows [size], each one's gradient rows summed [size, D]) from the looked-up
  rows [...] and their gradients [..., D]: jnp.unique at a static size, the slots beyond the
  distinct rows `fill` (an index past the slab: scatters with mode='drop' skip them) with a
  zero gradient."""
  flat = rows.reshape(-1)
  ids, inverse = jnp.unique(flat, size=size, fill_value=fill, return_inverse=True)
  summed = jax.ops.segment_sum(grads.reshape(flat.shape[0], -1), inverse.reshape(-1),
                               num_segments=size)
  return ids, summed


def adagrad_rows(table, total, ids, grads, lr, epsilon):
  """torch's Adagrad (jax_optimizers.torch_adagrad) on the rows `ids` only (unique; ids past
  the table dropped): sum += g^2; w += -lr g / (sqrt(sum) + eps). The other rows' gradient is
  0, so the dense update leaves them as they are: the same result, in bytes of the rows."""
  new_total = jnp.take(total, ids, axis=0, mode="fill", fill_value=0) + jnp.square(grads)
  update = (-lr * grads / (jnp.sqrt(new_total) + epsilon)).astype(grads.dtype)
  return (table.at[ids].add(update.astype(table.dtype), mode="drop"),
          total.at[ids].set(new_total.astype(total.dtype), mode="drop"))


def _without_slab(tree):
  return {**tree, "embedding": {k: v for k, v in tree["embedding"].items() if k != "slab"}}


def _with_slab(tree, slab):
  return {**tree, "embedding": {**tree["embedding"], "slab": slab}}


def sparse_train_step(state, batch, *, runtime, plan, multi_hot_sizes, unique_size, lr,
                      epsilon):
  """The sparse update (TorchRec's fused EXACT_ADAGRAD): the loss differentiated with respect
  to the dense weights and the looked-up slab rows (not the slab); the rows' gradients summed
  per unique row; Adagrad's accumulator and the slab read and written at those rows only. The
  dense weights take the optimizer's own update (state.tx: torch_adagrad, whose state is
  AdagradState(count, sum) over every parameter; the slab's sum is updated here)."""
  params, opt = state.params, state.opt_state
  slab, slab_sum = params["embedding"]["slab"], opt.sum["embedding"]["slab"]
  rows = jax_model.slab_rows(plan, multi_hot_sizes, batch["sparse"])
  found = jnp.take(slab, rows, axis=0)                              # [B, columns, D]

  def loss_of(dense, found):
    logits = state.apply_fn({"params": _with_slab(dense, slab)}, batch["dense"],
                            batch["sparse"], found=found)
    return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, batch["label"]))

  dense = _without_slab(params)
  loss, (dense_grads, found_grads) = jax.value_and_grad(loss_of, argnums=(0, 1))(dense, found)
  ids, row_grads = summed_row_gradients(rows, found_grads, unique_size, plan.slab_rows)
  dense_grads = runtime.constrain_update(dense_grads)
  updates, dense_opt = state.tx.update(dense_grads, opt._replace(sum=_without_slab(opt.sum)),
                                       dense)
  slab, slab_sum = adagrad_rows(slab, slab_sum, ids, row_grads, lr(opt.count), epsilon)
  params = _with_slab(optax.apply_updates(dense, updates), slab)
  opt_state = dense_opt._replace(sum=_with_slab(dense_opt.sum, slab_sum))
  state = state.replace(step=state.step + 1, params=runtime.restore_param_layout(params),
                        opt_state=opt_state)
  return state, loss


def eval_step(state, batch):
  """Every example's click probability, label and mask (kept on the devices: the AUC is
  computed there, jax_auc.py)."""
  logits = state.apply_fn({"params": state.params}, batch["dense"], batch["sparse"])
  return {"score": jax.nn.sigmoid(logits), "label": batch["label"], "mask": batch["mask"]}


class DlrmTrainer(MeshTrainer):
  spec = spec.SPEC
  # The tables' update: sparse (sparse_train_step, every layout) or dense (train_step).
  sparse_tables = True

  def __init__(self, cfg, ctx):
    super().__init__(cfg, ctx)
    self.model = jax_model.build(cfg, self.dtype, self.runtime.model)
    self.schedule = spec.schedule_for(cfg)
    self.tx = jax_optimizers.make_adagrad(cfg.optimizer, self.schedule)
    # the eval's AUC on the devices: every batch's scores stay there (jax_auc.py)
    self.evaluator = jax_auc.DeviceAucEvaluator(spec.AUC.name)

  def create_state(self, rng):
    m = self.cfg.model
    variables = self.model.init(rng, jnp.zeros((1, m.dense_features)),
                                jnp.zeros((1, sum(m.multi_hot_sizes)), jnp.int32))
    return train_state.TrainState.create(apply_fn=self.model.apply, params=variables["params"],
                                         tx=self.tx)

  def train_step_fn(self, remat=None):
    del remat
    if not self.sparse_tables:
      return functools.partial(train_step, runtime=self.runtime)
    m = self.cfg.model
    return functools.partial(
        sparse_train_step, runtime=self.runtime, plan=self.model.plan,
        multi_hot_sizes=tuple(m.multi_hot_sizes), unique_size=spec.unique_rows_bound(
            self.cfg, self.cfg.train.global_batch_size),
        lr=lambda step: self.schedule(step, ops=jnp), epsilon=self.cfg.optimizer.epsilon)

  def eval_step(self, state, batch):
    return eval_step(state, batch)


make_trainer = DlrmTrainer        # WorkloadSpec.trainer_modules: (cfg, ctx) -> the trainer
