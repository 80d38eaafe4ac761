"""GPipe in JAX on simulated CPU devices, in float64: the pipelined loss, every gradient, the
batch-norm statistics and the parameters after two optimizer steps equal one device's
(rtol 1e-9) for K in {2, 4} stages and M in {1, 2, 4, 8} micro-batches, with and without
re-materialization and with a data axis beside the stages.

References are computed here without the pipeline: the Transformer's ordinary loss on the whole
batch (dropout on: it is keyed by example, so the masks do not depend on K or M); ResNet's
micro-batched computation on one device (batch norm normalises each micro-batch, as GPipe
does, and the moving averages take the mean of the micro-batches' statistics). Bubbles filled
with NaN leave every value finite and equal; the iterations are counted in the loop."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from flax import traverse_util

from harness import pipeline
from harness.workload import RunContext
from tests.parallel.test_jax_model_parallel import bert_config, float64_trainer, transformer_config
from workloads.bert import jax_model as bert_model
from workloads.bert import jax_trainer as bert_trainer
from workloads.bert import spec as bert_spec
from workloads.common import jax_top1
from workloads.parallel import jax_runtime, jax_stage_weights
from workloads.resnet import jax_trainer as resnet_trainer
from workloads.resnet import spec as resnet_spec
from workloads.transformer import jax_model as transformer_model
from workloads.transformer import jax_trainer as transformer_trainer
from workloads.transformer import spec as transformer_spec
from tests.trees import assert_trees_close

pytestmark = pytest.mark.usefixtures("jax_float64")     # tests/conftest.py

RTOL = 1e-9
# (stages, micro-batches): fewer micro-batches than stages and twice as many (4, 2 showed what
# 2, 1 does at twice the stages: dropped for suite time; as many as stages, 2, 2, is ResNet's
# case below: the schedule is the same code for every model)
GRID = [(2, 1), (4, 8)]


def assert_close(actual, expected):
  assert_trees_close(actual, expected, RTOL, atol_of_max=True)


# ------------------------------------------------------------------ Transformer
@functools.lru_cache(maxsize=None)
def transformer(mesh, microbatches, compiled=False, wus=False):
  """`compiled`: with the trainer's train step (the tests of steps and of the program)."""
  cfg = transformer_config(layers=2)
  cfg.parallel.microbatches = microbatches
  return float64_trainer(transformer_spec, transformer_model, cfg, mesh, wus=wus,
                         compile_steps=compiled)


@functools.lru_cache(maxsize=None)
def transformer_reference():
  t = transformer("stage=1,data=1", 1)
  batch = jax.device_get(t.synthetic_batch())      # on the host: each mesh places its own
  rng = jax.random.fold_in(t.state.dropout_key, t.state.step)
  loss = lambda p: transformer_trainer.loss_fn(p, t.state.apply_fn, batch, 0.1, rng)[0]
  return batch, rng, jax.device_get(jax.jit(jax.value_and_grad(loss))(t.state.params))


def transformer_pipelined(t, batch, rng, remat=False, fill=0.0):
  """The pipelined loss and gradients from the trainer's parameters in their layout (split on
  `model` when the mesh has one), traced as the trainer traces (activations laid out)."""
  fn = functools.partial(transformer_trainer.pipelined_loss_and_grads, t.model, t.runtime,
                         t.stage_cut, label_smoothing=0.1, remat=remat, bubble_fill=fill,
                         weights=t.stage_weights)
  rng = jax.device_put(rng, t.runtime.replicated)
  with t.runtime.tracing():
    loss, grads, iterations = jax.device_get(jax.jit(fn)(t.state.params, batch, rng))
  return loss, jax.device_get(t.params_of(grads)), iterations   # stage-owned rows unpacked


@pytest.mark.parametrize("stages,microbatches", GRID)
def test_transformer_pipelined_equals_one_device(stages, microbatches):
  batch, rng, (loss, grads) = transformer_reference()
  t = transformer(f"stage={stages},data=1", microbatches)
  assert t.stage_cut == pipeline.stage_cut(range(4), stages)
  got_loss, got_grads, iterations = transformer_pipelined(t, batch, rng)
  assert iterations == microbatches + stages - 1
  assert_close(got_loss, loss)
  assert_close(got_grads, grads)


@pytest.mark.parametrize("mesh,microbatches,remat,fill", [
    ("stage=4,data=2", 2, True, 0.0), ("stage=2,data=1", 4, True, float("nan"))])
