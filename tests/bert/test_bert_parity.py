"""BERT: parameter counts (formula = flax = Keras, and the reference checkpoint's count at full
size), TF <-> JAX parity of logits, loss, gradients and LAMB steps with the JAX weights copied
into Keras, padding invariance, LAMB and its schedule against a numpy transcription of the MLPerf
reference, and loading a TF1-named checkpoint into both models.

The TF <-> JAX comparisons run in float64 in both frameworks (jax.enable_x64 for this module;
the Keras model built with dtype float64): correct implementations then differ only by
summation order, ~ layers x sqrt(width) x eps64 ~ 1e-14 relative, so 1e-9 (TOL) separates
them from any real difference by orders of magnitude on any CPU; LAMB steps too (the Keras
learning rate computed in float64: make_lamb(dtype=))."""
import dataclasses

import jax
import jax.numpy as jnp
import keras
import numpy as np
import optax
import pytest
import tensorflow as tf

from tests.conftest import rel_err, workload_config
from tests.trees import assert_trees_close

from workloads.bert import checkpoint, jax_model, spec, tf_model, tf_trainer
from workloads.optim.configs import LambConfig
from workloads.optim import jax_optimizers, schedules, tf_optimizers
from workloads.parallel import tf_layers

TINY = spec.ModelConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4,
                        intermediate_size=64, max_position_embeddings=16, dropout=0.0)
SEQ, PREDS, BATCH = 16, 4, 4


def config(model, seq=SEQ, preds=PREDS):
  """A workload config of `model` for build(cfg): its batches' shapes in cfg.data."""
  return workload_config(spec, model, max_seq_length=seq, max_predictions_per_seq=preds)
TOL = 1e-9

pytestmark = pytest.mark.usefixtures("jax_float64")     # tests/conftest.py


def reference_parameter_count(c) -> int:
  """The MLPerf checkpoint's model variables, counted from bert_config.json's sizes:
  embeddings (word, position, token type, LayerNorm); per layer Q/K/V and attention output
  dense (kernel + bias), two LayerNorms, intermediate and output dense; the pooler dense;
  cls/predictions transform dense + LayerNorm + output_bias [vocab] (the output projection is
  the word embedding, tied: no extra matrix); cls/seq_relationship output_weights [2, H] + bias.
  BERT-large, vocab 30522: 336,226,108, of which the `bert/` scope (embeddings, encoder,
  pooler) is 335,141,888 and the cls/ heads 1,084,220."""
  h, i = c.hidden_size, c.intermediate_size
  dense = lambda n_in, n_out: n_in * n_out + n_out
  embeddings = (c.vocab_size + c.max_position_embeddings + c.type_vocab_size) * h + 2 * h
  layer = 4 * dense(h, h) + dense(h, i) + dense(i, h) + 2 * 2 * h
  pooler = dense(h, h)
  mlm_head = dense(h, h) + 2 * h + c.vocab_size
  nsp_head = 2 * h + 2
  return embeddings + c.num_layers * layer + pooler + mlm_head + nsp_head


def jax_count(model_cfg):
  model = jax_model.build(config(model_cfg))
  ids = jnp.zeros((1, 8), jnp.int32)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids, ids, ids[:, :2]))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


def test_reference_parameter_count_formula_and_flax():
  c = spec.reference().model
  assert reference_parameter_count(c) == 336_226_108
  assert jax_count(c) == 336_226_108
  assert len(checkpoint.tf1_variable_table(c.num_layers)) == 5 + 16 * 24 + 2 + 4 + 1 + 2


@pytest.mark.parametrize("preset", ["mini"])
def test_same_parameter_count_in_both_frameworks(preset):
  c = spec.SPEC.config(preset).model
  keras_model = tf_model.build(config(c, 8))
  assert keras_model.count_params() == jax_count(c) == reference_parameter_count(c)


