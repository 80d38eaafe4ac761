"""DLRM-DCNv2's embedding tables on a `model` axis (row-wise and table-wise, embedding_plan.py),
the batch on `data`: on simulated devices (JAX: 8 simulated CPU devices; TF: logical CPU
devices), in float64, from the same tables and dense weights, the loss, every gradient (each
table's, read back whole from the slab's shards) and the parameters after two Adagrad steps
equal one device's (rtol 1e-9); each device holds only its block of the slab (bytes read from
the arrays / the replica-local variables); the data-parallel eval scores every eval example
once and gives one device's AUC. Gradients are compared directly: Adagrad's update does not
change when a gradient is scaled, so equal parameters alone would not show a wrong sum."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
from flax.training import train_state

from harness.workload import RunContext
from tests.trees import assert_trees_close
from workloads.dlrm import embedding_plan, jax_model, jax_trainer, spec
from workloads.parallel import jax_runtime, tf_layers
from workloads.parallel import tf_model_parallel as mp

pytestmark = pytest.mark.usefixtures("jax_float64")     # tests/conftest.py

RTOL = 1e-9


def config(mesh):
  cfg = spec.SPEC.configure("tiny", ["train.jit_compile=false",
                                     "optimizer.base_learning_rate=0.1"])
  cfg.parallel.mesh = mesh
  return cfg


def tables(cfg):
  rng = np.random.default_rng(7)
  return [rng.normal(0, 0.5, (rows, cfg.model.embedding_dim))
          for rows in cfg.model.num_embeddings_per_feature]


def assert_close(a, b):
  assert_trees_close(a, b, RTOL, 1e-12, dtype=np.float64)


# ------------------------------------------------------------------ JAX

def jax_trainer_on(mesh):
  """The JAX trainer in float64, its slab built from `tables` on this mesh's plan."""
  cfg = config(mesh)
  trainer = spec.SPEC.make_trainer("jax", cfg, RunContext(seed=0, preset="tiny"))
  trainer.dtype = jnp.float64
  trainer.model = jax_model.build(cfg, jnp.float64, trainer.runtime.model)
  plan = spec.plan(cfg, trainer.runtime.model)
  create = trainer.create_state

  def create_state(rng):
    params = jax.tree.map(lambda p: p.astype(jnp.float64), create(rng).params)
    params["embedding"]["slab"] = jnp.asarray(plan.to_slab(tables(cfg)))
    return train_state.TrainState.create(apply_fn=trainer.model.apply, params=params,
                                         tx=trainer.tx)
  trainer.create_state = create_state
  trainer.init()
  return trainer, plan


def as_tables(params, plan):
  """Parameters with the slab replaced by its tables (the layout-free form)."""
  params = jax.tree.map(np.asarray, jax.device_get(params))
  params["embedding"] = {f"table_{f}": t for f, t in
                         enumerate(plan.from_slab(params["embedding"]["slab"]))}
  return params


def jax_run(mesh):
  trainer, plan = jax_trainer_on(mesh)
  batch = trainer.synthetic_batch()
  state = trainer.state
  with trainer.runtime.tracing():
    loss, grads = jax.jit(jax.value_and_grad(
        functools.partial(jax_trainer.loss_fn, state.apply_fn, batch=batch)))(state.params)
  for _ in range(2):
    trainer.state, _ = trainer._train_step(trainer.state, batch)  # pylint: disable=protected-access
  return {"trainer": trainer, "plan": plan, "loss": float(loss),
          "grads": as_tables(grads, plan), "params": as_tables(trainer.state.params, plan),
          "eval": trainer.evaluate()}


@pytest.fixture(scope="module")
def jax_one_device():
  return jax_run("data=1")


@pytest.mark.parametrize("mesh", ["data=2,model=2", "data=1,model=4"])
def test_jax_tables_on_a_model_axis_equal_one_device(jax_one_device, mesh):
  run = jax_run(mesh)
  trainer, plan, one = run["trainer"], run["plan"], jax_one_device
  assert {t.kind for t in plan.tables} == {embedding_plan.ROW_WISE, embedding_plan.TABLE_WISE}
  np.testing.assert_allclose(run["loss"], one["loss"], rtol=RTOL)
  assert_close(run["grads"], one["grads"])
  assert_close(run["params"], one["params"])
  # every device holds its block of the slab, read from the array's shards
  slab = trainer.state.params["embedding"]["slab"]
  assert slab.addressable_shards[0].data.shape == (plan.rows_per_shard,
                                                   trainer.cfg.model.embedding_dim)
  assert jax_runtime.per_device_bytes(trainer.state.params["embedding"]) == (
      plan.rows_per_shard * trainer.cfg.model.embedding_dim * 8)
  # the lookup's exchange: a sum over `model` in the compiled step
  axes = {axis for (_, axis) in trainer.describe().collectives_by_axis}
  assert "model" in axes, axes
  # the data-parallel eval: every eval example once, one device's AUC
  assert run["eval"]["count"] == one["eval"]["count"] == trainer.cfg.data.eval_examples
  np.testing.assert_allclose(run["eval"]["auc"], one["eval"]["auc"], rtol=RTOL)


