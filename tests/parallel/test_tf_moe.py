"""Expert parallelism in the TF runtime (tf_moe.py) on logical CPU devices, in float64: the
Transformer with expert layers on data x expert replicas (and on expert x model), from the one-replica model's
weights, gives the gradients, the loss and parameters after two Adam steps and the router's
counts of one replica (rtol 1e-9); each replica holds its experts only; and the Keras model
equals the flax model on the same weights (logits, loss with router losses, gradients)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from tests.parallel import test_tf_model_parallel as mp_tests
from tests.conftest import workload_config
from workloads.common.moe import MoEConfig
from workloads.parallel import tf_layers
from workloads.parallel import tf_model_parallel as mp
from workloads.transformer import jax_model, jax_trainer, spec, tf_model, tf_trainer

RTOL = 1e-9
# one layer a stack, an expert layer (every=1): the encoder's and the decoder's (2 layers a
# stack with every=2 added two dense feed-forwards, tests/parallel/test_tf_model_parallel.py's
# layers, at twice the traced step)
MOE = dict(num_experts=4, every=1, group_size=12)


def moe_trainer(mesh):
  cfg = mp_tests.tiny_config(mesh)
  cfg.model.num_layers = 1
  cfg.model.moe = MoEConfig(**MOE)        # the random second policy: noise keyed by token
  cfg.parallel.mesh = mesh
  from harness.workload import RunContext  # pylint: disable=import-outside-toplevel
  trainer = spec.SPEC.make_trainer("tf", cfg, RunContext(seed=0, preset="tiny"))
  trainer.dtype = "float64"
  trainer.init()
  return trainer


def summed_gradients(trainer):
  """Every weight's gradient as the train step reduces it (an expert shard's over the
  replicas holding the same experts), whole on the host; and the router's counts."""
  rt, batch = trainer.runtime, trainer.train_dataset(0, 1)
  by_var = {id(v): p for p, v in tf_layers.params_by_path(trainer.model).items()}
  n = len(trainer.model.trainable_variables)

  def replica(batch):
    out, grads = trainer.loss_and_grads(batch)
    if not rt.sharded_weights:
      return grads, out["router"]
    whole, shards = trainer.summed_gradients(grads)
    return whole + shards, out["router"]

  iterator = trainer._distributed(lambda i, n: batch, 8)   # pylint: disable=protected-access
  grads, router = tf.function(lambda: trainer.strategy.run(replica, args=(next(iterator),)))()
  local = trainer.strategy.experimental_local_results
  out = {by_var[id(v)]: local(g)[0].numpy() for v, g in zip(trainer.model.trainable_variables,
                                                            grads)}
  for weight, grad in zip(rt.sharded_weights, grads[n:]):
    shards = {}
    for r, value in enumerate(local(grad)):
      shards.setdefault(rt.shape.coordinates(r)[weight.axis], value.numpy())
    out[by_var[id(weight)]] = np.concatenate([shards[e] for e in range(weight.parts)],
                                             weight.dim)
  counts = {k: sum(v.numpy() for v in local(router[k])) for k in ("tokens", "dropped", "load")}
  return out, counts


@pytest.fixture(scope="module")
def one_replica():
  trainer = moe_trainer("data=1")
  weights = mp_tests.whole_weights(trainer)
  grads, counts = summed_gradients(trainer)
  metrics = trainer.train(2)
  return trainer, weights, grads, counts, metrics, mp_tests.whole_weights(trainer)


