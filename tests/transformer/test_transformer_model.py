"""The Transformer (big) model in both frameworks: the reference's parameter count derived by
hand, the logical-axes table against every flax parameter, the Keras model's parameter paths,
the initialisers (Glorot-uniform over the [hidden, hidden] attention matrices, normal
hidden^-0.5 embeddings), and the presets' validation with the BLEU-unit target."""
import dataclasses
import math
import re

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest
from flax import traverse_util

from harness.errors import UsageError
from harness.mesh import param_axes
from tests.conftest import workload_config
from workloads.transformer import jax_model, spec, tf_model
from workloads.parallel import tf_layers


def _flax_shapes(model_cfg, length=8):
  """{path 'a/b/c': shape} of the flax params from shapes only (jax.eval_shape: nothing is
  allocated or compiled)."""
  model = jax_model.build(workload_config(spec, model_cfg))
  ids = jnp.ones((1, length), jnp.int32)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids))
  assert set(shapes) == {"params"}
  return {k: v.shape for k, v in traverse_util.flatten_dict(shapes["params"], sep="/").items()}


def _count(shapes):
  return sum(math.prod(s) for s in shapes.values())


def expected_parameters(vocab, hidden, filter_size, layers):
  """The count by hand: one shared embedding; attention without biases (4 [hidden, hidden]
  matrices); the feed-forward with biases; every LayerNorm a scale and a bias."""
  embedding = vocab * hidden
  attention = 4 * hidden * hidden
  ffn = hidden * filter_size + filter_size + filter_size * hidden + hidden
  norm = 2 * hidden
  encoder_layer = attention + ffn + 2 * norm
  decoder_layer = 2 * attention + ffn + 3 * norm        # plus encoder-decoder attention
  final_norms = 2 * norm                                 # one on each stack
  return embedding + layers * (encoder_layer + decoder_layer) + final_norms


def test_reference_count_derivation():
  """The reference size worked out term by term (vocab 33,708, hidden 1,024, filter 4,096, 6+6
  layers)."""
  assert 33_708 * 1_024 == 34_516_992                                       # embedding
  attention = 4 * 1_024 ** 2                                                # 4,194,304
  ffn = 1_024 * 4_096 + 4_096 + 4_096 * 1_024 + 1_024                       # 8,393,728
  assert attention + ffn + 2 * 2 * 1_024 == 12_592_128                      # encoder layer
  assert 2 * attention + ffn + 3 * 2 * 1_024 == 16_788_480                  # decoder layer
  assert 2 * 2 * 1_024 == 4_096                                             # final norms
  total = 34_516_992 + 6 * 12_592_128 + 6 * 16_788_480 + 4_096
  assert total == 210_804_736 == expected_parameters(33_708, 1_024, 4_096, 6)


def test_reference_model_has_210_804_736_parameters_in_flax():
  cfg = spec.SPEC.configure("reference").model
  assert (cfg.vocab_size, cfg.hidden_size, cfg.filter_size, cfg.num_layers, cfg.num_heads) == (
      33_708, 1_024, 4_096, 6, 16)
  assert _count(_flax_shapes(cfg)) == 210_804_736


def test_reference_model_has_210_804_736_parameters_in_keras():
  """Built for real at the reference's sizes with one and two of its six layers a stack (the
  layers are alike: the whole build, 843 MB of float32, cost 12 CPU s for the same sum)."""
  counts = []
  for layers in (1, 2):
    cfg = dataclasses.replace(spec.SPEC.configure("reference").model, num_layers=layers)
    model = tf_model.build(workload_config(spec, cfg))
    try:
      by_path = tf_layers.params_by_path(model)
      counts.append(model.count_params())
      assert sum(math.prod(v.shape) for v in by_path.values()) == counts[-1]
      assert len({id(v) for v in by_path.values()}) == len(by_path) == len(model.weights)
      assert all(v.dtype == "float32" for v in model.weights)
    finally:
      del model
      keras.backend.clear_session()
  assert counts[0] + 5 * (counts[1] - counts[0]) == 210_804_736


@pytest.mark.parametrize("vocab,hidden,filter_size,layers,heads", [
    (37, 16, 32, 1, 2), (101, 64, 96, 3, 4)])
def test_parameter_formula_holds_at_other_sizes(vocab, hidden, filter_size, layers, heads):
  cfg = spec.ModelConfig(vocab_size=vocab, hidden_size=hidden, filter_size=filter_size,
                         num_layers=layers, num_heads=heads)
  assert _count(_flax_shapes(cfg)) == expected_parameters(vocab, hidden, filter_size, layers)


