"""Llama 3.1 8B pre-training and its log-perplexity eval in JAX (flax + optax), behind the
driver's Trainer API.

Distribution comes from workloads/parallel/jax_runtime.py: batches split over `data`, the
parameters laid out by spec.PARAM_AXES (Megatron's split of heads, FFN and vocabulary over a
`model` axis), AdamW's moments (and the update computed from them) sharded over `data` under
weight-update sharding. With `--mesh stage=K` (and micro-batches) the decoder runs as a GPipe
pipeline (jax_pipeline.py) whose stages own their weights (jax_stage_weights.py): AdamW runs per
stage on each stage's own tree, after the clip by the global norm of every stage's gradient.

The loss is the mean next-token cross-entropy over every token of the global batch (the
reference's eod_mask_loss=False: no token is left out); the eval's [sum of the tokens'
cross-entropy, tokens] summed over the 1,024 eval sequences gives the log-perplexity.
"""
import functools

import jax
import jax.numpy as jnp
from flax.training import train_state

from workloads.llama31_8b import jax_model, spec
from workloads.optim import jax_optimizers
from workloads.parallel import jax_pipeline
from workloads.parallel.jax_runtime import DATA
from workloads.parallel.jax_trainer_base import MeshTrainer, apply_update


def loss_and_grads(state, params, batch):
  def loss_fn(p):
    return jax_model.lm_loss(state.apply_fn({"params": p}, batch["tokens"]), batch)
  return jax.value_and_grad(loss_fn)(params)


def pipelined_loss_and_grads(model, runtime, cut, params, batch, rng, *, remat=False,
                             bubble_fill=0.0, weights=None):
  """GPipe over the decoder layers cut per `cut`, each data replica's batch in
  runtime.microbatches micro-batches: the last stage sums the token cross-entropy of its
  micro-batches (jax_model.loss_sums), divided by the global batch's token count, so the loss
  is the one without a pipeline. `rng` is unused (Llama has no dropout). `weights`: the
  stage-owned layout `params` are stored in, or None. -> (loss, grads, iterations)."""
  del rng
  global_batch, length = batch["tokens"].shape
  rows = global_batch // runtime.data // runtime.microbatches
  carry = jnp.full((rows, length, model.config.hidden_size), bubble_fill, model.dtype)
  acc = jax_model.accumulation_dtype(model.dtype)

  def layers(p, x, micro, start, end):
    y, logits = model.apply({"params": p}, x, micro, start, end, False,
                            method=jax_model.LlamaLM.pipeline_layers)
    if logits is None:
      return y, jnp.zeros((), acc)
    return jnp.zeros_like(y), jax_model.loss_sums(logits, micro).astype(acc)

  def tokens(batch):                 # the global batch's counted tokens
    return jax.lax.psum(jax_model.loss_denominators(batch, acc), DATA)

  def loss_of(total, tokens):
    return total / tokens

  return jax_pipeline.summed_loss_and_grads(runtime, cut, params, batch, carry, layers, tokens,
                                            loss_of, remat=remat, weights=weights)


def train_step(state, batch, *, runtime, pipelined=None):
  """`pipelined`: pipelined_loss_and_grads with its model, runtime and cut bound, or None."""
  if pipelined is not None:                          # GPipe over 'stage' and micro-batches
    loss, grads, _ = pipelined(state.params, batch, None)
  else:
    loss, grads = loss_and_grads(state, state.params, batch)
  return apply_update(state, grads, runtime), loss


class LlamaTrainer(MeshTrainer):
  spec = spec.SPEC
  owns_stage_weights = True

  def __init__(self, cfg, ctx):
    super().__init__(cfg, ctx)
    self.model = jax_model.build(cfg, self.dtype)
    self.schedule = spec.schedule_for(cfg)
    self.tx = jax_optimizers.make_adamw(cfg.optimizer, self.schedule)
    # stage-owned weights: AdamW per stage, after the clip by the norm of every stage's gradient
    clip = cfg.optimizer.clip_norm
    self._stage_update = (jax_optimizers.make_adamw(cfg.optimizer, self.schedule, clip=False),
                          functools.partial(jax_optimizers.clip_by_global_norm, clip_norm=clip)
                          if clip else None)

  def stage_update(self, tx):
    assert tx is self.tx
    return self._stage_update

  def init_params(self, rng):
    tokens = jnp.zeros((1, self.cfg.data.max_seq_length), jnp.int32)
    return self.model.init(rng, tokens)["params"]

  def create_state(self, rng):
    return train_state.TrainState.create(apply_fn=self.model.apply,
                                         params=self.init_params(rng), tx=self.tx)

  def layer_profile(self, rows):
    """[(forward FLOPs, output bytes)] per pipeline layer (decoder layer) on `rows` sequences
    (simulate)."""
    return jax_pipeline.hidden_state_profile(self, jax_model.LlamaLM.pipeline_layers, rows)

  def train_step_fn(self, remat=None):
    """The train step; `remat` overrides parallel.remat (describe compiles both)."""
    return functools.partial(train_step, runtime=self.runtime,
                             pipelined=self.pipelined(pipelined_loss_and_grads, remat))

  def eval_step(self, state, batch):
    logits = state.apply_fn({"params": state.params}, batch["tokens"])
    return jnp.stack(jax_model.eval_sums(logits, batch, batch["mask"]))


make_trainer = LlamaTrainer        # WorkloadSpec.trainer_modules: (cfg, ctx) -> the trainer
