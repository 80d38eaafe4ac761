"""Llama's trainers on simulated devices, in float64: the JAX step on data x model x stage
(Megatron's split of heads, FFN and vocabulary over `model`, GPipe over `stage` with the stages
owning their weights and AdamW state, the clip reading every stage's gradient) with AdamW's
state sharded over `data`, JAX's sequence parallelism on `model` (the residual stream split over
the sequence: an all-gather in the step, fewer temporaries), and TF's data x model with
weight-update sharding, each equal to one device over two AdamW steps with the clip acting.

Why these two layouts: the JAX one composes every axis the workload has (each axis alone is a
special case of it: the per-axis code is the shared runtime's, tested on BERT, the Transformer
and ResNet in tests/parallel); TF has no Llama pipeline (refused in one line, spec.check_framework),
so its largest layout is data x model."""
import jax
import numpy as np
import tensorflow as tf
import pytest

from harness import config
from harness.workload import RunContext
from tests.parallel.test_jax_model_parallel import float64_trainer
from tests.parallel.test_tf_model_parallel import copy_weights, whole_weights
from tests.trees import assert_trees_close
from workloads.llama31_8b import jax_model, spec

pytestmark = pytest.mark.usefixtures("jax_float64")     # tests/conftest.py
RTOL = 1e-9       # float64 sums in another order: ~1e-15 relative per op, far below this


def llama_config(mesh="", microbatches=1, wus=False, sequence_parallel=False):
  """tiny with 4 query and 2 key/value heads (a model axis of 2 splits both, keeping each
  query head's key/value head in its shard), 3 layers (a stage cut 2 + 1), synthetic batches of
  8, and the clip below the gradient's norm (it acts: it reads every stage's gradient)."""
  cfg = spec.SPEC.configure("tiny", [
      "data.source=synthetic", "model.num_heads=4", "model.num_kv_heads=2",
      "model.hidden_size=32", "model.num_layers=3", "train.global_batch_size=8",
      "optimizer.base_learning_rate=0.01", "optimizer.warmup_samples=8",
      "optimizer.clip_norm=0.05", "train.jit_compile=false"])
  cfg.parallel.mesh, cfg.parallel.microbatches = mesh, microbatches
  cfg.parallel.weight_update_sharding = wus
  cfg.parallel.sequence_parallel = sequence_parallel
  return cfg


def trained_jax(mesh, microbatches=1, wus=False, steps=2, sequence_parallel=False):
  cfg = llama_config(mesh, microbatches, wus, sequence_parallel)
  trainer = float64_trainer(spec, jax_model, cfg, mesh, wus=wus)
  batch, loss = trainer.synthetic_batch(), None
  for _ in range(steps):
    trainer.state, loss = trainer._train_step(trainer.state, batch)  # pylint: disable=protected-access
  return trainer, loss


@pytest.fixture(scope="module")
def one_device():
  return trained_jax("data=1")


@pytest.mark.parametrize("mesh,wus,owned", [("data=2,model=2,stage=2", True, False),
                                             ("data=2,stage=2", False, True)])
def test_jax_pipelined_layouts_equal_one_device(one_device, mesh, wus, owned):
  """data x model x stage with AdamW's state sharded over data (GSPMD inside each stage); and
  data x stage, where each stage owns its weights and AdamW state and the clip reads the global
  norm of every stage's gradient first (LlamaTrainer.stage_update)."""
  one, one_loss = one_device
  many, many_loss = trained_jax(mesh, microbatches=2, wus=wus)
  assert many.stage_cut == (2, 1) and (many.stage_weights is not None) == owned
  np.testing.assert_allclose(float(many_loss), float(one_loss), rtol=RTOL)
  assert_trees_close(jax.device_get(many.params_of(many.state)),
                     jax.device_get(one.state.params), RTOL, atol_of_max=True)


def test_jax_sequence_parallel_equals_one_device_and_keeps_fewer_activations(one_device):
  """model=2 with parallel.sequence_parallel (Megatron-LM's sequence parallelism: the residual
  stream, its norms and adds split over model along the sequence): two AdamW steps equal one
  device in float64; the step gathers the sequence over model before the split matmuls (the
  all-gathers the model split alone has none of) and its temporaries are fewer than the same
  mesh's without it."""
  one, one_loss = one_device
  split, split_loss = trained_jax("data=1,model=2", sequence_parallel=True)
  np.testing.assert_allclose(float(split_loss), float(one_loss), rtol=RTOL)
  assert_trees_close(jax.device_get(split.params_of(split.state)),
                     jax.device_get(one.state.params), RTOL, atol_of_max=True)
  whole = float64_trainer(spec, jax_model, llama_config("data=1,model=2"), "data=1,model=2")
  with_split, without = split.describe(), whole.describe()
  assert ("all-gather", "model") in with_split.collectives_by_axis
  assert ("all-gather", "model") not in without.collectives_by_axis
  assert with_split.activation_bytes_per_device < without.activation_bytes_per_device


def tf_trainer(mesh, wus=False):
  cfg = llama_config(mesh, wus=wus)
  trainer = spec.SPEC.make_trainer("tf", cfg, RunContext(seed=0, preset="tiny"))
  trainer.dtype = "float64"
  trainer.init()
  return trainer


def test_tf_data_model_with_weight_update_sharding_equals_one_replica():
  """2 x 2 logical CPU devices: Megatron's layers (the vocabulary-parallel embedding, lookup
  and loss) on model=2, AdamW's update sharded over data, from the one replica's weights; two
  steps with the clip acting."""
  one, many = tf_trainer("data=1"), tf_trainer("data=2,model=2", wus=True)
  assert many.num_devices == 4 and many.model.vocab_parallel
  copy_weights(one, many)
  losses = [(one.train(1)["loss"], many.train(1)["loss"]) for _ in range(2)]
  np.testing.assert_allclose([m for _, m in losses], [o for o, _ in losses], rtol=RTOL)
  expected, got = whole_weights(one), whole_weights(many)
  assert set(got) == set(expected)
  assert_trees_close(got, expected, RTOL, atol_of_max=True)


def test_two_adamw_steps_agree_across_frameworks():
  """JAX's optax AdamW (decay on the matrices: ndim > 1) and TF's torch-form AdamW (decay on all
  but the variables named `scale`) from the same weights, two steps of the same batch with the
  warmup schedule and the clip acting: the same weights in float64."""
  from workloads.parallel import tf_layers  # pylint: disable=import-outside-toplevel
  trainer, _ = trained_jax("data=1", steps=0)
  batch = jax.device_get(trainer.synthetic_batch())
  tf_one = tf_trainer("data=1")
  tf_layers.load_flax_variables(tf_one.model, {"params": jax.device_get(trainer.state.params)})
  tf_batch = {k: tf.constant(v) for k, v in batch.items()}
  for _ in range(2):
    trainer.state, _ = trainer._train_step(trainer.state, trainer.synthetic_batch())  # pylint: disable=protected-access
    _, grads = tf_one.loss_and_grads(tf_batch)
    tf_one.optimizer.apply(grads, tf_one.model.trainable_variables)
  got = {"/".join(path): v.numpy() for path, v in tf_layers.params_by_path(tf_one.model).items()}
  flat = {"/".join(k.key for k in path): np.asarray(v) for path, v in
          jax.tree_util.tree_leaves_with_path(jax.device_get(trainer.state.params))}
  assert set(got) == set(flat)
  assert_trees_close(got, flat, RTOL, atol_of_max=True)