@pytest.mark.slow
def test_keras_reference_size_parameter_count():
  """The Keras model at the reference's sizes, counted at one and two of its 24 layers (the
  layers are alike: the whole-size build, 1.3 GB of float32, cost 17 CPU s for the same sum)."""
  counts = []
  for layers in (1, 2):
    model = dataclasses.replace(spec.reference().model, num_layers=layers)
    counts.append(tf_model.build(config(model, 8)).count_params())
  per_layer = counts[1] - counts[0]
  assert counts[0] + 23 * per_layer == 336_226_108


# ----------------------------------------------------------------------------- parity

def make_batch(seed=0, lengths=(16, 11, 7, 13)):
  rng = np.random.default_rng(seed)
  mask = (np.arange(SEQ)[None] < np.array(lengths)[:, None]).astype(np.int32)
  positions = np.stack([np.sort(rng.choice(np.arange(1, n), PREDS, replace=False))
                        for n in lengths]).astype(np.int32)
  return {"input_ids": (rng.integers(5, TINY.vocab_size, (BATCH, SEQ)) * mask).astype(np.int32),
          "input_mask": mask,
          "segment_ids": ((np.arange(SEQ)[None] >= 4) * mask).astype(np.int32),
          "masked_lm_positions": positions,
          "masked_lm_ids": rng.integers(5, TINY.vocab_size, (BATCH, PREDS)).astype(np.int32),
          "masked_lm_weights": np.array([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]],
                                        np.float32),
          "next_sentence_labels": np.array([0, 1, 1, 0], np.int32)}


@pytest.fixture(scope="module")
def models():
  flax_model = jax_model.build(config(TINY), jnp.float64)
  batch = make_batch()
  params = flax_model.init(jax.random.key(0), batch["input_ids"], batch["input_mask"],
                           batch["segment_ids"], batch["masked_lm_positions"])["params"]
  # Larger random values than the 0.02 init (and random LayerNorm/bias), so every path matters.
  rng = np.random.default_rng(1)
  params = jax.tree.map(lambda p: jnp.asarray(rng.normal(0, 0.2, p.shape), jnp.float64), params)
  keras_model = tf_model.build(config(TINY), dtype="float64")
  tf_layers.load_flax_variables(keras_model, {"params": params})
  return flax_model, params, keras_model, batch


def jax_apply(flax_model, params, batch):
  return flax_model.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                          batch["segment_ids"], batch["masked_lm_positions"])


def test_initialisation_is_truncated_normal_002_with_zero_biases():
  model = tf_model.build(config(dataclasses.replace(TINY, hidden_size=64, num_heads=4)))
  kernel = model.encoder[0].intermediate.kernel.numpy()
  assert abs(kernel.std() - 0.02 * 0.88) < 0.002 and np.abs(kernel).max() <= 0.04 + 1e-6
  assert not model.encoder[0].intermediate.bias.numpy().any()
  params = jax_model.build(config(TINY)).init(jax.random.key(0),
                                              *[jnp.zeros((1, SEQ), jnp.int32)] * 3,
                                              jnp.zeros((1, 2), jnp.int32))["params"]
  table = np.asarray(params["word_embeddings"]["embedding"])
  assert abs(table.std() - 0.02 * 0.88) < 0.003 and np.abs(table).max() <= 0.04 + 1e-6


def test_logits_agree(models):
  flax_model, params, keras_model, batch = models
  jax_mlm, jax_nsp = jax_apply(flax_model, params, batch)
  tf_mlm, tf_nsp = keras_model(batch, training=False)
  assert tf_mlm.dtype == tf.float64 and jax_mlm.dtype == jnp.float64
  assert rel_err(tf_mlm, jax_mlm) < TOL and rel_err(tf_nsp, jax_nsp) < TOL


