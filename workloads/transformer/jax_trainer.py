"""Transformer training and BLEU eval in JAX (flax + optax), behind the driver's Trainer API.

The train step is the reference's: label-smoothed cross entropy over non-padding target tokens
(summed, divided by their count over the global batch), TF-style Adam on the rsqrt schedule.
The eval step translates a batch with beam search (compiled once, inside the eval step) and
returns the best beam's tokens; the host turns them into text and BLEU statistics
(host_bleu.BleuEvaluator, on the host: the base gathers every process's outputs, padding
dropped by 'mask'), summed
over the eval set and scored at the end, since BLEU is a corpus-level score.
"""
import functools

import jax
import jax.numpy as jnp
from flax.training import train_state

from workloads.optim import jax_optimizers
from workloads.parallel import jax_moe, jax_pipeline
from workloads.parallel.jax_runtime import DATA
from workloads.parallel.jax_trainer_base import MeshTrainer, apply_update
from workloads.transformer import jax_beam_search, jax_model, spec

START_ID = 0                       # the decoder's first input, as the reference's


class TrainState(train_state.TrainState):
  dropout_key: jax.Array


def loss_fn(params, apply_fn, batch, label_smoothing, rng=None):
  """(mean smoothed cross entropy over the batch's target tokens plus, with expert layers,
  their router losses; (token count, the routers' figures or None))."""
  train = rng is not None
  logits, sown = apply_fn({"params": params}, batch["inputs"], batch["targets"], train=train,
                          packed=spec.packed_features(batch), mutable=["moe"],
                          rngs={"dropout": rng} if train else None)
  total, count = jax_model.smoothed_cross_entropy(logits, batch["targets"], label_smoothing)
  loss = total / jnp.maximum(count, 1.0)
  if not sown:
    return loss, (count, None)
  return loss + jax_moe.aux_loss(sown), (count, jax_moe.router_metrics(sown))


def pipelined_loss_and_grads(model, runtime, cut, params, batch, rng, *, label_smoothing,
                             remat=False, bubble_fill=0.0, weights=None):
  """GPipe (workloads/parallel/jax_pipeline.py) over the one list of encoder then decoder
  layers cut per `cut`, each data replica's batch in runtime.microbatches micro-batches; the
  loss is the same sum over all target tokens divided by their count over the global batch,
  and dropout is keyed by example (jax_layers.ExampleDropout), so neither depends on K or M.
  `rng`: the step's dropout key, None for no dropout. `weights`: the stage-owned layout
  (jax_stage_weights.StageWeights) `params` are stored in, or None for the whole tree on every
  device. -> (loss, grads in the form of `params`, iterations run)."""
  global_batch, length = batch["targets"].shape
  rows = global_batch // runtime.data // runtime.microbatches
  boundary = jnp.full((rows, length, model.cfg.hidden_size), bubble_fill, model.dtype)
  carry = {"encoded": boundary, "decoded": boundary}
  train = rng is not None

  def layers(p, x, micro, start, end):
    y, logits = model.apply({"params": p}, x, micro["inputs"], micro["targets"],
                            spec.packed_features(micro), start, end, train,
                            method=jax_model.Transformer.pipeline_layers,
                            rngs={"dropout": rng} if train else None)
    if logits is None:
      return y, jnp.zeros((), jax_model.accumulation_dtype(model.dtype))
    total, _ = jax_model.smoothed_cross_entropy(logits, micro["targets"], label_smoothing)
    return jax.tree.map(jnp.zeros_like, y), total

  def tokens(batch):                 # the global batch's target tokens
    return jax.lax.psum(jnp.sum(batch["targets"] != jax_model.PAD_ID), DATA)

  def loss_of(total, tokens):
    return total / jnp.maximum(tokens, 1).astype(total.dtype)

  return jax_pipeline.summed_loss_and_grads(runtime, cut, params, batch, carry, layers, tokens,
                                            loss_of, remat=remat, weights=weights)


def train_step(state, batch, *, label_smoothing, runtime, pipelined=None):
  """`pipelined`: pipelined_loss_and_grads with its model, runtime and cut bound, or None.
  -> (state, loss), or with expert layers (state, {'loss', 'router': their figures})."""
  rng = jax.random.fold_in(state.dropout_key, state.step)
  router = None
  if pipelined is not None:                          # GPipe over 'stage' and micro-batches
    loss, grads, _ = pipelined(state.params, batch, rng, label_smoothing=label_smoothing)
  else:
    (loss, (_, router)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params, state.apply_fn, batch, label_smoothing, rng)
  state = apply_update(state, grads, runtime)
  return state, (loss if router is None else {"loss": loss, "router": router})


