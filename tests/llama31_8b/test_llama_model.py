"""Llama 3.1 8B's model in flax and Keras: the parameter count at the reference size (a hand
formula = flax = Keras, from shapes: nothing allocated), Megatron's initialisation, TF <-> JAX
parity of logits, loss and every gradient with the JAX weights copied into Keras, float32 and
bfloat16 against float64, RoPE with Llama 3.1's frequency scaling against a numpy transcription
of HF's formula, grouped-query attention against multi-head attention with the key/value heads
repeated, causality, the pipeline view, rematerialisation, and a model axis of 2: JAX's layout
(only Megatron's activation all-reduces) and the Keras model's Megatron split, each against the
one-device model.

The TF <-> JAX comparisons run in float64 in both frameworks (jax.enable_x64 for this module;
the Keras model built with dtype float64): correct implementations then differ only by
summation order, ~ layers x sqrt(width) x eps64 ~ 1e-14 relative, so 1e-9 (TOL) separates
them from any real difference (a float32 rounding anywhere is ~1e-7) by orders of magnitude."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from harness import mesh as mesh_lib
from tests.conftest import rel_err, workload_config

from workloads.llama31_8b import jax_model, spec, tf_model
from workloads.parallel import tf_layers
from workloads.parallel import tf_model_parallel as mp

TINY = spec.ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                        num_kv_heads=2, intermediate_size=48, rope_theta=10_000.0,
                        rope_original_max_position=16)
SEQ, BATCH = 16, 3
TOL = 1e-9

pytestmark = pytest.mark.usefixtures("jax_float64")     # tests/conftest.py


def config(model):
  return workload_config(spec, model, max_seq_length=SEQ)


# ----------------------------------------------------------------------------- parameter count

def reference_parameter_count(c) -> int:
  """Embedding and (untied) lm_head [vocab, hidden] each; per layer q and o [hidden, heads x
  head_dim], k and v [hidden, kv_heads x head_dim], gate, up and down [hidden, ffn], two RMSNorm
  scales; the final norm. Llama 3.1 8B: 8,030,261,248."""
  h, d = c.hidden_size, c.head_dim
  layer = (2 * h * c.num_heads * d + 2 * h * c.num_kv_heads * d
           + 3 * h * c.intermediate_size + 2 * h)
  return 2 * c.vocab_size * h + c.num_layers * layer + h


def test_reference_parameter_count_formula_flax_and_keras():
  c = spec.ModelConfig()
  expected = (2 * 128_256 * 4096
              + 32 * (4096 ** 2 + 2 * 4096 * 1024 + 4096 ** 2 + 3 * 4096 * 14_336 + 2 * 4096)
              + 4096)
  assert expected == reference_parameter_count(c) == 8_030_261_248
  assert jax_model.count_parameters(c) == expected
  assert tf_model.count_parameters(c) == expected          # a StatelessScope: 0 bytes made


def test_parameter_paths_and_shapes_agree_and_every_one_has_logical_axes():
  shapes = jax_model.parameter_shapes(TINY)
  flat = {"/".join(k.key for k in path): tuple(v.shape)
          for path, v in jax.tree_util.tree_leaves_with_path(shapes)}
  keras_model = tf_model.build(config(TINY))
  keras_flat = {"/".join(path): tuple(var.shape)
                for path, var in tf_layers.params_by_path(keras_model).items()}
  assert flat == keras_flat
  assert len(flat) == 2 + 2 * 9 + 1
  assert flat["layer_1/k_proj/kernel"] == (32, 2 * 8) and flat["lm_head/kernel"] == (32, 64)
  for path, shape in flat.items():
    mesh_lib.param_axes(spec.PARAM_AXES, path, len(shape))     # raises if none matches
  assert keras_model.count_params() == reference_parameter_count(TINY) == \
      tf_model.count_parameters(TINY) == jax_model.count_parameters(TINY)


def test_initialisation_is_megatrons():
  """normal(0, 0.02), o_proj and down_proj normal(0, 0.02 / sqrt(2 x layers)), norms at 1."""
  c = dataclasses.replace(TINY, hidden_size=128, num_heads=4, num_kv_heads=2,
                          intermediate_size=256)
  scaled = 0.02 / math.sqrt(2 * 2)
  params = jax_model.build(config(c)).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
  params = params["params"]
  keras_model = tf_model.build(config(c))
  keras_params = {path: var.numpy() for path, var in tf_layers.params_by_path(keras_model).items()}
  for tree in (lambda *p: np.asarray(params[p[0]][p[1]][p[2]] if len(p) == 3
                                     else params[p[0]][p[1]]),
               lambda *p: keras_params[p]):
    for path, std in ((("embed_tokens", "embedding"), 0.02),
                      (("layer_1", "q_proj", "kernel"), 0.02),
                      (("layer_1", "up_proj", "kernel"), 0.02),
                      (("lm_head", "kernel"), 0.02),
                      (("layer_1", "o_proj", "kernel"), scaled),
                      (("layer_1", "down_proj", "kernel"), scaled)):
      value = tree(*path)
      assert value.dtype == np.float32, path
      assert abs(value.std() / std - 1) < 0.1 and abs(value.mean()) < 0.1 * std, path
      assert np.abs(value).max() > 3 * std, path                # not truncated
    np.testing.assert_array_equal(tree("layer_1", "input_norm", "scale"), np.ones(128))
    np.testing.assert_array_equal(tree("final_norm", "scale"), np.ones(128))


# ----------------------------------------------------------------------------- parity

def make_batch(seed=0, vocab=TINY.vocab_size):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, (BATCH, SEQ + 1)).astype(np.int32)
  mask = np.ones((BATCH, SEQ), np.float32)
  mask[1, 10:] = 0                                      # a sample's padded tail
  return {"tokens": tokens[:, :-1], "labels": tokens[:, 1:], "loss_mask": mask}


def random_params(params, seed=1):
  """Larger random values than the init (random norm scales too), so every path matters."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda p: jnp.asarray(rng.normal(0, 0.3, p.shape), jnp.float64), params)


