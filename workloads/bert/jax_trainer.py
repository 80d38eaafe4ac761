"""BERT pre-training and masked-LM eval in JAX (flax + optax), behind the driver's Trainer API.

Distribution comes from workloads/parallel/jax_runtime.py, as for ResNet: batches sharded over
the data axes, parameters replicated, LAMB's moments (and the update computed from them)
sharded when weight-update sharding is on. LAMB's per-layer norms are over whole arrays, so
GSPMD adds the cross-shard reductions and the step equals the unsharded one.

With `--mesh stage=K` (and micro-batches) the encoder runs as a GPipe pipeline
(jax_pipeline.py), beside `data` and a `model` axis (3-D parallelism). Without a model axis
the stages own their weights (jax_stage_weights.py): LAMB runs per stage on each stage's own
tree, after the reference's clip by the global norm, which reads every stage's gradient and so
runs first on the whole stored gradient (the stages' rows and the shared word embedding).
"""
import functools

import jax
import jax.numpy as jnp
from flax.training import train_state

from workloads.bert import input_pipeline, jax_model, packing, spec
from workloads.optim import jax_optimizers
from workloads.parallel import jax_pipeline
from workloads.parallel.jax_runtime import DATA
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


def pipelined_loss_and_grads(model, runtime, cut, params, batch, rng, *, remat=False,
                             bubble_fill=0.0, weights=None):
  """GPipe over the encoder layers cut per `cut`, each data replica's batch in
  runtime.microbatches micro-batches: the last stage sums the loss's numerators
  (jax_model.loss_sums) over its micro-batches, divided by the global batch's denominators, so
  the loss is the one without a pipeline; dropout is keyed by example, so no number depends on
  K or M. `rng`: the step's dropout key, None for no dropout. `weights`: the stage-owned layout
  (jax_stage_weights.StageWeights) `params` are stored in, or None for the whole tree on every
  device. -> (loss, grads in the form of `params`, iterations)."""
  global_batch, length = batch["input_ids"].shape
  rows = global_batch // runtime.data // runtime.microbatches
  carry = jnp.full((rows, length, model.config.hidden_size), bubble_fill, model.dtype)
  train = rng is not None
  acc = jax_model.accumulation_dtype(model.dtype)

  def layers(p, x, micro, start, end):
    y, logits = model.apply({"params": p}, x, micro, start, end, train,
                            method=jax_model.BertPretraining.pipeline_layers,
                            rngs={"dropout": rng} if train else None)
    if logits is None:
      return y, jnp.zeros((2,), acc)
    return jnp.zeros_like(y), jnp.stack(jax_model.loss_sums(*logits, micro)).astype(acc)

  def denominators(batch):           # (masked tokens, samples) of the global batch
    return tuple(jax.lax.psum(d, DATA) for d in jax_model.loss_denominators(batch, acc))

  def loss_of(sums, denominators):
    masked, samples = denominators
    return sums[0] / (masked + 1e-5) + sums[1] / samples

  return jax_pipeline.summed_loss_and_grads(runtime, cut, params, batch, carry, layers,
                                            denominators, loss_of, remat=remat, weights=weights)


def train_step(state, batch, *, runtime, pipelined=None):
  """`pipelined`: pipelined_loss_and_grads with its model, runtime and cut bound, or None."""
  if pipelined is not None:                          # GPipe over 'stage' and micro-batches
    rng = jax.random.fold_in(state.dropout_key, state.step)
    loss, grads, _ = pipelined(state.params, batch, rng)
  else:
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
  owns_stage_weights = True

  def __init__(self, cfg, ctx):
    super().__init__(cfg, ctx)
    self.variable_samples = cfg.data.packing      # packed rows: each step its own count
    rows = spec.packed_rows(cfg, cfg.train.global_batch_size)
    shards = self.runtime.shape.batch_shards * self.runtime.microbatches
    if cfg.data.packing and rows % shards:
      raise ValueError(f"data.packing=true: a step's {rows} rows (train.global_batch_size / "
                       f"data.packing_factor) do not split over {self.runtime.shape.batch_shards}"
                       f" data replicas x {self.runtime.microbatches} micro-batches; allowed: a "
                       "batch whose rows they divide")
    self.model = jax_model.build(cfg, self.dtype)
    self.schedule = spec.schedule_for(cfg)
    self.tx = jax_optimizers.make_lamb(cfg.optimizer, self.schedule)
    # stage-owned weights: LAMB per stage, after the clip by the norm of every stage's gradient
    clip = cfg.optimizer.clip_norm
    self._stage_update = (jax_optimizers.make_lamb(cfg.optimizer, self.schedule, clip=False),
                          functools.partial(jax_optimizers.clip_by_global_norm, clip_norm=clip)
                          if clip else None)

  def stage_update(self, tx):
    assert tx is self.tx
    return self._stage_update

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
        jax.eval_shape(lambda: self.params_of(state)),
        input_pipeline.checkpoint_path(self.cfg, self.ctx), self.cfg.model.num_layers)
    if self.stage_weights is not None:               # stage-owned: in their stored form
      params = self.stage_weights.store(params)
    return state.replace(params=jax.device_put(params, shardings.params))

  def samples_in(self, host_batch):
    if self.cfg.data.packing:
      return packing.samples_in(host_batch)
    return super().samples_in(host_batch)

  def layer_profile(self, rows):
    """[(forward FLOPs, output bytes)] per pipeline layer (encoder layer) on `rows` sequences
    (simulate)."""
    return jax_pipeline.hidden_state_profile(self, jax_model.BertPretraining.pipeline_layers, rows)

  def train_step_fn(self, remat=None):
    """The train step; `remat` overrides parallel.remat (describe compiles both)."""
    return functools.partial(train_step, runtime=self.runtime,
                             pipelined=self.pipelined(pipelined_loss_and_grads, remat))

  def eval_step(self, state, batch):
    return eval_step(state, batch)


make_trainer = BertTrainer        # WorkloadSpec.trainer_modules: (cfg, ctx) -> the trainer
