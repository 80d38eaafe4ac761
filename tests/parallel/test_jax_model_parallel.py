"""Mesh-TF model parallelism in the JAX runtime, on 8 simulated CPU devices, in float64: the
Transformer and BERT with heads, d_ff and vocab split over a `model` axis (and the batch over
`data`) give the loss, every gradient and the parameters after two optimizer steps of one
device (rtol 1e-9), with and without weight-update sharding; the layouts are read back from
the arrays' shards and the collectives from the compiled step's HLO."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness.workload import RunContext
from workloads.bert import jax_trainer as bert_trainer
from workloads.bert import spec as bert_spec
from workloads.parallel import jax_runtime
from workloads.transformer import jax_model as transformer_model
from workloads.transformer import jax_trainer as transformer_trainer
from workloads.transformer import spec as transformer_spec
from tests.trees import assert_trees_close

pytestmark = pytest.mark.usefixtures("jax_float64")     # tests/conftest.py

RTOL = 1e-9       # float64 sums in another order: ~1e-15 relative per op, far below this


def transformer_config(layers=1, vocab=48):
  cfg = transformer_spec.tiny()
  cfg.model = transformer_spec.ModelConfig(vocab_size=vocab, hidden_size=32, num_layers=layers,
                                           num_heads=4, filter_size=64, extra_decode_length=3)
  cfg.data.source = "synthetic"              # packed rows of random examples (real shapes)
  cfg.data.max_length = cfg.data.eval_max_length = 12
  cfg.train.global_batch_size = 8
  return cfg


def bert_config():
  cfg = bert_spec.tiny()
  cfg.model.hidden_size, cfg.model.num_heads, cfg.model.intermediate_size = 32, 4, 64
  cfg.model.dropout = 0.1
  cfg.data.source = "synthetic"
  cfg.train.global_batch_size = 8
  return cfg


def float64_trainer(spec, model_module, cfg, mesh, wus=False, compile_steps=True):
  """The workload's JAX trainer with every parameter and the compute in float64."""
  cfg.parallel.mesh, cfg.parallel.weight_update_sharding = mesh, wus
  trainer = spec.SPEC.make_trainer("jax", cfg, RunContext(seed=0, preset="tiny"))
  trainer.dtype = jnp.float64
  trainer.model = model_module.build(cfg, jnp.float64)
  init_params = trainer.init_params
  trainer.init_params = lambda rng: jax.tree.map(lambda p: p.astype(jnp.float64),
                                                 init_params(rng))
  if not compile_steps:
    trainer.compile_steps = lambda *args: None
  trainer.init()
  return trainer


def loss_grads_and_two_steps(trainer, loss_fn):
  """(loss, gradients) at the initial state, then the parameters after two train steps."""
  batch = trainer.synthetic_batch()
  state = trainer.state
  with trainer.runtime.tracing():
    loss, grads = jax.jit(jax.value_and_grad(functools.partial(loss_fn, state, batch)))(
        state.params)
  loss, grads = jax.device_get((loss, grads))
  for _ in range(2):
    trainer.state, _ = trainer._train_step(trainer.state, batch)  # pylint: disable=protected-access
  return loss, grads, jax.device_get(trainer.state.params)


def transformer_loss(state, batch, params):
  rng = jax.random.fold_in(state.dropout_key, state.step)     # dropout on, as in training
  return transformer_trainer.loss_fn(params, state.apply_fn, batch, 0.1, rng)[0]


def bert_loss(state, batch, params):
  return bert_trainer.loss_and_grads(state, params, batch)[0]


def assert_trees_equal(a, b):
  assert_trees_close(a, b, RTOL, 1e-12, dtype=np.float64)


def run_transformer(mesh, wus=False):
  trainer = float64_trainer(transformer_spec, transformer_model, transformer_config(), mesh, wus)
  return trainer, loss_grads_and_two_steps(trainer, transformer_loss)


@pytest.fixture(scope="module")
def transformer_one_device():
  return run_transformer("data=1")[1]


