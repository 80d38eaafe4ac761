"""The backend-chosen attention (workloads/parallel/jax_attention.py) equals the models' own
formulation: jax.nn.dot_product_attention against a float64 numpy softmax for the three mask
kinds, and BERT's and the Transformer's outputs (padding, causal, packed rows, the beam-search
decode) with the library op against the portable path. The library op rounds its softmax to
float32, so these compare in float32, at 2e-5: float32 rounding on these sizes is ~1e-6, a
wrong mask or scale is >= 1e-2."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from workloads.bert import jax_model as bert_model
from workloads.bert import spec as bert_spec
from workloads.parallel import jax_attention
from workloads.transformer import jax_model, jax_trainer
from workloads.transformer import spec as transformer_spec

TOL = 2e-5


def numpy_attention(q, k, v, mask, scale):
  """float64: softmax(scale q.k + where(mask, 0, -inf)) v, per head."""
  q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
  logits = np.einsum("bqnh,bknh->bnqk", q, k) * scale
  logits = np.where(np.broadcast_to(mask, logits.shape), logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum("bnqk,bknh->bqnh", weights, v)


def masks(batch, length):
  lengths = np.array([length, 3, 1])[:batch]
  padding = (np.arange(length)[None] < lengths[:, None])[:, None, None, :]
  causal = np.tril(np.ones((length, length), bool))[None, None]
  segments = np.array([[1, 1, 2, 2, 2, 3, 0, 0], [1, 2, 2, 2, 2, 2, 2, 0],
                       [1, 1, 1, 1, 1, 1, 1, 1]])[:batch, :length]
  packed = ((segments[:, :, None] == segments[:, None, :])
            & (segments[:, None, :] != 0))[:, None] & causal
  return {"padding": padding, "causal": causal, "packed": packed}


@pytest.mark.parametrize("kind", ["padding", "causal", "packed"])
def test_library_attention_equals_masked_softmax(kind):
  rng = np.random.default_rng(0)
  q, k, v = (rng.normal(size=(3, 8, 2, 4)).astype(np.float32) for _ in range(3))
  mask = masks(3, 8)[kind]
  out = jax.nn.dot_product_attention(q, k, v, mask=jnp.asarray(mask), scale=0.5,
                                     implementation="xla")
  expected = numpy_attention(q, k, v, mask, 0.5)
  rows = np.broadcast_to(mask, (3, 2, 8, 8)).any(-1).transpose(0, 2, 1)   # a query sees a key
  np.testing.assert_allclose(np.asarray(out)[rows], expected[rows], rtol=TOL, atol=TOL)


def test_path_chosen_per_backend_and_dtype(monkeypatch):
  monkeypatch.delenv(jax_attention.OVERRIDE_ENV, raising=False)
  choose = jax_attention.implementation
  assert choose(jnp.bfloat16, False, backend="gpu") == "cudnn"
  assert choose(jnp.float16, False, backend="cuda") == "cudnn"
  assert choose(jnp.float32, False, backend="gpu") == "xla"     # cuDNN's kernels: half types
  assert choose(jnp.bfloat16, False, backend="cpu") == "xla"
  assert choose(jnp.bfloat16, True, backend="gpu") == "portable"    # dropout on the weights
  assert choose(jnp.float64, False, backend="cpu") == "portable"    # the op's softmax is f32
  monkeypatch.setenv(jax_attention.OVERRIDE_ENV, "portable")
  assert choose(jnp.bfloat16, False, backend="gpu") == "portable"
  monkeypatch.setenv(jax_attention.OVERRIDE_ENV, "flash")
  with pytest.raises(ValueError, match="HARNESS_ATTENTION='flash'; allowed: portable, xla"):
    choose(jnp.float32, False)


def test_cudnn_gets_the_whole_mask_and_a_decode_step_gets_xla(monkeypatch):
  """cuDNN's fused attention takes a mask as a bias of the whole [Lq, Lk] (JAX 0.11.2 on an H100
  refused BERT's [B, 1, 1, Lk] padding mask), so attend broadcasts it; one query goes to XLA."""
  calls = []
  monkeypatch.setattr(jax.nn, "dot_product_attention",
                      lambda q, k, v, mask, scale, implementation: calls.append(
                          (mask.shape, implementation)) or q)
  monkeypatch.setenv(jax_attention.OVERRIDE_ENV, "cudnn")
  padding = jnp.asarray(masks(3, 8)["padding"])
  for lq in (8, 1):
    q = jnp.zeros((3, lq, 2, 4), jnp.bfloat16)
    k = jnp.zeros((3, 8, 2, 4), jnp.bfloat16)
    jax_attention.attend(q, k, k, padding, None, scale=0.5, dropout_active=False)
  assert calls == [((3, 1, 8, 8), "cudnn"), ((3, 1, 1, 8), "xla")]


