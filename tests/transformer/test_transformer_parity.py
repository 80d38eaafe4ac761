"""Transformer: TF <-> JAX parity with the flax weights copied into Keras (logits, the smoothed
loss, gradients, two TF-style Adam steps, beam search, incremental decoding), and the closed
forms both frameworks share (the rsqrt schedule, the position encoding, the label-smoothed
cross entropy) against numpy written here from the MLPerf reference's definitions.

Everything runs in float64 (jax.enable_x64 for this module, the Keras model built with dtype
float64). Correct implementations then differ only by summation order and by 1-ulp differences
of exp/log/sin between numpy, XLA and TF kernels: ~ layers x sqrt(width) x eps64 ~ 1e-14
relative on this tiny model, so TOL = 1e-10 is four orders above that noise and still far
below any real difference (a wrong epsilon, mask, scale or a float32 step shows at >= 1e-7).
Beam search itself scores in float32 in all three implementations, so it is compared on its
tokens (exactly) and the numpy reference's scores to float32 precision.
"""
import contextlib
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tensorflow as tf

from tests.conftest import rel_err, workload_config

from workloads.optim import jax_optimizers, schedules, tf_optimizers
from workloads.optim.configs import AdamConfig
from workloads.parallel import tf_layers
from workloads.transformer import beam_search_np, formulas, jax_beam_search, jax_model, \
    jax_trainer, spec, tf_beam_search, tf_model, tf_trainer

CFG = spec.ModelConfig(vocab_size=23, hidden_size=16, num_layers=2, num_heads=2, filter_size=24,
                       dropout=0.0, attention_dropout=0.0, relu_dropout=0.0,
                       extra_decode_length=4)
SMOOTHING = 0.1
TOL = 1e-10

pytestmark = pytest.mark.usefixtures("jax_float64")     # tests/conftest.py


def padded(rows, length):
  """int32 [len(rows), length]: each row's tokens, then EOS (1), then padding 0."""
  out = np.zeros((len(rows), length), np.int32)
  for r, tokens in enumerate(rows):
    out[r, :len(tokens) + 1] = list(tokens) + [jax_model.EOS_ID]
  return out


def make_batch(seed=0, input_lengths=(6, 3, 1), target_lengths=(5, 2, 4), length=7):
  """Rows of different lengths (distinct words 2..V-1, EOS, padding): every row has padding
  but the first input row, the shortest input is one word."""
  rng = np.random.default_rng(seed)
  words = lambda n: rng.choice(np.arange(2, CFG.vocab_size), n, replace=False)
  return {"inputs": padded([words(n) for n in input_lengths], length),
          "targets": padded([words(n) for n in target_lengths], length - 1)}


def random_params(params, seed=1):
  """Larger-than-init random values everywhere (LayerNorm scales around 1, biases non-zero), so
  that every parameter matters and softmaxes are far from uniform: the embedding at std 1
  (lookups x sqrt(16) = 4), the rest at std 0.3."""
  rng = np.random.default_rng(seed)

  def draw(path, p):
    name = path[-1].key
    if name == "embedding":
      value = rng.normal(0.0, 1.0, p.shape)
    elif name == "scale":
      value = 1.0 + rng.normal(0.0, 0.3, p.shape)
    else:
      value = rng.normal(0.0, 0.3, p.shape)
    return jnp.asarray(value, jnp.float64)
  return jax.tree_util.tree_map_with_path(draw, params)


@pytest.fixture(scope="module")
def models():
  flax_model = jax_model.build(workload_config(spec, CFG), jnp.float64)
  batch = make_batch()
  shapes = jax.eval_shape(flax_model.init, jax.random.key(0), batch["inputs"], batch["targets"])
  params = random_params(shapes["params"])
  keras_model = tf_model.build(workload_config(spec, CFG), dtype="float64")
  tf_layers.load_flax_variables(keras_model, {"params": params})
  _COMPILED.clear()                  # compiled functions close over these models
  return flax_model, params, keras_model, batch


_COMPILED = {}