# ----------------------------------------------------------------------------- names and axes

def _small():
  return spec.SPEC.configure("mini").model          # 2+2 layers, hidden 64, 4 heads


def test_param_axes_table_covers_every_flax_parameter_with_its_rank_and_sizes():
  """Of the mini model and of its MoE variant (moe_mini: experts in layer 1 of each stack)."""
  cfg, moe = _small(), spec.SPEC.configure("moe_mini").model
  sizes = {"vocab": cfg.vocab_size, "embed": cfg.hidden_size, "heads": cfg.num_heads,
           "kv": cfg.hidden_size // cfg.num_heads, "mlp": cfg.filter_size,
           "experts": moe.moe.num_experts, "routes": moe.moe.num_experts}
  shapes = {**_flax_shapes(cfg), **_flax_shapes(moe)}
  used = set()
  for path, shape in shapes.items():
    axes = param_axes(spec.PARAM_AXES, path, len(shape))     # raises on no match / wrong rank
    assert tuple(sizes[a] for a in axes) == shape, (path, axes, shape)
    used.add(next(p for p, _ in spec.PARAM_AXES if re.fullmatch(p, path)))
  assert used == {p for p, _ in spec.PARAM_AXES}               # no dead entry
  assert spec.SPEC.param_axes is spec.PARAM_AXES
  # Spot checks of the layout the docstring promises.
  assert param_axes(spec.PARAM_AXES, "decoder/layer_1/encdec_attention/query/kernel", 3) == (
      "embed", "heads", "kv")
  assert param_axes(spec.PARAM_AXES, "encoder/layer_0/self_attention/output/kernel", 3) == (
      "heads", "kv", "embed")
  assert param_axes(spec.PARAM_AXES, "encoder/output_norm/scale", 1) == ("embed",)
  # 2 x (2 encoder layers x 12 + 2 decoder layers x 18) + 1 embedding + 2 x 2 final norm leaves,
  # and moe_mini's 2 expert layers' router kernel and experts' 2 kernels and 2 biases
  assert len(_flax_shapes(cfg)) == 2 * 12 + 2 * 18 + 1 + 4
  assert len(shapes) == 2 * 12 + 2 * 18 + 1 + 4 + 2 * 5


def test_keras_variables_have_the_flax_paths_and_shapes():
  cfg = _small()
  shapes = _flax_shapes(cfg)
  model = tf_model.build(workload_config(spec, cfg))
  try:
    keras_shapes = {"/".join(path): tuple(v.shape)
                    for path, v in tf_layers.params_by_path(model).items()}
    assert keras_shapes == shapes
    assert len(model.weights) == len(shapes)
  finally:
    keras.backend.clear_session()


# ----------------------------------------------------------------------------- initialisers

HIDDEN, HEADS, VOCAB, FILTER = 256, 8, 1000, 512


def _init_cfg():
  return spec.ModelConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_heads=HEADS,
                          filter_size=FILTER, num_layers=1)


@pytest.fixture(scope="module")
def initial_params():
  """{framework: {path: float64 array}} of freshly initialised models at hidden 256."""
  cfg = _init_cfg()
  model = jax_model.build(workload_config(spec, cfg))
  ids = jnp.ones((1, 4), jnp.int32)
  flax = traverse_util.flatten_dict(
      jax.jit(model.init)(jax.random.key(3), ids, ids)["params"], sep="/")
  keras.utils.set_random_seed(3)
  km = tf_model.build(workload_config(spec, cfg))
  tf = {"/".join(p): np.asarray(v.numpy()) for p, v in tf_layers.params_by_path(km).items()}
  keras.backend.clear_session()
  return {"jax": {k: np.asarray(v, np.float64) for k, v in flax.items()},
          "tf": {k: v.astype(np.float64) for k, v in tf.items()}}


ATTENTION_KERNELS = [f"{stack}/{name}/{proj}/kernel"
                     for stack, name in (("encoder/layer_0", "self_attention"),
                                         ("decoder/layer_0", "self_attention"),
                                         ("decoder/layer_0", "encdec_attention"))
                     for proj in ("query", "key", "value", "output")]