def translate(model, params, inputs, model_cfg):
  """Beam search over `inputs` [B, L] -> the best beam's tokens [B, L + extra_decode_length]
  (EOS and the zeros after it included)."""
  apply = functools.partial(model.apply, {"params": params})
  encoded, encoder_bias = apply(inputs, method=jax_model.Transformer.encode)
  max_decode_length = inputs.shape[1] + model_cfg.extra_decode_length
  cache = {"decoder": apply(encoded, max_decode_length, method=jax_model.Transformer.init_cache),
           "encoder_bias": encoder_bias}

  def symbols_to_logits(ids, i, cache):
    logits, decoder = apply(ids, i, cache["decoder"], cache["encoder_bias"],
                            method=jax_model.Transformer.decode_step)
    return logits, {**cache, "decoder": decoder}

  sequences, _ = jax_beam_search.beam_search(
      symbols_to_logits, jnp.full((inputs.shape[0],), START_ID, jnp.int32), cache,
      model_cfg.vocab_size, model_cfg.beam_size, model_cfg.alpha, max_decode_length,
      jax_model.EOS_ID)
  return sequences[:, 0, 1:]


class TransformerTrainer(MeshTrainer):
  spec = spec.SPEC
  owns_stage_weights = True

  def __init__(self, cfg, ctx):
    super().__init__(cfg, ctx)
    self.model = jax_model.build(cfg, self.dtype)
    self.schedule = spec.schedule_for(cfg)
    self.tx = jax_optimizers.make_adam(cfg.optimizer, self.schedule)

  def init_params(self, rng):
    ids = jnp.zeros((1, self.cfg.data.max_length), jnp.int32)
    return self.model.init(rng, ids, ids)["params"]

  def create_state(self, rng):
    init_key, dropout_key = jax.random.split(rng)
    return TrainState.create(apply_fn=self.model.apply, params=self.init_params(init_key),
                             tx=self.tx, dropout_key=dropout_key)

  def layer_profile(self, rows):
    """[(forward FLOPs, output bytes)] per pipeline layer on `rows` rows (simulate); the
    output is what a stage cut after the layer sends on: the encoder's output, and once the
    decoder has begun the decoder's too."""
    params = jax.eval_shape(self.create_state, jax.random.key(0)).params
    n, length = self.cfg.model.num_layers, self.cfg.data.max_length
    ids = jax.ShapeDtypeStruct((rows, length), jnp.int32)
    hidden = jax.ShapeDtypeStruct((rows, length, self.cfg.model.hidden_size), self.dtype)

    def layer(p, carry, i):
      boundary = {"encoded": carry["encoded"],
                  "decoded": carry.get("decoded", jnp.zeros(hidden.shape, hidden.dtype))}
      y, _ = self.model.apply({"params": p}, boundary, carry["inputs"], carry["targets"], None,
                              i, i + 1, False, method=jax_model.Transformer.pipeline_layers)
      kept = {"encoded": y["encoded"]} if i < n else y
      return {**kept, "inputs": carry["inputs"], "targets": carry["targets"]}

    profile = jax_pipeline.layer_profile(
        layer, params, {"encoded": hidden, "inputs": ids, "targets": ids},
        2 * n)
    ids_bytes = 2 * rows * length * 4                 # the token ids ride along: not sent
    return [(flops, nbytes - ids_bytes) for flops, nbytes in profile]

  def train_step_fn(self, remat=None):
    """The train step; `remat` overrides parallel.remat (describe compiles both)."""
    return functools.partial(train_step, runtime=self.runtime,
                             pipelined=self.pipelined(pipelined_loss_and_grads, remat),
                             label_smoothing=self.cfg.optimizer.label_smoothing)

  def eval_step(self, state, batch):
    tokens = translate(self.model, state.params, batch["inputs"], self.cfg.model)
    return {"tokens": tokens, "index": batch["index"], "mask": batch["mask"]}


make_trainer = TransformerTrainer        # WorkloadSpec.trainer_modules: (cfg, ctx) -> the trainer
