"""What the JAX trainers of the batch-norm image models (ResNet, EfficientNet, SSD) share: a
train state that carries the batch statistics, the loss whose forward moves them, the train
step's choice between grouped and global batch norm, and the state built from a zero image.
A workload keeps its own loss of the model's outputs, optimizer and eval step.
"""
import jax
import jax.numpy as jnp
from flax.training import train_state

from workloads.parallel.jax_runtime import DATA
from workloads.parallel.jax_trainer_base import MeshTrainer


class TrainState(train_state.TrainState):
  batch_stats: dict


def loss_and_grads(apply_fn, params, batch_stats, batch, loss_of, **apply_kwargs):
  """(loss, grads, the batch statistics the forward moved) of the model in train mode on
  batch['image']: `loss_of(outputs, params)` is the loss of its outputs; `apply_kwargs` go to
  apply_fn (EfficientNet's dropout key)."""
  def loss_fn(p):
    outputs, updates = apply_fn({"params": p, "batch_stats": batch_stats}, batch["image"],
                                train=True, mutable=["batch_stats"], **apply_kwargs)
    return loss_of(outputs, p), updates
  (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  return loss, grads, updates["batch_stats"]


def grouped_or_global(state, batch, runtime, step_loss_and_grads):
  """`step_loss_and_grads(params, batch_stats, batch)` -> (loss, grads, batch statistics) on
  the step's batch: with grouped batch norm per device, statistics pooled over the 'bn' groups
  (jax_runtime.MeshRuntime.grouped_bn_step); else once, on the whole batch (plain jit: GSPMD
  computes the statistics over the global batch)."""
  if runtime.grouped_bn:
    return runtime.grouped_bn_step(step_loss_and_grads)(state.params, state.batch_stats, batch)
  return step_loss_and_grads(state.params, state.batch_stats, batch)


class BatchNormTrainer(MeshTrainer):
  """A MeshTrainer of a batch-norm model on square RGB images (cfg.data.image_size): its
  `create_state` initialises the model on a zero image into a `state_class` (TrainState, or a
  workload's extension of it) with the optimizer `tx`, which the workload's __init__ sets."""
  built_with = ("tx",)
  tx: object                     # the optax transformation (one object: the state's pytree
                                 # metadata must match between create_state calls)
  state_class = TrainState

  @property
  def bn_axis(self):
    """What batch norm pools its statistics over (the model's `build` argument): the 'bn'
    groups (grouped), the data replicas of a pipeline (shard_map: explicit), else None, the
    batch GSPMD spreads over the mesh (implicit)."""
    rt = self.runtime
    return "bn" if rt.grouped_bn else DATA if self.stage_cut and rt.data > 1 else None

  def init_variables(self, rng):
    """The model's initial {'params', 'batch_stats'}."""
    size = self.cfg.data.image_size
    return self.model.init(rng, jnp.zeros((1, size, size, 3)), train=False)

  def new_state(self, variables, **fields):
    """A `state_class` of `variables` and tx; `fields`: the extension's own."""
    return self.state_class.create(apply_fn=self.model.apply, params=variables["params"],
                                   tx=self.tx, batch_stats=variables["batch_stats"], **fields)

  def create_state(self, rng):
    return self.new_state(self.init_variables(rng))