@pytest.fixture(scope="module")
def models():
  flax_model = jax_model.build(config(TINY), jnp.float64)
  batch = make_batch()
  params = random_params(flax_model.init(jax.random.key(0), batch["tokens"])["params"])
  keras_model = tf_model.build(config(TINY), dtype="float64")
  tf_layers.load_flax_variables(keras_model, {"params": params})
  return flax_model, params, keras_model, batch


def jax_logits(flax_model, params, tokens):
  return flax_model.apply({"params": params}, tokens)


def test_logits_agree(models):
  flax_model, params, keras_model, batch = models
  jax_out = jax_logits(flax_model, params, batch["tokens"])
  tf_out = keras_model(batch, training=False)
  assert tf_out.dtype == tf.float64 and jax_out.dtype == jnp.float64
  assert jax_out.shape == (BATCH, SEQ, TINY.vocab_size)
  assert rel_err(tf_out, jax_out) < TOL


def _jax_value_and_grad(flax_model):
  def loss_fn(p, batch):
    return jax_model.lm_loss(flax_model.apply({"params": p}, batch["tokens"]), batch)
  return jax.jit(jax.value_and_grad(loss_fn))


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def test_loss_and_every_gradient_agree(models):
  flax_model, params, keras_model, batch = models
  jax_loss, jax_grads = _jax_value_and_grad(flax_model)(params, batch)
  with tf.GradientTape() as tape:
    logits = keras_model(batch, training=True)
    tf_loss = tf_model.lm_loss(keras_model, logits, batch)
  tf_grads = tape.gradient(tf_loss, keras_model.trainable_variables)
  assert rel_err(tf_loss, jax_loss) < TOL
  # the mean NLL over the 3 x 16 - 6 counted tokens, from the logits by numpy
  logits = np.asarray(jax_logits(flax_model, params, batch["tokens"]))
  shifted = logits - logits.max(-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  nll = -np.take_along_axis(log_probs, batch["labels"][..., None], -1)[..., 0]
  expected = (nll * batch["loss_mask"]).sum() / 42
  assert abs(float(jax_loss) / expected - 1) < 1e-12
  by_var = {id(v): g for v, g in zip(keras_model.trainable_variables, tf_grads)}
  paths = tf_layers.params_by_path(keras_model)
  assert len(paths) == len(keras_model.trainable_variables) == 21
  for path, var in paths.items():
    ours, theirs = np.asarray(tf.convert_to_tensor(by_var[id(var)])), _get(jax_grads, path)
    assert rel_err(ours, theirs) < TOL, path
    assert np.linalg.norm(theirs) > 0, path


def test_eval_sums_count_the_real_examples_tokens(models):
  flax_model, params, keras_model, batch = models
  logits = jax_logits(flax_model, params, batch["tokens"])
  example_mask = np.array([1, 1, 0], np.float32)
  total, count = jax_model.eval_sums(logits, batch, example_mask)
  assert float(count) == 16 + 10
  nll = -np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)),
                            batch["labels"][..., None], -1)[..., 0]
  assert abs(float(total) / (nll[0].sum() + nll[1, :10].sum()) - 1) < 1e-12
  tf_total, tf_count = tf_model.eval_sums(keras_model, tf.constant(np.asarray(logits)), batch,
                                          example_mask)
  assert float(tf_count) == 26 and rel_err(tf_total, total) < TOL
  assert float(jax_model.loss_denominators(batch, jnp.float64)) == 42
  no_mask = {k: v for k, v in batch.items() if k != "loss_mask"}
  assert float(jax_model.loss_denominators(no_mask, jnp.float64)) == 48
  assert rel_err(jax_model.loss_sums(logits, no_mask), nll.sum()) < 1e-12