# expert x model: the experts split over expert and whole over model (every model peer routes
# the same tokens), attention split over model (Megatron's layers; the dense feed-forwards'
# split is test_tf_model_parallel.py's), the expert peers strided by the model axis
# (harness.mesh.MESH_ORDER); an expert shard's gradient summed over the replicas holding the
# same experts (here its model peers). data=2,expert=2 was here too (50 CPU s): the same
# dispatch and the same sum over the replicas holding an expert (its data peers); JAX's test
# keeps data x expert (data=2,expert=2)
@pytest.mark.parametrize("mesh", ["data=1,expert=2,model=2"])
def test_expert_parallel_equals_one_replica(one_replica, mesh):
  one, weights, one_grads, one_counts, one_metrics, one_after = one_replica
  trainer = moe_trainer(mesh)
  for path, var in tf_layers.params_by_path(trainer.model).items():
    (var.assign_full if isinstance(var, mp.ShardedWeight) else var.assign)(weights[path])
  grads, counts = summed_gradients(trainer)
  mp_tests.assert_same(grads, one_grads)
  for key in counts:
    np.testing.assert_array_equal(counts[key], one_counts[key], err_msg=key)
  assert counts["dropped"] > 0
  metrics = trainer.train(2)
  np.testing.assert_allclose(metrics["loss"], one_metrics["loss"], rtol=RTOL)
  for key, value in one_metrics["scalars"].items():
    np.testing.assert_allclose(metrics["scalars"][key], value, rtol=RTOL, err_msg=key)
  mp_tests.assert_same(mp_tests.whole_weights(trainer), one_after)
  # each replica holds E / expert experts
  kernel = trainer.model.encoder.blocks[0].ffn.experts.filter.kernel
  assert kernel.variable.values[0].shape == (4 // trainer.runtime.expert, 32, 64)
  rt = trainer.runtime
  assert rt.collective_calls["all_to_all_over_expert"] >= 4
  # the all-to-all's cost as describe prints it, from the ops issued (counted while tracing):
  # its all-reduces carry `expert` times its tensors; a ring sends 2 (p - 1) / p of them, an
  # all-to-all (p - 1) / p of its own
  moved, a2a = rt.collective_bytes["all_reduce_over_expert"], rt.collective_bytes[
      "all_to_all_over_expert"]
  assert moved == rt.expert * a2a
  sent, true = rt.emulated_costs({"all_to_all_over_expert": a2a})["all_to_all_over_expert"]
  assert sent == 2 * (rt.expert - 1) * moved // rt.expert and true == a2a // 2


@pytest.fixture(scope="module")
def both_models(jax_float64):  # pylint: disable=unused-argument,redefined-outer-name
  del jax_float64
  cfg = spec.ModelConfig(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2,
                         filter_size=32, dropout=0.0, attention_dropout=0.0, relu_dropout=0.0,
                         moe=MoEConfig(num_experts=4, every=1, group_size=6,
                                       second_policy="all"))
  flax_model = jax_model.build(workload_config(spec, cfg), jnp.float64)
  ids = jnp.zeros((1, 6), jnp.int32)
  params = jax.tree.map(lambda p: p.astype(jnp.float64),
                        flax_model.init(jax.random.key(3), ids, ids)["params"])
  params = jax.tree.map(lambda p: p + 0.3 * jax.random.normal(jax.random.key(4), p.shape,
                                                              jnp.float64), params)
  keras_model = tf_layers.load_flax_variables(
      tf_model.build(workload_config(spec, cfg), "float64"), {"params": params})
  rng = np.random.default_rng(5)
  inputs = rng.integers(2, 40, size=(4, 6)).astype(np.int32)
  targets = rng.integers(2, 40, size=(4, 6)).astype(np.int32)
  inputs[0, 4:] = targets[1, 3:] = 0                 # padding routes nowhere in both
  return flax_model, params, keras_model, {"inputs": inputs, "targets": targets}


def test_keras_equals_flax_on_the_same_weights(both_models):
  """Training mode (capacity factor 1.25: 4 tokens a group here, so some are dropped) with the
  router losses in the loss: the same loss and gradients in both frameworks."""
  flax_model, params, keras_model, batch = both_models
  (jax_loss, (_, router)), jax_grads = jax.jit(jax.value_and_grad(
      lambda p: jax_trainer.loss_fn(p, flax_model.apply, batch, 0.1, jax.random.key(0)),
      has_aux=True))(params)
  assert float(router["dropped"]) > 0
  with tf.GradientTape() as tape:
    tf_loss = tf_trainer.replica_loss(keras_model, batch, 0.1, training=True)
  tf_grads = tape.gradient(tf_loss, keras_model.trainable_variables)
  np.testing.assert_allclose(float(tf_loss), float(jax_loss), rtol=RTOL)
  by_var = {id(v): path for path, v in tf_layers.params_by_path(keras_model).items()}
  for var, grad in zip(keras_model.trainable_variables, tf_grads):
    expected = jax_grads
    for key in by_var[id(var)]:
      expected = expected[key]
    np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(),
                               np.asarray(expected).reshape(var.shape), rtol=1e-8, atol=1e-12,
                               err_msg="/".join(by_var[id(var)]))
  # eval mode (capacity factor 2.0): the logits
  jax_logits = flax_model.apply({"params": params}, batch["inputs"], batch["targets"])
  tf_logits = keras_model(batch["inputs"], batch["targets"])
  np.testing.assert_allclose(tf_logits.numpy(), np.asarray(jax_logits), rtol=1e-9, atol=1e-12)