def compiled(name, make):
  """One jitted (or tf.function) callable per name for the module: compiling is most of this
  file's time, and the tests share one model and one batch shape."""
  if name not in _COMPILED:
    _COMPILED[name] = make()
  return _COMPILED[name]


def forward(flax_model, params, inputs, targets):
  """The flax model's eval-mode logits (jitted once per shape)."""
  return compiled("forward", lambda: jax.jit(
      lambda p, x, y: flax_model.apply({"params": p}, x, y)))(params, inputs, targets)


@contextlib.contextmanager
def keras_with(models, params):
  """The shared Keras model holding `params` for a while (one model: no rebuild or retrace)."""
  keras_model = models[2]
  tf_layers.load_flax_variables(keras_model, {"params": params})
  try:
    yield keras_model
  finally:
    tf_layers.load_flax_variables(keras_model, {"params": models[1]})


def _flat(tree):
  return {tuple(k.key for k in path): np.asarray(leaf)
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def _unflat(flat, like):
  return jax.tree_util.tree_map_with_path(lambda path, _: flat[tuple(k.key for k in path)], like)


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


# ----------------------------------------------------------------------------- forward pass

def test_parameter_paths_and_shapes_agree(models):
  _, params, keras_model, _ = models
  flax_leaves = _flat(params)
  keras_vars = tf_layers.params_by_path(keras_model)
  assert set(flax_leaves) == set(keras_vars)
  for path, leaf in flax_leaves.items():
    assert tuple(keras_vars[path].shape) == leaf.shape, path
  # every trainable Keras variable is reachable by a flax path, once
  assert {id(v) for v in keras_vars.values()} == {id(v) for v in keras_model.trainable_variables}
  assert len(keras_vars) == len(keras_model.trainable_variables)


def test_eval_logits_agree(models):
  flax_model, params, keras_model, batch = models
  jax_logits = forward(flax_model, params, batch["inputs"], batch["targets"])
  tf_logits = keras_model(batch["inputs"], batch["targets"], training=False)
  assert jax_logits.dtype == jnp.float64 and tf_logits.dtype == tf.float64
  assert jax_logits.shape == (3, 6, CFG.vocab_size)
  assert rel_err(tf_logits, jax_logits) < TOL
  # the model is not trivial: its logits spread over several units
  assert np.std(np.asarray(jax_logits)) > 1.0
  # and the comparison can fail: one changed parameter changes the logits far above TOL
  changed = jax.tree.map(lambda x: x, params)
  changed["decoder"]["layer_1"]["ffn_norm"]["bias"] = (
      params["decoder"]["layer_1"]["ffn_norm"]["bias"] + 1e-6)
  other = forward(flax_model, changed, batch["inputs"], batch["targets"])
  assert rel_err(other, jax_logits) > 1e3 * TOL


def packed_and_alone():
  """Two examples packed into one row (inputs 4 + 2 of 7 ids, one padding; targets 3 + 3 of 6,
  full), as common/packing.py lays them out, and the same two as an ordinary padded batch."""
  alone = {"inputs": padded([[5, 9, 4], [7]], 7), "targets": padded([[3, 8], [6, 2]], 6)}
  packed = {"inputs": np.array([[5, 9, 4, 1, 7, 1, 0]], np.int32),
            "targets": np.array([[3, 8, 1, 6, 2, 1]], np.int32),
            "inputs_segmentation": np.array([[1, 1, 1, 1, 2, 2, 0]], np.int32),
            "inputs_position": np.array([[0, 1, 2, 3, 0, 1, 0]], np.int32),
            "targets_segmentation": np.array([[1, 1, 1, 2, 2, 2]], np.int32),
            "targets_position": np.array([[0, 1, 2, 0, 1, 2]], np.int32)}
  return packed, alone


def test_a_packed_row_gives_each_example_its_logits_alone(models):
  """Segment masks, per-example positions and the decoder's restart at each example: each
  example of a packed row gets the logits it gets alone, in both frameworks; TF = JAX."""
  flax_model, params, keras_model, _ = models
  packed, alone = packed_and_alone()
  features = spec.packed_features(packed)
  # Compiled, not op by op: eager float64 dispatch of a whole transformer is slow when the
  # other test worker shares the cores (132 s in one CI run against 9 s alone).
  jax_packed = jax.jit(lambda p, x, y, f: flax_model.apply({"params": p}, x, y, packed=f))(
      params, packed["inputs"], packed["targets"], features)
  jax_alone = forward(flax_model, params, alone["inputs"], alone["targets"])
  tf_packed = tf.function(lambda x, y, f: keras_model(x, y, training=False, packed=f))(
      tf.constant(packed["inputs"]), tf.constant(packed["targets"]),
      {k: tf.constant(v) for k, v in features.items()})
  for logits in (np.asarray(jax_packed), tf_packed.numpy()):
    assert rel_err(logits[0, :3], jax_alone[0, :3]) < TOL
    assert rel_err(logits[0, 3:], jax_alone[1, :3]) < TOL
  assert rel_err(tf_packed, jax_packed) < TOL
  # without the segments the second example sees the first: different logits
  mixed = forward(flax_model, params, packed["inputs"], packed["targets"])
  assert rel_err(mixed[0, 3:], jax_alone[1, :3]) > 1e-3


# ----------------------------------------------------------------------------- loss

def numpy_smoothed_loss(logits, labels, s):
  """metrics.padded_cross_entropy_loss of the reference, in numpy: soft targets 1 - s on the
  label and s / (V - 1) on each other token, cross entropy against log_softmax, minus the
  entropy of the soft targets (so a perfect prediction scores 0), weight 0 at padding labels.
  Returns (sum over non-padding tokens, their count)."""
  logits = np.asarray(logits, np.float64)
  vocab = logits.shape[-1]
  shifted = logits - logits.max(axis=-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
  soft = np.full(logits.shape, s / (vocab - 1))
  np.put_along_axis(soft, labels[..., None].astype(np.int64), 1.0 - s, axis=-1)
  entropy = -((1.0 - s) * math.log(1.0 - s) + s * math.log(s / (vocab - 1)))
  xent = -(soft * log_probs).sum(axis=-1) - entropy
  weights = (labels != 0).astype(np.float64)
  return float((xent * weights).sum()), float(weights.sum())


def test_smoothed_cross_entropy_matches_numpy_in_both_frameworks(models):
  flax_model, params, _, batch = models
  labels = batch["targets"]
  rng = np.random.default_rng(5)
  model_logits = np.asarray(forward(flax_model, params, batch["inputs"], labels))
  for logits in (model_logits, rng.normal(0.0, 3.0, model_logits.shape)):
    expected_sum, expected_count = numpy_smoothed_loss(logits, labels, SMOOTHING)
    assert expected_count == 5 + 1 + 2 + 1 + 4 + 1          # targets + EOS, padding excluded
    j_sum, j_count = jax_model.smoothed_cross_entropy(jnp.asarray(logits), labels, SMOOTHING)
    t_sum, t_count = tf_trainer.smoothed_cross_entropy(tf.constant(logits), labels, SMOOTHING)
    assert float(j_count) == float(t_count) == expected_count
    assert abs(float(j_sum) - expected_sum) < TOL * abs(expected_sum)
    assert abs(float(t_sum) - expected_sum) < TOL * abs(expected_sum)
    # padding labels carry no loss whatever their logits
    noisy = logits + np.where(labels == 0, 1.0, 0.0)[..., None] * rng.normal(size=logits.shape)
    assert abs(float(jax_model.smoothed_cross_entropy(jnp.asarray(noisy), labels,
                                                      SMOOTHING)[0]) - expected_sum) < TOL * abs(
        expected_sum)
  # the entropy constant is right: logits = log(soft targets) give loss 0 (the minimum) ...
  vocab = CFG.vocab_size
  soft = np.full(model_logits.shape, SMOOTHING / (vocab - 1))
  np.put_along_axis(soft, labels[..., None].astype(np.int64), 1.0 - SMOOTHING, axis=-1)
  for fn in (lambda x: jax_model.smoothed_cross_entropy(jnp.asarray(x), labels, SMOOTHING),
             lambda x: tf_trainer.smoothed_cross_entropy(tf.constant(x), labels, SMOOTHING)):
    assert abs(float(fn(np.log(soft))[0])) < 1e-12
    assert float(fn(model_logits)[0]) > 1.0
  # ... and it is not optax's smoothing (s spread over all V tokens): that would differ here
  optax_soft = optax.smooth_labels(jax.nn.one_hot(labels, vocab, dtype=jnp.float64), SMOOTHING)
  assert np.abs(np.asarray(optax_soft) - soft).max() > 1e-3


# ----------------------------------------------------------------------------- gradients

def _jax_value_and_grad(flax_model):
  return compiled("value_and_grad", lambda: jax.jit(jax.value_and_grad(
      lambda p, batch: jax_trainer.loss_fn(p, flax_model.apply, batch, SMOOTHING),
      has_aux=True)))


def _tf_loss_and_grads(keras_model, batch):
  """tf_trainer.replica_loss outside any strategy: tf.distribute.get_replica_context() is then
  the default strategy's replica context (not None), whose all_reduce(SUM) over its single
  replica is the identity, so the loss is the batch's mean smoothed cross entropy, the same
  quantity as jax_trainer.loss_fn. Gradients made dense as TransformerTrainer.loss_and_grads
  does (the shared embedding gets IndexedSlices from its lookups)."""
  assert tf.distribute.get_replica_context() is not None
  with tf.GradientTape() as tape:
    loss = tf_trainer.replica_loss(keras_model, batch, SMOOTHING, training=False)
  grads = tape.gradient(loss, keras_model.trainable_variables)
  return loss, {id(v): tf.convert_to_tensor(g).numpy()
                for v, g in zip(keras_model.trainable_variables, grads)}


def test_loss_and_gradients_agree(models):
  flax_model, params, keras_model, batch = models
  (jax_loss, (count, _)), jax_grads = _jax_value_and_grad(flax_model)(params, batch)
  tf_loss, tf_grads = _tf_loss_and_grads(keras_model, batch)
  total, expected_count = numpy_smoothed_loss(
      forward(flax_model, params, batch["inputs"], batch["targets"]), batch["targets"],
      SMOOTHING)
  assert float(count) == expected_count
  assert abs(float(jax_loss) - total / expected_count) < TOL * abs(float(jax_loss))
  assert rel_err(tf_loss, jax_loss) < TOL
  paths = tf_layers.params_by_path(keras_model)
  ours = [np.ravel(tf_grads[id(var)]) for var in paths.values()]
  theirs = [np.ravel(_get(jax_grads, path)) for path in paths]
  assert rel_err(np.concatenate(ours), np.concatenate(theirs)) < TOL
  whole = np.linalg.norm(np.concatenate(theirs))
  for path, a, b in zip(paths, ours, theirs):
    # per tensor, against the larger of its norm and 1e-6 of the whole gradient's (no tensor
    # here has an exactly-zero gradient; the floor only guards a near-zero one)
    assert np.linalg.norm(b) > 0, path
    assert np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-6 * whole) < TOL, path


# ----------------------------------------------------------------------------- Adam

OPT = AdamConfig(base_learning_rate=2.0, warmup_steps=3)     # betas 0.9 / 0.997, eps 1e-9
SCHEDULE = schedules.RsqrtSchedule(base_lr=2.0, hidden_size=CFG.hidden_size, warmup_steps=3)


def numpy_tf_adam(weights, grads, m, v, t):
  """tf.raw_ops.ApplyAdam at update count t (from 1), lr = the schedule at t - 1 (the number of
  updates already applied): m, v moments, alpha = lr sqrt(1 - b2^t) / (1 - b1^t),
  w -= alpha m / (sqrt(v) + eps) (epsilon outside the bias correction)."""
  b1, b2, eps = OPT.beta_1, OPT.beta_2, OPT.epsilon
  step = t - 1
  lr = 2.0 * 16 ** -0.5 * min(1.0, step / 3) / math.sqrt(max(step, 3))
  alpha = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
  for k in weights:
    m[k] = b1 * m[k] + (1 - b1) * grads[k]
    v[k] = b2 * v[k] + (1 - b2) * grads[k] ** 2
    weights[k] = weights[k] - alpha * m[k] / (np.sqrt(v[k]) + eps)


def test_two_adam_steps_agree_with_the_numpy_formula(models):
  flax_model, params0, _, batch = models
  grad_fn = _jax_value_and_grad(flax_model)
  # JAX: optax state from tf_adam on the schedule (jnp ops), as the trainer builds it
  tx = jax_optimizers.make_adam(OPT, SCHEDULE)
  update = jax.jit(tx.update)
  params, state = params0, tx.init(params0)
  # Keras: TfAdam with a float64 learning rate
  optimizer = tf_optimizers.make_adam(OPT, SCHEDULE, dtype="float64")
  # numpy: the formula, on gradients computed (by the JAX model) at the numpy weights
  weights = _flat(params0)
  m = {k: np.zeros_like(w) for k, w in weights.items()}
  v = {k: np.zeros_like(w) for k, w in weights.items()}
  with keras_with(models, params0) as keras_model:
    for t in (1, 2):
      _, grads = grad_fn(params, batch)
      updates, state = update(grads, state, params)
      params = optax.apply_updates(params, updates)
      _, tf_grads = _tf_loss_and_grads(keras_model, batch)
      optimizer.apply([tf_grads[id(var)] for var in keras_model.trainable_variables],
                      keras_model.trainable_variables)
      _, np_grads = grad_fn(_unflat(weights, params0), batch)
      numpy_tf_adam(weights, _flat(np_grads), m, v, t)
      if t == 1:   # lr(0) = 0: the first update moves nothing, but fills the moments
        for k, w in _flat(params).items():
          np.testing.assert_array_equal(w, _flat(params0)[k])
    keras_after = {k: var.numpy() for k, var in tf_layers.params_by_path(keras_model).items()}
  assert int(state.count) == 2 and int(optimizer.iterations.numpy()) == 2
  flat_params, flat_m, flat_v = _flat(params), _flat(state.m), _flat(state.v)
  for path, expected in weights.items():
    assert rel_err(flat_params[path], expected) < TOL, path
    assert rel_err(keras_after[path], expected) < TOL, path
    assert rel_err(flat_m[path], m[path]) < TOL and rel_err(flat_v[path], v[path]) < TOL, path
  # the second step moved every tensor by a learning-rate-sized step (alpha ~ 0.08)
  for path, w in _flat(params0).items():
    assert rel_err(weights[path], w) > 1e-2, path


# ----------------------------------------------------------------------------- schedule

def test_rsqrt_schedule_matches_the_closed_form_in_numpy_jax_and_tf():
  base, hidden, warmup = 2.0, 16, 10
  schedule = schedules.RsqrtSchedule(base_lr=base, hidden_size=hidden, warmup_steps=warmup)
  steps = np.arange(51)
  expected = np.array([base * hidden ** -0.5 * min(1.0, s / warmup) / math.sqrt(max(s, warmup))
                       for s in steps])
  assert expected[0] == 0.0 and expected[warmup] == expected.max()   # peak at the warmup's end
  results = {
      "numpy": schedule(steps),
      "numpy scalars": [schedule(int(s)) for s in steps],
      "jax": jax.jit(lambda s: schedule(s, ops=jnp))(jnp.asarray(steps, jnp.int32)),
      "tf": schedule(tf.constant(steps, tf.float64), ops=tf.experimental.numpy),
      "keras": tf_optimizers.KerasSchedule(schedule, "float64")(tf.constant(steps, tf.int64)),
  }
  for name, got in results.items():
    got = np.asarray(got)
    assert got.dtype == np.float64, name
    np.testing.assert_allclose(got, expected, rtol=1e-14, atol=0, err_msg=name)
  # spec.schedule_for reads the optimizer config's fields
  cfg = spec.tiny()
  cfg.optimizer.base_learning_rate, cfg.optimizer.warmup_steps = base, warmup
  cfg.model.hidden_size = hidden
  np.testing.assert_allclose(spec.schedule_for(cfg)(steps), expected, rtol=1e-14)


# ----------------------------------------------------------------------------- decoding

def jax_decoder(flax_model, params, inputs, max_decode_length):
  """(cache {'decoder', 'encoder_bias'}, step(ids, i, cache) -> (logits, cache)): the flax
  model's encode + init_cache and decode_step, jitted (once per shape)."""
  prepare = compiled("prepare", lambda: jax.jit(
      lambda p, x, n: _prepare(flax_model, p, x, n), static_argnums=2))
  step = compiled("decode_step", lambda: jax.jit(
      lambda p, ids, i, decoder, bias: flax_model.apply(
          {"params": p}, ids, i, decoder, bias, method=jax_model.Transformer.decode_step)))

  def symbols_to_logits(ids, i, cache):
    logits, decoder = step(params, jnp.asarray(ids, jnp.int32), jnp.int32(i), cache["decoder"],
                           cache["encoder_bias"])
    return logits, {**cache, "decoder": decoder}
  return prepare(params, inputs, max_decode_length), symbols_to_logits


def _prepare(flax_model, params, inputs, max_decode_length):
  apply = functools.partial(flax_model.apply, {"params": params})
  encoded, bias = apply(inputs, method=jax_model.Transformer.encode)
  return {"decoder": apply(encoded, max_decode_length, method=jax_model.Transformer.init_cache),
          "encoder_bias": bias}


def test_incremental_decoding_equals_the_full_forward_pass(models):
  """decode_step at position i, fed the shifted targets one token at a time (the KV cache
  holding the earlier positions), gives the full model's logits at position i, in both
  frameworks. The cache is longer than the targets (as in beam search): positions not written
  yet must be masked."""
  flax_model, params, keras_model, batch = models
  inputs, targets = batch["inputs"], batch["targets"]
  length, max_decode_length = targets.shape[1], inputs.shape[1] + CFG.extra_decode_length
  shifted = np.pad(targets, ((0, 0), (1, 0)))[:, :-1]             # start id 0
  full = np.asarray(forward(flax_model, params, inputs, targets))

  cache, step = jax_decoder(flax_model, params, inputs, max_decode_length)
  jax_cache, jax_steps = cache, []
  for i in range(length):
    logits, jax_cache = step(shifted[:, i], i, jax_cache)
    jax_steps.append(np.asarray(logits))
  jax_steps = np.stack(jax_steps, axis=1)

  encoded, bias = keras_model.encode(inputs)
  decoder, tf_steps = keras_model.init_cache(encoded, max_decode_length), []
  for i in range(length):
    logits, decoder = keras_model.decode_step(tf.constant(shifted[:, i]), tf.constant(i),
                                              decoder, bias)
    tf_steps.append(logits.numpy())
  tf_steps = np.stack(tf_steps, axis=1)

  assert jax_steps.dtype == tf_steps.dtype == np.float64
  assert rel_err(jax_steps, full) < TOL
  assert rel_err(tf_steps, full) < TOL
  # the cache matters: the last step on an empty cache (earlier positions unwritten) differs
  last, _ = step(shifted[:, -1], length - 1, cache)
  assert rel_err(last, full[:, -1]) > 1e-3


def test_position_encoding_matches_the_closed_form():
  length, hidden = 50, 16
  half = hidden // 2
  # the reference's timescales 1 ... 1e4, geometric over the half: 1e4 ** (k / (half - 1))
  timescales = 1.0e4 ** (np.arange(half) / (half - 1))
  angles = np.arange(length)[:, None] / timescales[None, :]
  expected = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
  table = formulas.position_encoding(length, hidden)
  assert table.shape == (length, hidden) and table.dtype == np.float64
  # angles up to 49 rad: exp/log vs power and sin's argument rounding differ by ~ 49 x eps64
  np.testing.assert_allclose(table, expected, rtol=0, atol=1e-13)
  assert table[1, 0] == pytest.approx(math.sin(1.0)) and table[1, half] == pytest.approx(
      math.cos(1.0))
  jax_row = jax.jit(lambda i: jax_model._position_at(i, hidden))    # pylint: disable=protected-access
  tf_row = tf.function(lambda i: tf_model.position_at(i, hidden))
  for i in range(length):
    j, t = np.asarray(jax_row(jnp.int32(i))), tf_row(tf.constant(i)).numpy()
    assert j.shape == t.shape == (1, hidden) and j.dtype == t.dtype == np.float64
    np.testing.assert_allclose(j[0], table[i], rtol=0, atol=1e-13, err_msg=f"jax row {i}")
    np.testing.assert_allclose(t[0], table[i], rtol=0, atol=1e-13, err_msg=f"tf row {i}")
  # an odd-free check of the layout: sines first (row 0 is 0...0, 1...1)
  np.testing.assert_array_equal(table[0], [0.0] * half + [1.0] * half)


def trained_params(flax_model, params, batch, steps=100):
  """The tiny model trained (Adam in numpy, lr 0.02, on the jitted smoothed loss) until it has
  memorised the batch's three pairs: its beam search then ends each row in EOS at a different
  length."""
  grad_fn = _jax_value_and_grad(flax_model)
  w = _flat(params)
  m = {k: np.zeros_like(x) for k, x in w.items()}
  v = {k: np.zeros_like(x) for k, x in w.items()}
  for t in range(1, steps + 1):
    _, grads = grad_fn(_unflat(w, params), batch)
    for k, g in _flat(grads).items():
      m[k] = 0.9 * m[k] + 0.1 * g
      v[k] = 0.999 * v[k] + 0.001 * g * g
      w[k] = w[k] - 0.02 * (m[k] / (1 - 0.9 ** t)) / (np.sqrt(v[k] / (1 - 0.999 ** t)) + 1e-8)
  return _unflat(w, params)


def decode_three_ways(flax_model, params, keras_model, inputs):
  """Best-beam tokens of jax_trainer.translate (jitted) and tf_trainer.translate
  (tf.function), and the numpy beam search's (sequences, scores) driven by the JAX model's
  decode_step on numpy caches."""
  max_decode_length = inputs.shape[1] + CFG.extra_decode_length
  jax_translate = compiled("translate", lambda: jax.jit(
      lambda p, x: jax_trainer.translate(flax_model, p, x, CFG)))
  tf_translate = compiled("tf_translate", lambda: tf.function(
      lambda x: tf_trainer.translate(keras_model, x, CFG)))
  jax_tokens = np.asarray(jax_translate(params, inputs))
  tf_tokens = tf_translate(tf.constant(inputs)).numpy()

  cache, step = jax_decoder(flax_model, params, inputs, max_decode_length)

  def symbols_to_logits(ids, i, cache):
    logits, cache = step(ids, i, cache)
    return np.asarray(logits), jax.tree.map(np.asarray, cache)

  np_seqs, np_scores = beam_search_np.beam_search(
      symbols_to_logits, np.zeros(len(inputs), np.int32), jax.tree.map(np.asarray, cache),
      CFG.vocab_size, CFG.beam_size, CFG.alpha, max_decode_length, jax_model.EOS_ID)
  return jax_tokens, tf_tokens, np_seqs, np_scores


def all_beams(flax_model, params, keras_model, inputs):
  """Every beam and score of jax_beam_search and tf_beam_search on the models, set up as the
  trainers' translate sets them up (translate keeps only the best beam's tokens)."""
  max_decode_length = inputs.shape[1] + CFG.extra_decode_length
  args = (CFG.vocab_size, CFG.beam_size, CFG.alpha, max_decode_length, jax_model.EOS_ID)

  def jax_search(p, x):
    cache, step = jax_decoder(flax_model, p, x, max_decode_length)
    return jax_beam_search.beam_search(step, jnp.zeros(len(inputs), jnp.int32), cache, *args)

  def tf_search(x):
    encoded, bias = keras_model.encode(x)
    cache = {"decoder": keras_model.init_cache(encoded, max_decode_length), "encoder_bias": bias}

    def step(ids, i, cache):
      logits, decoder = keras_model.decode_step(ids, i, cache["decoder"], cache["encoder_bias"])
      return logits, {**cache, "decoder": decoder}
    return tf_beam_search.beam_search(step, tf.zeros(len(inputs), tf.int32), cache, *args)

  jax_out = compiled("jax_beam_search", lambda: jax.jit(jax_search))(params, inputs)
  tf_out = compiled("tf_beam_search", lambda: tf.function(tf_search))(tf.constant(inputs))
  return [np.asarray(x) for x in jax_out], [x.numpy() for x in tf_out]


def model_scores(flax_model, params, inputs, tokens):
  """What the beam search should score each best beam: the full model's summed log-probs of
  its tokens up to EOS over the length penalty if it ended, the raw sum over all its tokens if
  it did not (the decoder is causal: tokens after EOS do not change earlier log-probs)."""
  log_probs = np.asarray(jax.nn.log_softmax(forward(flax_model, params, inputs, tokens)))
  token_log_probs = np.take_along_axis(log_probs, tokens[..., None], -1)[..., 0]
  scores = []
  for row, tokens_row in zip(token_log_probs, tokens):
    if (tokens_row == jax_model.EOS_ID).any():
      n = int(np.argmax(tokens_row == jax_model.EOS_ID)) + 1
      scores.append(row[:n].sum() / formulas.length_penalty(n, CFG.alpha))
    else:
      scores.append(row.sum())
  return np.array(scores)


@pytest.mark.parametrize("which", ["random", "trained"])
def test_beam_search_agrees_in_jax_tf_and_numpy(models, which):
  """The random model repeats one token and never ends (the search returns its alive beams);
  the trained one decodes its training targets, EOS at three different lengths, zeros after.
  Beam arithmetic is float32 in all three: tokens exactly, scores to rtol 1e-5."""
  flax_model, params, _, batch = models
  inputs = batch["inputs"]
  if which == "trained":
    params = trained_params(flax_model, params, batch)
  with keras_with(models, params) as keras_model:
    jax_tokens, tf_tokens, np_seqs, np_scores = decode_three_ways(flax_model, params,
                                                                  keras_model, inputs)
  assert jax_tokens.shape == tf_tokens.shape == (3, inputs.shape[1] + CFG.extra_decode_length)
  np.testing.assert_array_equal(jax_tokens, tf_tokens)
  np.testing.assert_array_equal(np_seqs[:, 0, 1:], jax_tokens)
  assert np.all(np_seqs[:, :, 0] == 0)                             # the start id
  ended = (jax_tokens == jax_model.EOS_ID).any(axis=1)
  if which == "trained":
    expected = np.zeros_like(jax_tokens)
    expected[:, :batch["targets"].shape[1]] = batch["targets"]
    np.testing.assert_array_equal(jax_tokens, expected)
    assert ended.all()
  else:
    assert not ended.any() and (jax_tokens > 1).all()
  np.testing.assert_allclose(np_scores[:, 0], model_scores(flax_model, params, inputs,
                                                           jax_tokens), rtol=1e-5)
  # all beams and scores (lower beams: other finished sequences, or unfinished ones at ~-1e7)
  with keras_with(models, params) as keras_model:
    (jax_seqs, jax_scores), (tf_seqs, tf_scores) = all_beams(flax_model, params, keras_model,
                                                             inputs)
  for seqs, scores in ((jax_seqs, jax_scores), (tf_seqs, tf_scores)):
    np.testing.assert_array_equal(seqs, np_seqs)
    np.testing.assert_allclose(scores, np_scores, rtol=1e-5)