# ------------------------------------------------------------------ TF (tf.distribute)

def tf_trainer_on(mesh, dense_from=None):
  cfg = config(mesh)
  trainer = spec.SPEC.make_trainer("tf", cfg, RunContext(seed=0, preset="tiny"))
  trainer.dtype = "float64"
  trainer.init()
  plan = spec.plan(cfg, trainer.runtime.model)
  slab = plan.to_slab(tables(cfg))
  for path, var in tf_layers.params_by_path(trainer.model).items():
    if path == ("embedding", "slab"):
      var.assign_full(slab) if isinstance(var, mp.ShardedWeight) else var.assign(slab)
    elif dense_from is not None:
      var.assign(dense_from[path])
  return trainer, plan


def tf_weights(trainer, plan):
  out = {}
  for path, var in tf_layers.params_by_path(trainer.model).items():
    value = var.full_value() if isinstance(var, mp.ShardedWeight) else var.numpy()
    if path == ("embedding", "slab"):
      out.update({("embedding", f"table_{f}"): t for f, t in enumerate(plan.from_slab(value))})
    else:
      out[path] = value
  return out


def tf_gradients(trainer, plan):
  """Every weight's gradient as the train step sums it (a shard's over its data peers only,
  a whole weight's over all replicas / model), assembled whole on the host."""
  rt = trainer.runtime
  batch = {k: tf.constant(v) for k, v in trainer.pipeline.synthetic_batch(
      trainer.cfg, trainer.cfg.train.global_batch_size, 1).items()}
  n = len(trainer.model.trainable_variables)

  def replica(batch):
    _, grads = trainer.loss_and_grads(batch)
    grads = [tf.convert_to_tensor(g) for g in grads]        # the slab's: tf.IndexedSlices
    if not rt.distributed:
      return grads
    return [g / rt.model for g in rt.all_sum(grads[:n])] + [rt.data_sum(g) for g in grads[n:]]

  make = lambda i, k: tf.data.Dataset.from_tensors(batch).repeat()
  iterator = trainer._distributed(make, trainer.cfg.train.global_batch_size)  # pylint: disable=protected-access
  grads = tf.function(lambda: trainer.strategy.run(replica, args=(next(iterator),)))()
  local = trainer.strategy.experimental_local_results if rt.distributed else lambda g: [g]
  by_var = {id(v): p for p, v in tf_layers.params_by_path(trainer.model).items()}
  out = {}
  for var, grad in zip(trainer.model.trainable_variables, grads[:n]):
    out[by_var[id(var)]] = local(grad)[0].numpy()
  for weight, grad in zip(rt.sharded_weights, grads[n:]):
    shards = {}
    for r, value in enumerate(local(grad)):
      shards.setdefault(rt.shape.coordinates(r)["model"], value.numpy())
    out[by_var[id(weight)]] = np.concatenate([shards[m] for m in range(rt.model)], weight.dim)
  slab = out.pop(("embedding", "slab"))
  out.update({("embedding", f"table_{f}"): t for f, t in enumerate(plan.from_slab(slab))})
  return out


def tf_run(mesh, dense_from=None):
  trainer, plan = tf_trainer_on(mesh, dense_from)
  grads = tf_gradients(trainer, plan)
  trainer.train(2)
  return {"trainer": trainer, "plan": plan, "grads": grads,
          "params": tf_weights(trainer, plan), "eval": trainer.evaluate()}


def test_tf_tables_on_a_model_axis_equal_one_replica():
  one = tf_run("data=1")
  dense = {p: v.numpy() for p, v in tf_layers.params_by_path(one["trainer"].model).items()
           if p != ("embedding", "slab")}
  one = tf_run("data=1", dense)           # from the same weights as the model-parallel run
  run = tf_run("data=2,model=2", dense)
  trainer, plan = run["trainer"], run["plan"]
  assert_close(run["grads"], one["grads"])
  assert_close(run["params"], one["params"])
  slab = tf_layers.params_by_path(trainer.model)[("embedding", "slab")]
  assert isinstance(slab, mp.ShardedWeight)
  assert slab.bytes_per_replica() == plan.rows_per_shard * trainer.cfg.model.embedding_dim * 8
  assert run["eval"]["count"] == one["eval"]["count"] == trainer.cfg.data.eval_examples
  np.testing.assert_allclose(run["eval"]["auc"], one["eval"]["auc"], rtol=RTOL)