@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_attention_kernels_are_glorot_uniform_over_the_hidden_by_hidden_matrix(
    initial_params, framework):
  """Uniform(-a, a) with a = sqrt(6 / (fan_in + fan_out)), fans those of the [256, 256] matrix
  the [256, 8, 32] / [8, 32, 256] kernel is: a = sqrt(6 / 512) = 0.10825 and std a / sqrt(3) =
  sqrt(2 / 512) = 0.0625. (Fans taken from the 3-d shape as Keras/flax do by default would give
  std sqrt(2 / (2048 + 8192)) = 0.014.)

  Tolerances: n = 65,536 values a kernel. A uniform's sample variance has relative standard
  error sqrt((9/5 - 1) / n) = sqrt(0.8 / n) = 0.35%, so the sample std's is 0.175%: 1% is over
  5 standard errors. The sample mean's standard error is std / 256: 0.03 std is ~8 of them.
  The largest |w| of n uniform draws falls below 0.995 a with probability 0.995^n ~ e^-328."""
  bound, std = math.sqrt(6 / (2 * HIDDEN)), math.sqrt(2 / (2 * HIDDEN))
  params = initial_params[framework]
  for path in ATTENTION_KERNELS:
    w = params[path]
    kv = HIDDEN // HEADS
    expected = (HEADS, kv, HIDDEN) if path.endswith("output/kernel") else (HIDDEN, HEADS, kv)
    assert w.shape == expected, path
    assert w.size == HIDDEN * HIDDEN
    assert 0.995 * bound <= np.abs(w).max() <= bound, path
    assert w.std() == pytest.approx(std, rel=0.01), path
    assert abs(w.mean()) < 0.03 * std, path
  # The query, key and value kernels of a layer are drawn independently.
  q, k = (params[f"encoder/layer_0/self_attention/{n}/kernel"] for n in ("query", "key"))
  assert abs(np.corrcoef(q.ravel(), k.ravel())[0, 1]) < 0.03     # 1/sqrt(n) = 0.004


@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_embedding_is_normal_with_std_hidden_to_the_minus_half_and_ffn_glorot(
    initial_params, framework):
  """Embedding: normal(0, 256^-0.5 = 0.0625) over 256,000 values (the sample std's relative
  standard error is 1/sqrt(2n) = 0.14%: 1% is 7 of them); a normal's fraction beyond 2 std is
  4.55% (standard error 0.04%). The feed-forward kernels: Glorot-uniform over [256, 512]."""
  params = initial_params[framework]
  e = params["embedding_shared/embedding"]
  assert e.shape == (VOCAB, HIDDEN)
  assert e.std() == pytest.approx(HIDDEN ** -0.5, rel=0.01)
  assert abs(e.mean()) < 0.01 * HIDDEN ** -0.5
  assert np.mean(np.abs(e) > 2 * HIDDEN ** -0.5) == pytest.approx(0.0455, abs=0.003)
  for path in ("encoder/layer_0/ffn/filter/kernel", "decoder/layer_0/ffn/output/kernel"):
    w = params[path]
    bound = math.sqrt(6 / (HIDDEN + FILTER))
    assert 0.995 * bound <= np.abs(w).max() <= bound, path
    assert w.std() == pytest.approx(bound / math.sqrt(3), rel=0.01), path
  for path, w in params.items():                                 # biases 0, LayerNorm 1 and 0
    if path.endswith("/bias"):
      assert not w.any(), path
    elif path.endswith("/scale"):
      assert (w == 1).all(), path


# ----------------------------------------------------------------------------- presets

@pytest.mark.parametrize("preset", ["mini", "tiny", "synthetic", "reference"])
def test_presets_validate_and_take_a_bleu_target(preset):
  cfg = spec.SPEC.configure(preset)
  assert cfg.model.vocab_size >= 3                             # derived for the mini ones
  assert cfg.model.hidden_size % cfg.model.num_heads == 0
  assert 0 < cfg.train.target < 100
  if preset in ("reference", "synthetic"):
    assert cfg.train.target == 25.0                            # rules/transformer.yaml, BLEU
  for target in ("25", "0.25", "99.9"):                        # BLEU points, within (0, 100)
    assert spec.SPEC.configure(preset, [f"train.target={target}"]).train.target == float(target)
  for target in ("100", "0", "-1", "250"):
    with pytest.raises(UsageError, match=r"train\.target"):
      spec.SPEC.configure(preset, [f"train.target={target}"])
  assert spec.BLEU.logged(25.0) == pytest.approx(0.25)         # eval_accuracy = BLEU / 100


