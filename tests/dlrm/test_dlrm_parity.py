"""TF <-> JAX parity for DLRM-DCNv2 in float64: with the flax weights loaded into the Keras model,
the same logits, loss, every gradient and the parameters after two Adagrad steps (torch's
form, in both frameworks' own optimizer code); the same parameter count as the formula, in both
frameworks (the reference's from shapes only). float64: two correct implementations differ by
summation order (~1e-15 relative a layer), far below the 1e-9 allowed."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from harness.workload import RunContext
from tests.conftest import rel_err
from workloads.dlrm import jax_model, jax_trainer, spec
from workloads.optim import jax_optimizers
from workloads.parallel import tf_layers

TOL = 1e-9

pytestmark = pytest.mark.usefixtures("jax_float64")     # tests/conftest.py


def config():
  cfg = spec.SPEC.configure("tiny", ["data.source=synthetic", "train.jit_compile=false",
                                     "optimizer.base_learning_rate=0.1"])
  return cfg


@pytest.fixture(scope="module")
def setup():
  cfg = config()
  model = jax_model.build(cfg, jnp.float64, 1)
  m = cfg.model
  variables = model.init(jax.random.key(0), jnp.zeros((1, m.dense_features)),
                         jnp.zeros((1, sum(m.multi_hot_sizes)), jnp.int32))
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda p: jnp.asarray(rng.normal(0, 0.3, p.shape), jnp.float64),
                        variables["params"])
  batch = spec.SPEC.input_pipeline.synthetic_batch(cfg, cfg.train.global_batch_size, 1)
  batch["dense"] = batch["dense"].astype(np.float64)
  trainer = spec.SPEC.make_trainer("tf", cfg, RunContext(seed=0, preset="tiny"))
  trainer.dtype = "float64"
  trainer.build()
  tf_layers.load_flax_variables(trainer.model, {"params": params})
  return cfg, model, params, trainer, batch


def jax_steps(cfg, model, params, batch, steps=2):
  tx = jax_optimizers.make_adagrad(cfg.optimizer, spec.schedule_for(cfg))
  state = tx.init(params)
  grad = jax.jit(jax.grad(lambda p: jax_trainer.loss_fn(model.apply, p, batch)))
  for _ in range(steps):
    grads = grad(params)
    updates, state = tx.update(grads, state, params)
    params = jax.tree.map(jnp.add, params, updates)
  return params


def test_logits_loss_and_gradients_agree(setup):
  cfg, model, params, trainer, batch = setup
  logits = model.apply({"params": params}, batch["dense"], batch["sparse"])
  tf_logits = trainer.model(batch["dense"], batch["sparse"])
  assert rel_err(tf_logits, logits) < TOL
  loss, grads = jax.value_and_grad(lambda p: jax_trainer.loss_fn(model.apply, p, batch))(params)
  tf_loss, tf_grads = trainer.loss_and_grads({k: tf.constant(v) for k, v in batch.items()})
  tf_grads = [tf.convert_to_tensor(g) for g in tf_grads]   # the slab's: tf.IndexedSlices
  assert rel_err(tf_loss, loss) < TOL       # summed over the replica / global batch: one replica
  by_var = {id(v): p for p, v in tf_layers.params_by_path(trainer.model).items()}
  flat = {"/".join(p): g for p, g in
          [(tuple(k.key for k in path), g) for path, g in
           jax.tree_util.tree_leaves_with_path(grads)]}
  for var, grad in zip(trainer.model.trainable_variables, tf_grads):
    assert rel_err(grad, flat["/".join(by_var[id(var)])]) < TOL, by_var[id(var)]
  assert len(tf_grads) == len(flat)


def test_two_adagrad_steps_agree(setup):
  cfg, model, params, trainer, batch = setup
  tf_batch = {k: tf.constant(v) for k, v in batch.items()}
  for _ in range(2):
    _, grads = trainer.loss_and_grads(tf_batch)
    trainer.optimizer.apply(grads, trainer.model.trainable_variables)
  want = jax_steps(cfg, model, params, batch)
  for path, var in tf_layers.params_by_path(trainer.model).items():
    expected = want
    for key in path:
      expected = expected[key]
    assert rel_err(var.numpy(), expected) < TOL, path


@pytest.mark.parametrize("preset", ["tiny", "mini", "reference"])
def test_parameter_count_is_the_formula_in_both_frameworks(preset):
  cfg = spec.SPEC.configure(preset)
  model = jax_model.build(cfg, jnp.float32, 1)
  m = cfg.model
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, m.dense_features)),
                                             jnp.zeros((1, sum(m.multi_hot_sizes)), jnp.int32)))
  count = sum(np.prod(x.shape) for x in jax.tree.leaves(shapes["params"]))
  assert count == spec.parameter_count(cfg)     # one slab: on one peer, no padding
  if preset != "reference":                     # the Keras model would allocate 104 GB
    from workloads.dlrm import tf_model
    assert tf_model.build(cfg).count_params() == count