def test_float32_logits_are_within_the_float32_bound_of_float64(models):
  """The models as they train (float32) against the float64 result: ~ layers x sqrt(width) x
  eps32 ~ 6 x 6 x 6e-8 ~ 2e-6 relative; 1e-4 leaves room and still catches a real difference."""
  flax_model, params, _, batch = models
  exact = np.asarray(jax_apply(flax_model, params, batch)[0])
  params32 = jax.tree.map(lambda p: p.astype(jnp.float32), params)
  keras32 = tf_model.build(config(TINY))
  tf_layers.load_flax_variables(keras32, {"params": params32})
  for mlm in (jax_apply(jax_model.build(config(TINY)), params32, batch)[0], keras32(batch)[0]):
    assert mlm.dtype == np.float32 and rel_err(mlm, exact) < 1e-4


def test_bfloat16_compute_stays_close_to_float32(models):
  flax_model, params, keras_model, batch = models
  jax_bf16 = jax_model.build(config(TINY), jnp.bfloat16)
  tf_bf16 = tf_model.build(config(TINY), dtype="mixed_bfloat16")
  tf_layers.load_flax_variables(tf_bf16, {"params": params})
  reference = np.asarray(jax_apply(flax_model, params, batch)[0])
  for mlm in (jax_apply(jax_bf16, params, batch)[0], tf_bf16(batch)[0]):
    assert mlm.dtype == np.float32 and 1e-4 < rel_err(mlm, reference) < 0.05
  assert tf_bf16.encoder[0].query.kernel.dtype == "float32"       # parameters stay float32


def test_padded_positions_do_not_change_unpadded_outputs(models):
  flax_model, params, keras_model, batch = models
  other = dict(batch)
  pad = batch["input_mask"] == 0
  other["input_ids"] = np.where(pad, 17, batch["input_ids"]).astype(np.int32)
  other["segment_ids"] = np.where(pad, 1, batch["segment_ids"]).astype(np.int32)
  for apply in (lambda b: jax_apply(flax_model, params, b),
                lambda b: keras_model(b, training=False)):
    (mlm_a, nsp_a), (mlm_b, nsp_b) = apply(batch), apply(other)
    np.testing.assert_array_equal(np.asarray(mlm_a), np.asarray(mlm_b))
    np.testing.assert_array_equal(np.asarray(nsp_a), np.asarray(nsp_b))
  # ... while a real token does change them (the test can see a difference)
  changed = dict(batch, input_ids=batch["input_ids"].copy())
  changed["input_ids"][2, 3] += 1
  assert not np.allclose(np.asarray(jax_apply(flax_model, params, changed)[0][2]),
                         np.asarray(jax_apply(flax_model, params, batch)[0][2]))


def _jax_value_and_grad(flax_model):
  """(params, batch) -> (loss, grads): one compiled program, not op by op."""
  def loss_fn(p, batch):
    return jax_model.pretraining_loss(*jax_apply(flax_model, p, batch), batch)
  return jax.jit(jax.value_and_grad(loss_fn))


def _tf_loss_and_grads(keras_model, batch):
  return tf_trainer.loss_and_grads(keras_model, batch, BATCH)


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def test_loss_and_gradients_agree(models):
  flax_model, params, keras_model, batch = models
  jax_loss, jax_grads = _jax_value_and_grad(flax_model)(params, batch)
  tf_loss, tf_grads = _tf_loss_and_grads(keras_model, batch)
  assert rel_err(tf_loss, jax_loss) < TOL
  by_var = {id(v): g for v, g in zip(keras_model.trainable_variables, tf_grads)}
  ours, theirs = [], []
  paths = tf_layers.params_by_path(keras_model)
  for path, var in paths.items():
    ours.append(np.ravel(by_var[id(var)]))
    theirs.append(np.ravel(_get(jax_grads, path)))
  assert len(ours) == len(keras_model.trainable_variables)
  assert rel_err(np.concatenate(ours), np.concatenate(theirs)) < TOL
  whole = np.linalg.norm(np.concatenate(theirs))
  for path, a, b in zip(paths, ours, theirs):
    # per tensor against the larger of its norm and 1e-3 of the whole gradient's: the key bias
    # gradient is exactly zero in exact arithmetic (softmax ignores a per-query shift), rounding
    # noise in both frameworks
    assert np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-3 * whole) < TOL, path