def both_paths(monkeypatch, fn):
  """fn() traced with the library op, then with the portable path."""
  monkeypatch.setenv(jax_attention.OVERRIDE_ENV, "xla")
  library = fn()
  monkeypatch.setenv(jax_attention.OVERRIDE_ENV, "portable")
  return library, fn()


def assert_close(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=TOL, atol=TOL)


def test_bert_padding_mask_on_both_paths(monkeypatch):
  cfg = bert_spec.SPEC.configure("tiny", [])
  model = bert_model.build(cfg)
  rng = np.random.default_rng(1)
  batch, length = 3, cfg.data.max_seq_length
  ids = rng.integers(1, cfg.model.vocab_size, (batch, length), dtype=np.int32)
  input_mask = (np.arange(length)[None] < np.array([[length], [5], [2]])).astype(np.int32)
  segments = np.zeros_like(ids)
  positions = np.tile(np.arange(4, dtype=np.int32), (batch, 1))
  params = model.init(jax.random.PRNGKey(0), ids, input_mask, segments, positions)
  out = both_paths(monkeypatch, lambda: model.apply(params, ids, input_mask, segments, positions))
  assert_close(*out)


def transformer():
  cfg = transformer_spec.ModelConfig(vocab_size=23, hidden_size=16, num_layers=2, num_heads=2,
                                     filter_size=24, dropout=0.1, attention_dropout=0.1,
                                     relu_dropout=0.1, extra_decode_length=3)
  model = jax_model.Transformer(cfg)
  inputs = np.array([[5, 6, 7, 8, 1, 0], [9, 4, 1, 0, 0, 0]], np.int32)
  targets = np.array([[3, 4, 1, 0, 0], [7, 1, 0, 0, 0]], np.int32)
  params = model.init(jax.random.PRNGKey(0), inputs, targets)["params"]
  return cfg, model, params, inputs, targets


def test_transformer_padding_causal_and_decode_on_both_paths(monkeypatch):
  cfg, model, params, inputs, targets = transformer()
  logits = both_paths(monkeypatch, lambda: model.apply({"params": params}, inputs, targets))
  assert_close(*logits)
  decoded = both_paths(monkeypatch, lambda: jax_trainer.translate(model, params, inputs, cfg))
  np.testing.assert_array_equal(*decoded)      # the beam search's tokens


def test_transformer_packed_rows_on_both_paths(monkeypatch):
  cfg, model, params, _, _ = transformer()
  inputs = np.array([[5, 6, 1, 7, 1, 0], [9, 4, 8, 1, 3, 1]], np.int32)
  targets = np.array([[3, 1, 4, 1, 0], [7, 1, 2, 5, 1]], np.int32)
  packed = {"inputs_segmentation": np.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 2, 2]]),
            "inputs_position": np.array([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]]),
            "targets_segmentation": np.array([[1, 1, 2, 2, 0], [1, 1, 2, 2, 2]]),
            "targets_position": np.array([[0, 1, 0, 1, 0], [0, 1, 0, 1, 2]])}
  logits = both_paths(monkeypatch, lambda: model.apply({"params": params}, inputs, targets,
                                                       packed=packed))
  assert_close(*logits)