def test_float32_and_bfloat16_models_stay_close_to_float64(models):
  """The models as they train against the float64 result, in JAX on the library attention
  (jax.nn.dot_product_attention, is_causal, grouped key/value heads; XLA's on a CPU): float32
  ~ layers x sqrt(width) x eps32 ~ 1e-6 relative (1e-4 still catches a real difference);
  bfloat16 compute well away from float32's and within a few percent."""
  flax_model, params, _, batch = models
  exact = np.asarray(jax_logits(flax_model, params, batch["tokens"]))
  params32 = jax.tree.map(lambda p: p.astype(jnp.float32), params)
  keras32 = tf_model.build(config(TINY))
  tf_layers.load_flax_variables(keras32, {"params": params32})
  for logits in (jax_logits(jax_model.build(config(TINY)), params32, batch["tokens"]),
                 keras32(batch)):
    assert logits.dtype == np.float32 and rel_err(logits, exact) < 1e-4
  keras_bf16 = tf_model.build(config(TINY), dtype="mixed_bfloat16")
  tf_layers.load_flax_variables(keras_bf16, {"params": params32})
  assert keras_bf16.decoder[0].q_proj.kernel.dtype == "float32"    # parameters stay float32
  for logits in (jax_logits(jax_model.build(config(TINY), jnp.bfloat16), params32,
                            batch["tokens"]), keras_bf16(batch)):
    assert logits.dtype == np.float32 and 1e-4 < rel_err(logits, exact) < 0.05