def test_lamb_training_steps_agree(models):
  flax_model, params, _, batch = models
  lamb = LambConfig(base_learning_rate=0.01, training_steps=10, warmup_steps=2)
  schedule = schedules.BertLambSchedule(0.01, 10, 2)
  tx = jax_optimizers.make_lamb(lamb, schedule)
  keras_model = tf_model.build(config(TINY), dtype="float64")
  tf_layers.load_flax_variables(keras_model, {"params": params})
  optimizer = tf_optimizers.make_lamb(lamb, schedule, tf_model.lamb_excluded_variables(keras_model),
                                      dtype="float64")
  state = tx.init(params)
  value_and_grad = _jax_value_and_grad(flax_model)
  for _ in range(3):
    _, grads = value_and_grad(params, batch)
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
    _, tf_grads = _tf_loss_and_grads(keras_model, batch)
    optimizer.apply(tf_grads, keras_model.trainable_variables)
  for path, var in tf_layers.params_by_path(keras_model).items():
    if path[-2:] == ("key", "bias"):
      # its gradient is rounding noise (zero in exact arithmetic); Adam's m/sqrt(v) scales
      # noise to a full-size step, different noise in each framework
      continue
    assert rel_err(var.numpy(), _get(params, path)) < TOL, path
  assert rel_err(params["nsp"]["kernel"], models[1]["nsp"]["kernel"]) > 1e-3   # they moved


def test_lamb_exclusions_are_biases_and_layer_norms():
  keras_model = tf_model.build(config(TINY))
  excluded = {id(v) for v in tf_model.lamb_excluded_variables(keras_model)}
  mask = jax_optimizers.lamb_weight_mask(jax.eval_shape(
      lambda: jax_model.build(config(TINY)).init(jax.random.key(0),
                                                 *[jnp.zeros((1, SEQ), jnp.int32)] * 3,
                                                 jnp.zeros((1, 2), jnp.int32)))["params"])
  for path, var in tf_layers.params_by_path(keras_model).items():
    weight = path[-1] in ("kernel", "embedding")
    assert _get(mask, path) == weight, path
    assert (id(var) not in excluded) == weight, path


# ----------------------------------------------------------------------------- LAMB formula