# model alone, and model with data and weight-update sharding, as the TF test keeps them
# (model=2 alone and data=2,model=2 without sharding showed nothing these two do not: GSPMD's
# model specs are the same code for 2 and 4; data=2,model=4 repeated them on 8 devices)
@pytest.mark.parametrize("mesh,wus", [("data=1,model=4", False), ("data=2,model=2", True)])
def test_transformer_model_parallel_equals_one_device(transformer_one_device, mesh, wus):
  trainer, (loss, grads, params) = run_transformer(mesh, wus)
  one_loss, one_grads, one_params = transformer_one_device
  np.testing.assert_allclose(loss, one_loss, rtol=RTOL)
  assert_trees_equal(grads, one_grads)
  assert_trees_equal(params, one_params)
  # after the updates every parameter is back in its own layout (not replicated)
  model = trainer.runtime.model
  kernel = trainer.state.params["encoder"]["layer_0"]["ffn"]["filter"]["kernel"]
  assert kernel.addressable_shards[0].data.shape == (32, 64 // model)


def test_sharded_parameters_hold_one_model_shard_per_device():
  """Bytes per device of every parameter, read from its first shard: full / model for those
  with a head, d_ff or vocab dimension, whole for the rest; the optimizer state likewise, and
  with weight-update sharding split over data too."""
  trainer = float64_trainer(transformer_spec, transformer_model, transformer_config(),
                            "data=2,model=4", compile_steps=False)
  split = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(trainer.state.params):
    name = jax_runtime.path_name(path)
    shard = leaf.addressable_shards[0].data.nbytes
    if "model" in trainer.runtime.param_layouts[name]:
      assert shard * 4 == leaf.nbytes, name
      split += 1
    else:
      assert shard == leaf.nbytes and name.endswith(("_norm/scale", "_norm/bias", "output/bias")), name
  assert split == 1 + 3 * 4 + 2 * 3   # the embedding, 3 attentions' q, k, v, out, 2 FFNs' 3
  params = jax_runtime.per_device_bytes(trainer.state.params)
  assert jax_runtime.per_device_bytes(trainer.state.opt_state) == pytest.approx(2 * params, abs=64)
  wus = float64_trainer(transformer_spec, transformer_model, transformer_config(),
                        "data=2,model=4", wus=True, compile_steps=False)
  mu = wus.state.opt_state.m["encoder"]["layer_0"]["ffn"]["filter"]["kernel"]
  assert mu.addressable_shards[0].data.shape == (16, 16)        # rows on data, columns on model


def test_a_vocab_the_model_axis_does_not_divide_stays_whole():
  trainer = float64_trainer(transformer_spec, transformer_model, transformer_config(vocab=50),
                            "data=2,model=4", compile_steps=False)
  table = trainer.state.params["embedding_shared"]["embedding"]
  assert table.addressable_shards[0].data.shape == (50, 32)
  summary = trainer.runtime.layout_summary(transformer_spec.PARAM_AXES)
  assert summary["whole"] == {"embedding_shared/embedding": ["vocab"]}
  assert "encoder/layer_0/self_attention/query/kernel" in summary["split"]


def collectives(layers):
  trainer = float64_trainer(transformer_spec, transformer_model, transformer_config(layers),
                            "data=2,model=2")
  hlo = trainer._train_step.as_text()             # pylint: disable=protected-access
  params = trainer.state.params
  whole = sum(x.nbytes for x in jax.tree.leaves(params))
  return trainer.runtime.collectives_by_axis(hlo), (jax_runtime.per_device_bytes(params), whole)


def test_compiled_step_all_reduces_activations_over_model_never_sharded_gradients():
  """One more encoder and decoder layer adds Mesh-TF's all-reduces over `model` (tensors, as
  XLA's combiner may merge several into one op): forward, the attention and feed-forward
  outputs (encoder 2, decoder 3); backward, the input gradients of the column-parallel kernels
  (encoder: q, k, v, filter = 4; decoder: self q, k, v, cross query, cross k, v of the
  encoder output, filter = 7). Every one is an activation (at most batch x length x embed per
  device). The sharded kernels' gradients are reduced over `data` only: their bytes are the
  parameters' bytes per device (the shards, not the whole kernels; besides them one
  activation and the loss's two scalars), and nothing spans data and model at once."""
  (one, _), (two, (param_bytes, whole_bytes)) = collectives(1), collectives(2)
  per_layer = two[("all-reduce", "model")][1] - one[("all-reduce", "model")][1]
  assert per_layer == 5 + 4 + 7, (one, two)
  ops, tensors, nbytes = two[("all-reduce", "model")]
  assert nbytes <= tensors * (4 * 12 * 32) * 8        # local batch 4, length 12, embed 32
  assert ("all-reduce", "data+model") not in two
  gradient_bytes = two[("all-reduce", "data")][2]
  assert param_bytes <= gradient_bytes <= param_bytes + (4 * 12 * 32 + 2) * 8 < whole_bytes, (
      gradient_bytes, param_bytes, whole_bytes)


def test_beam_search_on_a_model_sharded_transformer_gives_the_same_tokens():
  one = float64_trainer(transformer_spec, transformer_model, transformer_config(),
                        "data=1", compile_steps=False)
  sharded = float64_trainer(transformer_spec, transformer_model, transformer_config(),
                            "data=2,model=4", compile_steps=False)
  inputs = np.asarray(one.synthetic_batch()["inputs"])
  tokens = {}
  for name, trainer in (("one", one), ("sharded", sharded)):
    rt = trainer.runtime
    batch = jax.device_put(inputs, rt.sharding(("batch", "length")))
    with rt.tracing():
      tokens[name] = np.asarray(jax.jit(lambda params, x, t=trainer: transformer_trainer.translate(
          t.model, params, x, t.cfg.model))(trainer.state.params, batch))
  np.testing.assert_array_equal(tokens["sharded"], tokens["one"])
  assert tokens["one"].shape == (8, 12 + 3)


def run_bert(mesh, wus=False):
  trainer = float64_trainer(bert_spec, bert_model(), bert_config(), mesh, wus)
  return loss_grads_and_two_steps(trainer, bert_loss)


def bert_model():
  from workloads.bert import jax_model   # pylint: disable=import-outside-toplevel
  return jax_model


# data=2,model=2 with weight-update sharding: data x model and the sharded LAMB update at once
# (model=2 alone showed nothing this does not, as in the TF test)
@pytest.mark.parametrize("mesh,wus", [("data=2,model=2", True)])
def test_bert_model_parallel_with_lamb_equals_one_device(mesh, wus, bert_one_device):
  """LAMB's trust ratios are whole-tensor norms over kernels split on model (and, with
  weight-update sharding, on data too): GSPMD sums the shards' squares."""
  loss, grads, params = run_bert(mesh, wus)
  one_loss, one_grads, one_params = bert_one_device
  np.testing.assert_allclose(loss, one_loss, rtol=RTOL)
  assert_trees_equal(grads, one_grads)
  assert_trees_equal(params, one_params)


@pytest.fixture(scope="module")
def bert_one_device():
  return run_bert("data=1")