# (stage=4,data=1 M=8: GRID's; stage=2,data=2 M=4 without remat: what these two and GRID's
# 4, 8 show, 12 CPU s; data x stage x model: the two-step test)
def test_transformer_with_data_axis_remat_and_nan_bubbles(mesh, microbatches, remat, fill):
  batch, rng, (loss, grads) = transformer_reference()
  got_loss, got_grads, _ = transformer_pipelined(transformer(mesh, microbatches), batch, rng,
                                                 remat, fill)
  assert np.isfinite(got_loss) and all(np.isfinite(g).all() for g in jax.tree.leaves(got_grads))
  assert_close(got_loss, loss)
  assert_close(got_grads, grads)


def test_transformer_two_pipelined_steps_equal_two_steps_on_one_device():
  """3-D parallelism with weight-update sharding: data x stage x model (GSPMD over model
  inside each stage's manual shard_map): the weights split on model, the optimizer state and
  update on data too, the step's model all-reduces, stage shifts, one gradient all-reduce over
  data and stage and the updated weights' all-gather over data; two steps equal one device's,
  and so do those of stages owning their weights. (Weight-update sharding had a stage=2,data=2
  trainer of its own, compiled and stepped: 83 -> 55 CPU s for this test without it. The
  update's layout is the same rule beside a model axis; that it keeps the weights whole over
  stage is asserted on an uncompiled stage=2,data=2 trainer.)"""
  one = transformer("stage=1,data=1", 1, True)
  piped = transformer("stage=2,data=2,model=2", 2, True, wus=True)
  owned = transformer("stage=4,data=2", 2, True)        # stages own their weights (no model)
  # weight-update sharding over data: the weights stay whole over stage (a row split on data
  # would reach the per-stage update in pieces: the devices deadlocked)
  assert transformer("stage=2,data=2", 2, wus=True).stage_weights is None
  assert piped.stage_weights is None and owned.stage_weights is not None
  kernel = piped.state.params["decoder"]["layer_0"]["ffn"]["filter"]["kernel"]
  assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "model")
  # its Adam moments split on data as well: a device holds a quarter of the kernel's
  moment = piped.state.opt_state.m["decoder"]["layer_0"]["ffn"]["filter"]["kernel"]
  assert moment.addressable_shards[0].data.shape == (kernel.shape[0] // 2, kernel.shape[1] // 2)
  collectives = piped.runtime.collectives_by_axis(piped._train_step.as_text())  # pylint: disable=protected-access
  assert {("all-reduce", "model"), ("collective-permute", "stage"),
          ("all-reduce", "data+stage"), ("all-gather", "data")} <= set(collectives)
  for t in (one, piped, owned):
    batch = t.synthetic_batch()                    # the same values, on each trainer's mesh
    for _ in range(2):
      t.state, _ = t._train_step(t.state, batch)   # pylint: disable=protected-access
  assert_close(jax.device_get(piped.state.params), jax.device_get(one.state.params))
  # stage-owned: TF-Adam's per-parameter state, updated per stage on each stage's own tree
  assert_close(jax.device_get(owned.params_of(owned.state)), jax.device_get(one.state.params))


def test_stages_own_their_weights_and_optimizer_state():
  """stage=4,data=2: a device's shard of the stages' rows unpacks to exactly its stage's own
  layers' parameters (values equal to one device's), the per-device bytes read from the arrays
  are those and the shared embedding's, the optimizer state's likewise; eval (each batch's
  program gathers the rows) equals one device's."""
  one = transformer("stage=1,data=1", 1, True)
  t = transformer("stage=4,data=2", 2, True)
  weights, whole = t.stage_weights, jax.device_get(one.state.params)
  flat_whole = {"/".join(k): v for k, v in traverse_util.flatten_dict(whole).items()}
  assert weights.shared == ["embedding_shared/embedding"]    # read by stages 0, 2 and 3
  for k, paths in enumerate(weights.owned):                  # encoder 0, encoder 1 + norm, ...
    stack = "encoder" if k < 2 else "decoder"
    assert paths and all(p.startswith((f"{stack}/layer_{k % 2}/", f"{stack}/output_norm/"))
                         for p in paths)
  rows = t.state.params[jax_stage_weights.ROWS]
  for shard in rows.addressable_shards:
    k = shard.index[0].start                                 # the stage this device serves
    assert shard.data.shape == (1, weights.width)
    own = traverse_util.flatten_dict(weights.own(np.asarray(shard.data)[0], k), sep="/")
    assert sorted(own) == weights.owned[k]
    assert_close(own, {p: flat_whole[p] for p in weights.owned[k]})
  embedding = flat_whole["embedding_shared/embedding"].nbytes
  own_bytes = [sum(flat_whole[p].nbytes for p in paths) for paths in weights.owned]
  assert weights.width * 8 == max(own_bytes)
  assert jax_runtime.per_device_bytes(t.state.params) == max(own_bytes) + embedding
  total = sum(v.nbytes for v in flat_whole.values())
  assert sum(own_bytes) + embedding == total
  assert jax_runtime.per_device_bytes(t.state.params) < 0.5 * total
  # TF-Adam: m and v of the stage's own parameters (and the step count) in one row
  state_rows = t.state.opt_state[jax_stage_weights.ROWS]
  assert state_rows.sharding.spec == jax.sharding.PartitionSpec("stage", None)
  assert state_rows.addressable_shards[0].data.shape[1] == 2 * weights.width + 1
  info = t.describe()
  assert info.parameter_bytes_per_device == max(own_bytes) + embedding
  assert info.parameter_bytes_without_stages == total and info.parameters == total // 8
  # eval on the gathered tree: the beam search's tokens equal one device's
  rng = np.random.default_rng(0)
  size = t.eval_batch_size()
  batch = {"inputs": rng.integers(2, 48, (size, t.cfg.data.eval_max_length)).astype(np.int32),
           "index": np.arange(size, dtype=np.int32), "mask": np.ones(size, np.float32)}
  outputs = []
  for trainer in (one, t):
    placed = trainer.runtime.shard_batch(batch, trainer.batch_axes(True))
    with trainer.runtime.tracing():
      outputs.append(jax.device_get(jax.jit(trainer._eval_on_whole_params)(  # pylint: disable=protected-access
          trainer.state, placed)))
  np.testing.assert_array_equal(outputs[1]["tokens"], outputs[0]["tokens"])


# ------------------------------------------------------------------ BERT
def test_bert_pipelined_with_lamb_equals_one_device():
  """BERT's encoder as a pipeline (the embeddings with the first stage, the heads and the
  tied projection with the last) on data x stage x model with remat, and on data x stage with
  the stages owning their weights: the pipelined loss and gradients (dropout on, keyed by
  example; of the 3-D pipeline) and the parameters after two LAMB steps equal one device in
  float64. Stage-owned, LAMB's clip reads the global norm of every stage's gradient and its
  trust ratios and moments are per stage. (A stage=2,data=1 M=4 trainer here passed too: 12
  CPU s for what the Transformer's grid shows.)"""
  trainers = {}
  for mesh, microbatches in (("stage=1,data=1", 1), ("stage=2,data=2,model=2", 2),
                             ("stage=2,data=2", 2)):
    cfg = bert_config()
    # cut 1 + 1 (3 layers, cut 2 + 1, was 53 CPU s; a stage of several layers is the
    # Transformer's stage=2 cases'): each stage's own tree still holds a layer's many
    # parameters beside the embeddings or the heads, so LAMB's per-parameter trust ratios show
    cfg.model.num_layers = 2
    cfg.optimizer.clip_norm = 0.05                # below the gradient's norm: the clip acts
    cfg.parallel.microbatches = microbatches
    trainers[mesh] = float64_trainer(bert_spec, bert_model, cfg, mesh)
  one = trainers.pop("stage=1,data=1")
  owned = trainers["stage=2,data=2"]
  assert owned.stage_weights is not None and trainers["stage=2,data=2,model=2"].stage_weights is None
  batch = jax.device_get(one.synthetic_batch())
  rng = jax.random.fold_in(one.state.dropout_key, one.state.step)
  loss, grads = jax.device_get(jax.jit(jax.value_and_grad(
      lambda p: bert_trainer.loss_and_grads(one.state, p, batch)[0]))(one.state.params))
  assert optax.global_norm(grads) > 0.05
  assert all(t.stage_cut == (1, 1) for t in trainers.values())
  # the 3-D pipeline's loss and gradients (the stage-owned pipeline's reach its parameters
  # through the same function and LAMB: the two steps below)
  piped = trainers["stage=2,data=2,model=2"]
  fn = functools.partial(bert_trainer.pipelined_loss_and_grads, piped.model, piped.runtime,
                         piped.stage_cut, remat=True, weights=None)
  with piped.runtime.tracing():
    got_loss, got_grads, iterations = jax.device_get(jax.jit(fn)(
        piped.state.params, batch, jax.device_put(rng, piped.runtime.replicated)))
  assert iterations == piped.runtime.microbatches + 1
  assert_close(got_loss, loss)
  # atol: the key biases' gradients are zero but for rounding (softmax ignores a per-query
  # constant), as in the model-parallel BERT test
  assert_trees_close(jax.device_get(piped.params_of(got_grads)), grads, RTOL, 1e-12)
  kernel = piped.state.params["layer_0"]["intermediate"]["kernel"]
  assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "model")
  for t in (one, *trainers.values()):
    batch = t.synthetic_batch()                    # the same values, on each trainer's mesh
    for _ in range(2):
      t.state, _ = t._train_step(t.state, batch)   # pylint: disable=protected-access
  for t in trainers.values():
    assert_trees_close(jax.device_get(t.params_of(t.state)), jax.device_get(one.state.params),
                       RTOL, 1e-12)