def test_model_config_refuses_bad_shapes():
  with pytest.raises(UsageError, match="model.hidden_size"):
    spec.SPEC.configure("tiny", ["model.num_heads=3"])          # 16 is not a multiple of 3
  with pytest.raises(UsageError, match="model.vocab_size"):
    spec.SPEC.configure("reference", ["model.vocab_size=2"])



@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_bfloat16_compute_translates(framework):
  """Mixed precision as the reference preset runs it (float32 parameters, bfloat16 compute):
  the beam search decodes, compiled (TF's decode step once added its float32 lookup to the
  layers' bfloat16 outputs and failed to trace), and gives ids of the vocabulary."""
  cfg = spec.ModelConfig(vocab_size=40, hidden_size=16, num_layers=1, num_heads=2,
                         filter_size=32, extra_decode_length=3)
  inputs = np.array([[5, 7, 9, 1, 0, 0], [4, 1, 0, 0, 0, 0]], np.int32)
  if framework == "jax":
    import jax
    import jax.numpy as jnp
    from workloads.transformer import jax_trainer
    model = jax_model.build(workload_config(spec, cfg), jnp.bfloat16)
    params = model.init(jax.random.key(0), inputs, inputs)["params"]
    tokens = jax.jit(lambda p, x: jax_trainer.translate(model, p, x, cfg))(params, inputs)
  else:
    import tensorflow as tf
    from workloads.transformer import tf_trainer
    model = tf_model.build(workload_config(spec, cfg), dtype="mixed_bfloat16")
    tokens = tf.function(lambda x: tf_trainer.translate(model, x, cfg))(tf.constant(inputs))
  tokens = np.asarray(tokens)
  assert tokens.shape == (2, 6 + 3) and tokens.dtype == np.int32
  assert tokens.min() >= 0 and tokens.max() < 40


def test_projection_equations_read_as_tensordot_axes():
  assert tf_model.contracted_dims("bld,dnh->blnh") == 1        # q, k, v
  assert tf_model.contracted_dims("blnh,nhd->bld") == 2        # the attention output
  x = np.random.default_rng(0).normal(size=(2, 3, 4, 5))
  kernel = np.random.default_rng(1).normal(size=(4, 5, 6))
  np.testing.assert_allclose(
      keras.ops.tensordot(x, kernel, tf_model.contracted_dims("blnh,nhd->bld")),
      np.einsum("blnh,nhd->bld", x, kernel), rtol=1e-12, atol=1e-12)  # 20 float64 terms
  for equation in ("bld,nhd->blnh", "blnh,hnd->bld", "bld,dnh->bnlh"):
    with pytest.raises(ValueError, match=f"equation '{re.escape(equation)}': allowed"):
      tf_model.contracted_dims(equation)


def test_logits_matmul_runs_in_the_compute_dtype_and_returns_float32():
  """Under bf16 the tokens x hidden x vocab matmul takes bf16 operands (as the Keras model's
  tensordot in the compute dtype; Embed.attend would promote it to the float32 table), and the
  logits come back float32 for the softmax; the float32 logits equal Embed.attend's."""
  cfg = workload_config(spec, _small())
  ids = jnp.ones((2, 5), jnp.int32)
  params = jax.jit(jax_model.build(cfg).init)(jax.random.key(0), ids, ids)["params"]
  bf16 = jax_model.build(cfg, jnp.bfloat16)
  jaxpr = jax.make_jaxpr(lambda p: bf16.apply({"params": p}, ids, ids))(params)
  vocab = cfg.model.vocab_size
  dots = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"
          and e.outvars[0].aval.shape[-1] == vocab]
  assert dots and all(v.aval.dtype == jnp.bfloat16 for e in dots for v in e.invars)
  assert bf16.apply({"params": params}, ids, ids).dtype == jnp.float32
  f32 = jax_model.build(cfg)
  x = jax.random.normal(jax.random.key(1), (2, 5, cfg.model.hidden_size))
  ours = f32.apply({"params": params}, x, method=jax_model.Transformer.logits)
  table = params["embedding_shared"]["embedding"]
  attend = x @ table.T
  # float32 dot products of `hidden` terms in another order: |error| <= hidden * eps * sum|terms|
  bound = cfg.model.hidden_size * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(table).T)
  assert np.all(np.abs(np.asarray(ours) - np.asarray(attend)) <= bound)