def numpy_lamb(params, grads_per_step, is_weight, lr_fn, wd=0.01, b1=0.9, b2=0.999, eps=1e-6,
               clip=1.0):
  """lamb_optimizer_v1.py + optimization.py of the MLPerf BERT reference, in numpy (float64)."""
  w = {k: v.astype(np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in w.items()}
  v = {k: np.zeros_like(x) for k, x in w.items()}
  for step, grads in enumerate(grads_per_step):
    norm = np.sqrt(sum(np.sum(np.square(g.astype(np.float64))) for g in grads.values()))
    scale = clip / max(norm, clip)                      # tf.clip_by_global_norm
    for k in w:
      g = grads[k] * scale
      m[k] = b1 * m[k] + (1 - b1) * g
      v[k] = b2 * v[k] + (1 - b2) * g * g
      update = (m[k] / (1 - b1 ** (step + 1))) / (np.sqrt(v[k] / (1 - b2 ** (step + 1))) + eps)
      ratio = 1.0
      if is_weight[k]:
        update = update + wd * w[k]
        w_norm, u_norm = np.linalg.norm(w[k]), np.linalg.norm(update)
        ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
      w[k] = w[k] - ratio * lr_fn(step) * update
  return w


def lamb_problem():
  rng = np.random.default_rng(0)
  params = {"dense": {"kernel": rng.normal(size=(6, 4)).astype(np.float32),
                      "bias": rng.normal(size=(4,)).astype(np.float32)},
            "LayerNorm": {"scale": rng.normal(size=(4,)).astype(np.float32),
                          "bias": np.zeros(4, np.float32)},
            "zero": {"kernel": np.zeros((3, 4), np.float32)}}       # ||w|| = 0: ratio 1
  # big gradients on the first steps (clipping active), small later (clipping idle)
  grads = [jax.tree.map(lambda p: (rng.normal(size=p.shape) * s).astype(np.float32), params)
           for s in (5.0, 2.0, 0.01, 0.02, 0.05)]
  return params, grads


def flat(tree):
  return {"/".join(k.key for k in path): np.asarray(v)
          for path, v in jax.tree_util.tree_leaves_with_path(tree)}


def test_bert_lr_schedule_matches_the_reference_formula():
  s = schedules.BertLambSchedule(base_lr=1.0, training_steps=100, warmup_steps=10,
                                 start_warmup_step=-2)
  assert s(0) == pytest.approx(0.2)                   # (0 - (-2)) / 10
  assert s(7) == pytest.approx(0.9)
  assert s(8) == pytest.approx(1 - 8 / 100)           # decay counts from step 0
  assert s(100) == 0.0 and s(150) == 0.0
  assert schedules.BertLambSchedule(2.0, 100)(25) == pytest.approx(1.5)   # no warmup
  steps = jnp.arange(0, 120, 3)
  np.testing.assert_allclose(np.asarray(s(steps, ops=jnp)), [s(int(t)) for t in steps],
                             rtol=1e-6, atol=1e-7)


def test_jax_and_keras_lamb_match_the_numpy_reference_step_by_step():
  params, grads = lamb_problem()
  schedule = schedules.BertLambSchedule(base_lr=0.1, training_steps=8, warmup_steps=2)
  names = list(flat(params))
  is_weight = {k: k.endswith("kernel") for k in names}
  tx = jax_optimizers.mlperf_lamb(lambda t: schedule(t, ops=jnp))
  state, jparams = tx.init(params), jax.tree.map(jnp.asarray, params)
  variables = {k: keras.Variable(v, name=k.replace("/", "_")) for k, v in flat(params).items()}
  optimizer = tf_optimizers.MLPerfLamb(tf_optimizers.KerasSchedule(schedule))
  optimizer.exclude_from_weight_decay(var_list=[variables[k] for k in names if not is_weight[k]])
  for step, g in enumerate(grads):
    expected = numpy_lamb(flat(params), [flat(x) for x in grads[:step + 1]], is_weight,
                          schedule)
    updates, state = tx.update(g, state, jparams)
    jparams = optax.apply_updates(jparams, updates)
    optimizer.apply([flat(g)[k] for k in names], [variables[k] for k in names])
    for k in names:
      # float32 against float64 on unit-scale weights: atol 1e-6 covers entries that cancel
      np.testing.assert_allclose(flat(jparams)[k], expected[k], rtol=1e-5, atol=1e-6,
                                 err_msg=f"jax step {step} {k}")
      np.testing.assert_allclose(variables[k].numpy(), expected[k], rtol=1e-5, atol=1e-6,
                                 err_msg=f"keras step {step} {k}")
  assert not np.allclose(expected["zero/kernel"], 0)      # the zero weight did move (ratio 1)


def test_optax_lamb_differs_from_the_reference_on_biases():
  """Why the project has its own LAMB: optax's trust ratio also scales biases/LayerNorm."""
  params, grads = lamb_problem()
  ours = jax_optimizers.mlperf_lamb(lambda _: 0.1, clip_norm=None)
  theirs = optax.lamb(0.1, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
                      mask=jax_optimizers.lamb_weight_mask)
  u_ours, _ = ours.update(grads[2], ours.init(params), params)
  u_theirs, _ = theirs.update(grads[2], theirs.init(params), params)
  np.testing.assert_allclose(u_ours["dense"]["kernel"], u_theirs["dense"]["kernel"], rtol=1e-5)
  assert not np.allclose(u_ours["dense"]["bias"], u_theirs["dense"]["bias"])


# ----------------------------------------------------------------------------- checkpoint

def write_tf1_checkpoint(prefix, values):
  """A checkpoint with TF1 variable names, as tf.compat.v1.train.Saver writes (SaveV2)."""
  names = list(values)
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                    tensors=[tf.constant(values[n]) for n in names])