# ------------------------------------------------------------------ ResNet
def resnet(mesh, microbatches, remat=False, compiled=False):
  """A float64 ResNet of 2+2 bottleneck blocks (four layers to cut) on 16x16 images."""
  cfg = resnet_spec.tiny()
  cfg.model.stage_sizes = (2, 2)
  cfg.data.source = "synthetic"
  cfg.parallel.mesh, cfg.parallel.microbatches, cfg.parallel.remat = mesh, microbatches, remat
  t = resnet_spec.SPEC.make_trainer("jax", cfg, RunContext(seed=0, preset="tiny"))
  t.dtype = jnp.float64
  t.model = t.model.clone(dtype=jnp.float64)
  create = t.create_state                         # pylint: disable=protected-access
  t.create_state = lambda rng: jax.tree.map(     # pylint: disable=protected-access
      lambda x: x.astype(jnp.float64) if getattr(x, "dtype", None) == jnp.float32 else x,
      create(rng))
  if not compiled:                                 # the pipelined function is jitted here
    t.compile_steps = lambda *args: None
  t.init()
  return t


@functools.lru_cache(maxsize=None)
def resnet_batch():
  t = resnet("stage=1,data=1", 1)
  return t, {k: np.asarray(v, np.float64) if v.dtype == jnp.float32 else np.asarray(v)
             for k, v in t.synthetic_batch().items()}