def test_bfloat16_rmsnorm_multiplies_by_the_float32_scale_in_both_frameworks():
  """Statistics and the scale product in float32, then rounded once to bfloat16 (a Keras
  weight read in a mixed_bfloat16 call is rounded to bfloat16 first unless it opts out of
  autocasting: 27% of these outputs then differ by a bfloat16 step)."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(64, 256)), jnp.bfloat16)
  scale = (1 + rng.normal(size=256) * 0.3).astype(np.float32)
  flax_out = jax_model.RMSNorm(1e-5, jnp.bfloat16).apply({"params": {"scale": scale}}, x)
  norm = tf_model.RMSNorm(256, 1e-5, name="norm", dtype="mixed_bfloat16")
  norm.scale.assign(scale)
  keras_out = norm(np.asarray(x.astype(jnp.float32)))
  assert flax_out.dtype == jnp.bfloat16 and keras_out.dtype == tf.bfloat16
  differ = np.asarray(flax_out, np.float32) != keras_out.numpy().astype(np.float32)
  assert differ.mean() < 0.01           # (none here: an ulp of rsqrt may flip a rounding)


def test_changing_a_token_changes_no_earlier_logit(models):
  flax_model, params, keras_model, batch = models
  changed = dict(batch, tokens=batch["tokens"].copy())
  t = 9
  changed["tokens"][:, t] = (changed["tokens"][:, t] + 1) % TINY.vocab_size
  for apply in (lambda b: np.asarray(jax_logits(flax_model, params, b["tokens"])),
                lambda b: keras_model(b).numpy()):
    before, after = apply(batch), apply(changed)
    np.testing.assert_array_equal(before[:, :t], after[:, :t])
    assert np.all(np.abs(before[:, t:] - after[:, t:]).max(-1) > 1e-6)


def test_pipeline_view_composes_to_the_model(models):
  flax_model, params, keras_model, batch = models
  whole = np.asarray(jax_logits(flax_model, params, batch["tokens"]))
  view = jax_model.LlamaLM.pipeline_layers
  x, none = flax_model.apply({"params": params}, None, batch, 0, 1, True, method=view)
  assert none is None
  _, logits = flax_model.apply({"params": params}, x, batch, 1, 2, True, method=view)
  np.testing.assert_array_equal(np.asarray(logits), whole)
  x, none = keras_model.pipeline_layers(None, batch, 0, 1)
  _, logits = keras_model.pipeline_layers(x, batch, 1, 2)
  assert none is None and rel_err(logits, whole) < TOL
  # the first stage alone has no lm_head, the last no embedding
  first = jax.eval_shape(lambda: flax_model.init(jax.random.key(0), None, batch, 0, 1, True,
                                                 method=view))["params"]
  assert set(first) == {"embed_tokens", "layer_0"}


def test_rematerialised_layers_give_the_same_gradients(models):
  flax_model, params, _, batch = models
  loss, grads = _jax_value_and_grad(flax_model)(params, batch)
  remat = dataclasses.replace(flax_model, remat_policy="full")
  remat_loss, remat_grads = _jax_value_and_grad(remat)(params, batch)
  assert rel_err(remat_loss, loss) < TOL
  for path, grad in jax.tree_util.tree_leaves_with_path(remat_grads):
    assert rel_err(grad, _get(grads, [k.key for k in path])) < TOL, path


# ----------------------------------------------------------------------------- RoPE, GQA

def hf_llama3_inverse_frequencies(dim, theta, factor, low_freq_factor, high_freq_factor,
                                  original_max_position):
  """transformers' _compute_default_rope_parameters + _compute_llama3_parameters, one
  frequency at a time in Python floats."""
  out = []
  for i in range(0, dim, 2):
    freq = 1.0 / theta ** (i / dim)
    wavelen = 2 * math.pi / freq
    low_freq_wavelen = original_max_position / low_freq_factor
    high_freq_wavelen = original_max_position / high_freq_factor
    if wavelen < high_freq_wavelen:
      out.append(freq)
    elif wavelen > low_freq_wavelen:
      out.append(freq / factor)
    else:
      smooth = ((original_max_position / wavelen - low_freq_factor)
                / (high_freq_factor - low_freq_factor))
      out.append((1 - smooth) * freq / factor + smooth * freq)
  return np.array(out)


def hf_rope(x, inv_freq):
  """HF's apply_rotary_pos_emb on x [B, L, heads, d] at positions 0..L-1: emb = cat(freqs,
  freqs), x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1)."""
  freqs = np.arange(x.shape[1])[:, None] * inv_freq[None]
  emb = np.concatenate([freqs, freqs], -1)[None, :, None]
  half = x.shape[-1] // 2
  rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
  return x * np.cos(emb) + rotated * np.sin(emb)


def test_rope_frequencies_with_llama31_scaling_match_hf():
  c = spec.ModelConfig()
  expected = hf_llama3_inverse_frequencies(128, 500_000.0, 8.0, 1.0, 4.0, 8192)
  wavelen = 2 * math.pi / (1.0 / 500_000.0 ** (np.arange(0, 128, 2) / 128))
  # the three regimes are all there: kept, divided by 8, interpolated
  assert (wavelen < 2048).sum() > 10 and (wavelen > 8192).sum() > 10
  assert ((wavelen >= 2048) & (wavelen <= 8192)).sum() >= 3
  for module in (jax_model, tf_model):
    np.testing.assert_allclose(module.inverse_frequencies(c), expected, rtol=1e-15, atol=0)
    plain = module.inverse_frequencies(dataclasses.replace(c, rope_scaling_factor=1.0))
    np.testing.assert_array_equal(plain, 1.0 / 500_000.0 ** (np.arange(0, 128, 2) / 128))


@pytest.mark.parametrize("factor", [8.0, 1.0])
def test_rope_rotation_matches_hf_rotate_half(factor):
  c = dataclasses.replace(TINY, hidden_size=64, num_heads=4, rope_scaling_factor=factor)
  inv = hf_llama3_inverse_frequencies(16, c.rope_theta, factor, c.rope_low_freq_factor,
                                      c.rope_high_freq_factor, c.rope_original_max_position)
  x = np.random.default_rng(0).normal(size=(2, SEQ, 3, 16))
  expected = hf_rope(x, inv)
  rotated = [jax_model.apply_rope(jnp.asarray(x), *jax_model.rope_tables(c, SEQ, jnp.float64)),
             tf_model.apply_rope(tf.constant(x), *tf_model.rope_tables(c, SEQ, "float64"))]
  for y in rotated:
    assert y.dtype == np.float64 and rel_err(y, expected) < 1e-14
  if factor == 1.0:       # plain RoPE: no frequency rescaled
    plain = hf_rope(x, 1.0 / c.rope_theta ** (np.arange(0, 16, 2) / 16))
    assert all(rel_err(y, plain) < 1e-14 for y in rotated)
  else:                   # scaling moves the low frequencies (this L and max position: some)
    assert not np.allclose(inv, 1.0 / c.rope_theta ** (np.arange(0, 16, 2) / 16))


def as_multi_head(params, c):
  """GQA weights as the MHA model's: each query head's key/value head copied to its place."""
  group, d = c.num_heads // c.num_kv_heads, c.head_dim
  out = jax.tree.map(lambda p: p, params)
  for i in range(c.num_layers):
    for name in ("k_proj", "v_proj"):
      kernel = params[f"layer_{i}"][name]["kernel"].reshape(c.hidden_size, c.num_kv_heads, d)
      out[f"layer_{i}"][name] = {"kernel": jnp.repeat(kernel, group, axis=1).reshape(
          c.hidden_size, c.num_heads * d)}
  return out


def test_grouped_query_attention_equals_multi_head_with_repeated_kv_heads(models):
  flax_model, params, keras_model, batch = models
  mha = dataclasses.replace(TINY, num_kv_heads=TINY.num_heads)
  mha_params = as_multi_head(params, TINY)
  expected = np.asarray(jax_logits(jax_model.build(config(mha), jnp.float64), mha_params,
                                   batch["tokens"]))
  assert rel_err(jax_logits(flax_model, params, batch["tokens"]), expected) < 1e-12
  assert rel_err(keras_model(batch), expected) < 1e-12
  # ... while another grouping (query head h reading kv head h % kv_heads) differs
  swapped = jax.tree.map(lambda p: p, params)
  for i in range(TINY.num_layers):
    q = params[f"layer_{i}"]["q_proj"]["kernel"].reshape(32, 2, 2, 8)
    swapped[f"layer_{i}"]["q_proj"] = {"kernel": q.transpose(0, 2, 1, 3).reshape(32, 32)}
    o = params[f"layer_{i}"]["o_proj"]["kernel"].reshape(2, 2, 8, 32)
    swapped[f"layer_{i}"]["o_proj"] = {"kernel": o.transpose(1, 0, 2, 3).reshape(32, 32)}
  assert rel_err(jax_logits(flax_model, swapped, batch["tokens"]), expected) > 1e-3


# ----------------------------------------------------------------------------- model axis

def test_jax_model_axis_keeps_each_query_heads_kv_head_on_its_shard(models):
  """data=1,model=2 on simulated CPU devices, the parameters laid out by PARAM_AXES and the
  activations by the model's constrain names: the loss and every gradient of one device, and
  the forward pass's only collectives are Megatron's all-reduces of [B, L, hidden] activations
  (the vocabulary-split embedding lookup and, per layer, o_proj's and down_proj's partial
  sums). Query heads and key/value heads split contiguously, so each shard's query heads read
  its own key/value heads: no gather of k or v (a grouping across shards would need one)."""
  from workloads.parallel import jax_runtime   # pylint: disable=import-outside-toplevel
  flax_model, params, _, batch = models
  runtime = jax_runtime.MeshRuntime(mesh_lib.ParallelConfig(mesh="data=1,model=2"))
  layout = jax.tree_util.tree_map_with_path(
      lambda path, p: runtime.sharding(mesh_lib.param_axes(
          spec.PARAM_AXES, jax_runtime.path_name(path), p.ndim), p.shape), params)
  placed = jax.device_put(params, layout)
  assert placed["layer_0"]["k_proj"]["kernel"].sharding.shard_shape((32, 16)) == (32, 8)
  forward = jax.jit(lambda p, t: flax_model.apply({"params": p}, t))
  value_and_grad = _jax_value_and_grad(flax_model)
  with runtime.tracing():
    logits = forward(placed, batch["tokens"])
    hlo = forward.lower(placed, batch["tokens"]).compile().as_text()
    loss, grads = value_and_grad(placed, batch)
  expected_loss, expected_grads = _jax_value_and_grad(flax_model)(params, batch)
  assert rel_err(logits, jax_logits(flax_model, params, batch["tokens"])) < TOL
  assert rel_err(loss, expected_loss) < TOL
  for path, grad in jax.tree_util.tree_leaves_with_path(grads):
    assert rel_err(grad, _get(expected_grads, [k.key for k in path])) < TOL, path
  activation_bytes = BATCH * SEQ * TINY.hidden_size * 8
  calls = 1 + 2 * TINY.num_layers
  assert runtime.collectives_by_axis(hlo) == {
      ("all-reduce", "model"): [calls, calls, calls * activation_bytes]}


# ----------------------------------------------------------------------------- TF model axis

def test_keras_model_parallel_equals_one_replica(models):
  """data=1,model=2 on two logical CPU devices: q/k/v, gate/up and lm_head column-parallel,
  o/down row-parallel, the embedding vocabulary-parallel; the logits (assembled from the
  replicas' vocabulary shards), the loss (vocabulary-parallel cross entropy) and every
  gradient (a shard's assembled, a whole weight's on each replica) as the JAX model's."""
  from workloads.parallel import tf_runtime   # pylint: disable=import-outside-toplevel
  flax_model, params, _, batch = models
  runtime = tf_runtime.StrategyRuntime(mesh_lib.ParallelConfig(mesh="data=1,model=2"))
  runtime.param_axes = spec.PARAM_AXES
  with runtime.strategy.scope():
    keras_model = tf_model.build(config(TINY), dtype="float64", runtime=runtime)
  tf_layers.load_flax_variables(keras_model, {"params": params})
  layer = keras_model.decoder[1]
  assert [p.parallel for p in (layer.q_proj, layer.k_proj, layer.v_proj, layer.o_proj,
                               layer.gate_proj, layer.up_proj, layer.down_proj,
                               keras_model.lm_head)] == ["column"] * 3 + ["row"] + \
      ["column"] * 2 + ["row", "column"]
  assert isinstance(keras_model.embed_tokens, mp.ShardedWeight)
  assert keras_model.embed_tokens.variable.values[0].shape == (32, 32)
  assert len(runtime.sharded_weights) == 1 + 7 * 2 + 1
  variables = keras_model.trainable_variables          # the RMSNorm scales, whole
  assert len(variables) == 5

  def replica(batch):
    with tf.GradientTape() as tape:
      shards = [w.component() for w in runtime.sharded_weights]
      for shard in shards:
        tape.watch(shard)
      logits = keras_model(batch, training=True)
      loss = tf_model.lm_loss(keras_model, logits, batch)
    grads = tape.gradient(loss, list(variables) + shards)
    # the trainer's share: the tokens counted over the replicas, once per model group
    share = tf_model.replica_loss(keras_model, batch)
    return logits, tf.stack([loss, share]), [tf.convert_to_tensor(g) for g in grads]

  step = tf.function(lambda b: runtime.strategy.run(replica, args=(b,)))
  logits, loss, grads = step({k: tf.constant(v) for k, v in batch.items()})
  local = runtime.strategy.experimental_local_results
  jax_loss, jax_grads = _jax_value_and_grad(flax_model)(params, batch)
  expected = np.asarray(jax_logits(flax_model, params, batch["tokens"]))
  assert rel_err(np.concatenate([x.numpy() for x in local(logits)], -1), expected) < TOL
  for value in local(loss):                            # (the loss, the replica's share)
    assert rel_err(value, [jax_loss] * 2) < TOL
  by_path = {id(v): path for path, v in tf_layers.params_by_path(keras_model).items()}
  for i, var in enumerate(variables):
    for value in local(grads[i]):                      # each model peer: the whole gradient
      assert rel_err(value, _get(jax_grads, by_path[id(var)])) < TOL, by_path[id(var)]
  for j, weight in enumerate(runtime.sharded_weights):
    parts = [x.numpy() for x in local(grads[len(variables) + j])]
    assert rel_err(np.concatenate(parts, weight.dim),
                   _get(jax_grads, by_path[id(weight)])) < TOL, by_path[id(weight)]


def test_keras_model_axis_must_split_whole_kv_heads():
  """model=4 would split TINY's 2 key/value heads of 8 dimensions mid-head."""
  from workloads.parallel import tf_runtime   # pylint: disable=import-outside-toplevel
  runtime = tf_runtime.StrategyRuntime(mesh_lib.ParallelConfig(mesh="data=1,model=4"))
  runtime.param_axes = spec.PARAM_AXES
  with runtime.strategy.scope(), pytest.raises(ValueError, match="num_kv_heads=2"):
    tf_model.build(config(TINY), runtime=runtime)