def test_tf1_checkpoint_loads_into_both_models(tmp_path):
  rng = np.random.default_rng(3)
  flax_model = jax_model.build(config(TINY))
  shapes = jax.eval_shape(lambda: flax_model.init(
      jax.random.key(0), *[jnp.zeros((1, SEQ), jnp.int32)] * 3, jnp.zeros((1, 2), jnp.int32)))
  values = {}
  for name, path, transpose in checkpoint.tf1_variable_table(TINY.num_layers):
    shape = _get(shapes["params"], path).shape
    values[name] = rng.normal(0, 0.2, shape[::-1] if transpose else shape).astype(np.float32)
  values["global_step"] = np.int64(28252)                        # non-model entries are ignored
  values["bert/encoder/layer_0/attention/self/query/kernel/adam_m"] = np.zeros((32, 32), np.float32)
  prefix = str(tmp_path / "model.ckpt-28252")
  write_tf1_checkpoint(prefix, values)
  params = jax_model.load_tf1_checkpoint(shapes["params"], prefix, TINY.num_layers)
  keras_model = tf_model.load_tf1_checkpoint(tf_model.build(config(TINY)), prefix)
  np.testing.assert_array_equal(params["nsp"]["kernel"],
                                values["cls/seq_relationship/output_weights"].T)
  batch = make_batch()
  jax_mlm, jax_nsp = jax_apply(flax_model, params, batch)
  tf_mlm, tf_nsp = keras_model(batch, training=False)
  assert rel_err(tf_mlm, jax_mlm) < 1e-5 and rel_err(tf_nsp, jax_nsp) < 1e-5
  with pytest.raises(ValueError, match="lacks"):
    jax_model.load_tf1_checkpoint(shapes["params"], prefix, TINY.num_layers + 1)


def test_jax_trainer_starts_from_the_reference_checkpoint(tmp_path):
  """The trainer's load_weights (the base's init calls it after initialising) puts the TF1
  checkpoint's values in the state, placed as the initialised parameters were."""
  from harness.workload import RunContext
  from workloads.bert import jax_trainer
  cfg = config(TINY)
  trainer = jax_trainer.make_trainer(cfg, RunContext(seed=0, preset="tiny"))
  rng = jax.random.key(0)
  shardings = trainer.state_shardings(trainer.create_state, rng)
  state = trainer.initial_state(shardings, rng)
  rng_np = np.random.default_rng(5)
  values = {}
  for name, path, transpose in checkpoint.tf1_variable_table(TINY.num_layers):
    shape = _get(state.params, path).shape
    values[name] = rng_np.normal(0, 0.2, shape[::-1] if transpose else shape).astype(np.float32)
  prefix = str(tmp_path / "model.ckpt-1")
  write_tf1_checkpoint(prefix, values)
  assert trainer.load_weights(state, shardings) is state         # no checkpoint configured
  cfg.data.source, cfg.data.init_checkpoint = "tfrecord", prefix
  loaded = trainer.load_weights(state, shardings)
  expected = jax_model.load_tf1_checkpoint(jax.eval_shape(lambda: state.params), prefix,
                                           TINY.num_layers)
  assert_trees_close(loaded.params, expected, rtol=0)
  assert jax.tree.map(lambda a: a.sharding, loaded.params) == shardings.params