@functools.lru_cache(maxsize=None)
def resnet_reference(microbatches, data=1):
  """Loss, gradients and new batch statistics of the micro-batched step on one device: micro-
  batch j holds rows j of every data replica's share (the pipeline's micro-batches)."""
  t, batch = resnet_batch()
  model, stats = t.model.clone(bn_axis_name=None), t.state.batch_stats
  n = batch["label"].shape[0]
  rows = np.arange(n).reshape(data, microbatches, n // data // microbatches)

  def loss_fn(params):
    total, new = 0.0, []
    for j in range(microbatches):
      index = rows[:, j].reshape(-1)
      logits, updates = model.apply({"params": params, "batch_stats": stats},
                                    batch["image"][index], True, mutable=["batch_stats"])
      total += jax_top1.cross_entropy(logits, batch["label"][index], 10, 0.1) * len(index)
      new.append(updates["batch_stats"])
    return total / n, jax.tree.map(lambda *s: sum(s) / microbatches, *new)
  return jax.device_get(jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(t.state.params))


def resnet_pipelined(t, batch, remat=False, fill=0.0):
  """One device's parameters in `t`'s form (stage-owned rows), its pipelined loss, gradients
  (unpacked to the whole tree), statistics and iterations."""
  one, _ = resnet_batch()
  fn = functools.partial(resnet_trainer.pipelined_loss_and_grads, t.model, t.runtime,
                         t.stage_cut, num_classes=10, label_smoothing=0.1, remat=remat,
                         bubble_fill=fill, weights=t.stage_weights)
  params, stats = jax.device_get((one.state.params, one.state.batch_stats))
  if t.stage_weights is not None:
    params = t.stage_weights.store(params)
  loss, grads, stats, iterations = jax.device_get(jax.jit(fn)(params, stats, batch))
  return loss, jax.device_get(t.params_of(grads)), stats, iterations


# The schedule's grid is the Transformer's (the schedule is the same code for every model);
# ResNet's own point is its batch-norm statistics per micro-batch: one micro-batch and as many
# as stages here, more than stages with the data axis below
@pytest.mark.parametrize("stages,microbatches", [(2, 1), (2, 2)])
def test_resnet_pipelined_equals_the_micro_batched_step_on_one_device(stages, microbatches):
  _, batch = resnet_batch()
  (loss, stats), grads = resnet_reference(microbatches)
  t = resnet(f"stage={stages},data=1", microbatches)
  got_loss, got_grads, got_stats, iterations = resnet_pipelined(t, batch)
  assert iterations == microbatches + stages - 1
  assert_close(got_loss, loss)
  assert_close(got_grads, grads)
  assert_close(got_stats, stats)


# (stage=2,data=2 M=4 without remat was here too: the same pooled statistics, 11 CPU s)
@pytest.mark.parametrize("mesh,microbatches,remat,fill", [
    ("stage=4,data=2", 2, True, float("nan"))])
def test_resnet_with_data_axis_remat_and_nan_bubbles(mesh, microbatches, remat, fill):
  """With data=2 batch norm pools each micro-batch's statistics over both replicas."""
  _, batch = resnet_batch()
  data = int(mesh.split("data=")[1])
  (loss, stats), grads = resnet_reference(microbatches, data)
  got_loss, got_grads, got_stats, _ = resnet_pipelined(resnet(mesh, microbatches), batch,
                                                       remat, fill)
  assert np.isfinite(got_loss) and all(np.isfinite(g).all() for g in jax.tree.leaves(got_grads))
  assert_close(got_loss, loss)
  assert_close(got_grads, grads)
  assert_close(got_stats, stats)


def test_resnet_two_pipelined_steps_equal_two_micro_batched_steps():
  """The trainer's compiled step (LARS, pipelined, remat, stages owning their weights) against
  the reference's gradients and statistics applied by the same optimizer."""
  one, batch = resnet_batch()
  piped = resnet("stage=4,data=1", 4, remat=True, compiled=True)
  state, piped_batch = one.state, piped.synthetic_batch()   # float32 images: the same values
  model = one.model.clone(bn_axis_name=None)

  @jax.jit                                 # one program for both steps, the update included
  def reference_step(state):
    def loss_fn(p):
      total, new = 0.0, []
      for j in range(4):
        logits, upd = model.apply({"params": p, "batch_stats": state.batch_stats},
                                  batch["image"][4 * j:4 * j + 4], True,
                                  mutable=["batch_stats"])
        total += jax_top1.cross_entropy(logits, batch["label"][4 * j:4 * j + 4], 10, 0.1) * 4
        new.append(upd["batch_stats"])
      return total / 16, jax.tree.map(lambda *s: sum(s) / 4, *new)
    (_, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    return state.apply_gradients(grads=grads, batch_stats=stats)

  for _ in range(2):
    piped.state, _ = piped._train_step(piped.state, piped_batch)  # pylint: disable=protected-access
    state = reference_step(state)
  # stage-owned: LARS's per-layer trust ratios and exclusions on each stage's own tree
  assert piped.stage_weights is not None
  assert_close(jax.device_get(piped.params_of(piped.state)), jax.device_get(state.params))
  assert_close(jax.device_get(piped.state.batch_stats), jax.device_get(state.batch_stats))


# ------------------------------------------------------------------ the compiled program
def test_compiled_step_shifts_with_collective_permutes_and_remat_lowers_temporaries():
  """The Transformer on stage=4,data=2, M=2: the forward and backward shifts are collective
  permutes over `stage` only, each moving one boundary tensor of a micro-batch (2 rows x 12
  x 32 float64: the encoder's output, and between decoder stages the decoder's too; what no
  later stage reads XLA drops); the program re-materializing each iteration keeps fewer bytes
  than the one that does not; describe reports both and the schedule's bubble."""
  t = transformer("stage=4,data=2", 2, True)
  found = t.runtime.collectives_by_axis(t._train_step.as_text())  # pylint: disable=protected-access
  ops, tensors, nbytes = found[("collective-permute", "stage")]
  assert ops in (2, 4) and tensors == ops and nbytes == tensors * 2 * 12 * 32 * 8
  assert not [key for key in found if key[0] == "collective-permute" and key[1] != "stage"]
  info = t.describe().pipeline
  assert 0 < info.activation_bytes_remat < info.activation_bytes_no_remat
  assert info.iterations == 2 + 4 - 1
  assert info.bubble_fraction == pytest.approx(3 / 5)
  table = pipeline.schedule(4, 2)
  assert len(table) == info.iterations
  idle = sum(slot is None for row in table for slot in row) / (4 * len(table))
  assert idle == pytest.approx(info.bubble_fraction)
