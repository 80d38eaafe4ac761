"""BERT pre-training and masked-LM eval in JAX (flax + optax), behind the driver's Trainer API.

Distribution comes from workloads/parallel/jax_runtime.py, as for ResNet: batches sharded over
the data axes, parameters replicated, LAMB's moments (and the update computed from them)
sharded when weight-update sharding is on. LAMB's per-layer norms are over whole arrays, so
GSPMD adds the cross-shard reductions and the step equals the unsharded one.
"""
import functools

import jax
import jax.numpy as jnp
from flax.training import train_state

from workloads.bert import input_pipeline, jax_model, packing, spec
from workloads.optim import jax_optimizers
from workloads.parallel.jax_trainer_base import MeshTrainer, apply_update



class TrainState(train_state.TrainState):
  dropout_key: jax.Array


def loss_and_grads(state, params, batch, train=True):
  def loss_fn(p):
    mlm_logits, nsp_logits = state.apply_fn(
        {"params": p}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
        batch["masked_lm_positions"], train=train,
        positions=batch.get("positions"), cls_positions=batch.get("cls_positions"),
        rngs={"dropout": jax.random.fold_in(state.dropout_key, state.step)})
    return jax_model.pretraining_loss(mlm_logits, nsp_logits, batch)
  return jax.value_and_grad(loss_fn)(params)


def train_step(state, batch, *, runtime):
  loss, grads = loss_and_grads(state, state.params, batch)
  return apply_update(state, grads, runtime), loss


def eval_step(state, batch):
  mlm_logits, _ = state.apply_fn({"params": state.params}, batch["input_ids"],
                                 batch["input_mask"], batch["segment_ids"],
                                 batch["masked_lm_positions"], train=False)
  correct, count = jax_model.masked_lm_correct(mlm_logits, batch, batch["mask"])
  return jnp.stack([correct, count])


class BertTrainer(MeshTrainer):
  spec = spec.SPEC

  def __init__(self, cfg, ctx):
    super().__init__(cfg, ctx)
    self.variable_samples = cfg.data.packing      # packed rows: each step its own count
    rows = spec.packed_rows(cfg, cfg.train.global_batch_size)
    if cfg.data.packing and rows % self.runtime.shape.batch_shards:
      raise ValueError(f"data.packing=true: a step's {rows} rows (train.global_batch_size / "
                       f"data.packing_factor) do not split over {self.runtime.shape.batch_shards}"
                       " data replicas; allowed: a batch whose rows they divide")
    self.model = jax_model.build(cfg, self.dtype)
    self.schedule = spec.schedule_for(cfg)
    self.tx = jax_optimizers.make_lamb(cfg.optimizer, self.schedule)

  def init_params(self, rng):
    ids = jnp.zeros((1, self.cfg.data.max_seq_length), jnp.int32)
    positions = jnp.zeros((1, self.cfg.data.max_predictions_per_seq), jnp.int32)
    return self.model.init(rng, ids, ids, ids, positions)["params"]

  def create_state(self, rng):
    init_key, dropout_key = jax.random.split(rng)
    return TrainState.create(apply_fn=self.model.apply, params=self.init_params(init_key),
                             tx=self.tx, dropout_key=dropout_key)

  def load_weights(self, state, shardings):
    """The reference's TF1 checkpoint over the initialised parameters (the MLPerf run starts
    from it), placed as they were. LAMB's moments start at zero whatever the parameters."""
    if not (self.cfg.data.init_checkpoint and self.cfg.data.source == "tfrecord"):
      return state
    params = jax_model.load_tf1_checkpoint(
        jax.eval_shape(lambda: state.params), input_pipeline.checkpoint_path(self.cfg, self.ctx),
        self.cfg.model.num_layers)
    return state.replace(params=jax.device_put(params, shardings.params))

  def samples_in(self, host_batch):
    if self.cfg.data.packing:
      return packing.samples_in(host_batch)
    return super().samples_in(host_batch)

  def train_step_fn(self, remat=None):
    del remat                                        # BERT does not pipeline
    return functools.partial(train_step, runtime=self.runtime)

  def eval_step(self, state, batch):
    return eval_step(state, batch)


def make_trainer(cfg, ctx):
  return BertTrainer(cfg, ctx)
