"""DLRM-DCNv2's sparse table update (TorchRec's fused EXACT_ADAGRAD): the embedding slab's
gradient as (unique rows, their summed gradient rows) and torch's Adagrad on those rows only.
In float64, two steps of it equal two steps of the dense update (the slab's dense gradient,
Adagrad over every row): the slab, its Adagrad accumulator and every dense weight, on a batch
whose ids repeat inside a bag and across the batch, in JAX (one device, tables on a model
axis, weight-update sharding) and TF (one replica; on two the dense fallback). And the compiled
JAX step's temporaries no longer grow with the table's rows (the dense step's do: the test
can fail)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
from flax.training import train_state

from harness.workload import RunContext
from tests.trees import assert_trees_close
from workloads.dlrm import jax_model, jax_trainer, spec, tf_trainer
from workloads.parallel import tf_layers

RTOL = 1e-9


def config(mesh="data=1", rows=None, wus=False):
  cfg = spec.SPEC.configure("tiny", ["train.jit_compile=false",
                                     "optimizer.base_learning_rate=0.1"])
  cfg.parallel.mesh = mesh
  cfg.parallel.weight_update_sharding = wus
  if rows is not None:
    cfg.model.num_embeddings_per_feature = rows
  return cfg


def repeated_batch(cfg, seed=3):
  """A global batch whose ids repeat: a few distinct ids per feature (so the same id twice in
  a bag and across the batch), the first bag of every example holding one id twice; the
  first half's ids from 3 per feature, the second's from 2 (replicas with different numbers
  of unique rows)."""
  m, n = cfg.model, cfg.train.global_batch_size
  rng = np.random.default_rng(seed)
  columns = []
  for rows, hot in zip(m.num_embeddings_per_feature, m.multi_hot_sizes):
    ids = rng.integers(0, min(rows, 3), (n, hot)) % np.where(np.arange(n) < n // 2, 3, 2)[:, None]
    if hot > 1:
      ids[:, 1] = ids[:, 0]
    columns.append(ids)
  return {"dense": rng.random((n, m.dense_features)),
          "sparse": np.concatenate(columns, axis=1).astype(np.int32),
          "label": rng.integers(0, 2, n).astype(np.float64)}


def slab_of(cfg, plan):
  rng = np.random.default_rng(7)
  return plan.to_slab([rng.normal(0, 0.5, (rows, cfg.model.embedding_dim))
                       for rows in cfg.model.num_embeddings_per_feature])


# ------------------------------------------------------------------ JAX

def step_temporaries(rows, sparse, mesh, wus):
  """Temporary bytes a device of the compiled float32 train step of the tiny model whose
  first table has `rows` rows."""
  cfg = config(mesh, rows=(rows, 12, 6, 3), wus=wus)
  trainer = spec.SPEC.make_trainer("jax", cfg, RunContext(seed=0, preset="tiny"))
  trainer.sparse_tables = sparse
  trainer.describing = True              # shapes only: the step compiled, nothing initialised
  trainer.init()
  step = trainer._train_step  # pylint: disable=protected-access
  return step.memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("mesh,wus", [("data=1", False), ("data=2,model=2", False),
                                      ("data=4", True)])
def test_jax_sparse_step_bytes_do_not_grow_with_the_table(mesh, wus):
  """XLA's memory analysis of the step for a first table of 1,000 and of 200,000 rows: the
  dense step's temporaries grow by about the table's bytes (its gradient), the sparse step's
  not at all (measured: 0 bytes on each layout here)."""
  small, large = 1_000, 200_000
  table_growth = (large - small) * spec.tiny().model.embedding_dim * 4     # float32 bytes
  grown = {sparse: step_temporaries(large, sparse, mesh, wus)
           - step_temporaries(small, sparse, mesh, wus) for sparse in (False, True)}
  assert grown[False] >= table_growth / 2, grown      # the dense gradient: a table's bytes
  assert grown[True] < table_growth / 10, grown


def jax_trained(sparse, mesh="data=1", wus=False):
  """Parameters and Adagrad sums (host numpy, float64) after two steps on the repeated
  batch."""
  cfg = config(mesh, wus=wus)
  trainer = spec.SPEC.make_trainer("jax", cfg, RunContext(seed=0, preset="tiny"))
  trainer.sparse_tables = sparse
  trainer.dtype = jnp.float64
  trainer.model = jax_model.build(cfg, jnp.float64, trainer.runtime.model)
  plan = spec.plan(cfg, trainer.runtime.model)
  create = trainer.create_state

  def create_state(rng):
    params = jax.tree.map(lambda p: p.astype(jnp.float64), create(rng).params)
    params["embedding"]["slab"] = jnp.asarray(slab_of(cfg, plan))
    return train_state.TrainState.create(apply_fn=trainer.model.apply, params=params,
                                         tx=trainer.tx)
  trainer.create_state = create_state
  trainer.init()
  shapes = trainer.batch_shapes(cfg.train.global_batch_size)
  batch = {k: jax.device_put(v.astype(shapes[k].dtype), shapes[k].sharding)
           for k, v in repeated_batch(cfg).items()}
  for _ in range(2):
    trainer.state, _ = trainer._train_step(trainer.state, batch)  # pylint: disable=protected-access
  state = jax.device_get(trainer.state)

  def tables(tree):
    tree = jax.tree.map(np.asarray, tree)
    tree["embedding"] = {f"table_{f}": t for f, t in
                         enumerate(plan.from_slab(tree["embedding"]["slab"]))}
    return tree
  return {"params": tables(state.params), "sum": tables(state.opt_state.sum),
          "step": int(state.step), "count": int(state.opt_state.count)}


@pytest.fixture(scope="module")
def jax_dense(jax_float64):
  del jax_float64
  return jax_trained(False)


@pytest.mark.parametrize("mesh,wus", [("data=1", False), ("data=2,model=2", False),
                                      ("data=4", True), ("data=2,model=2", True)])
def test_jax_sparse_update_equals_the_dense_one(jax_dense, jax_float64, mesh, wus):
  del jax_float64
  run = jax_trained(True, mesh, wus)
  assert (run["step"], run["count"]) == (jax_dense["step"], jax_dense["count"]) == (2, 2)
  for part in ("params", "sum"):
    assert_trees_close(run[part], jax_dense[part], RTOL, 1e-12, dtype=np.float64)
  # the batch touched some rows of the first table and left the others alone
  table = run["sum"]["embedding"]["table_0"]
  assert (table[:3] > 0).all() and (table[3:] == 0).all()


# ------------------------------------------------------------------ TF

def tf_trained(sparse, mesh="data=1"):
  """Weights and Adagrad sums (numpy, by flax path) after two steps on the repeated batch."""
  cfg = config(mesh)
  trainer = spec.SPEC.make_trainer("tf", cfg, RunContext(seed=0, preset="tiny"))
  trainer.sparse_tables = sparse
  trainer.dtype = "float64"
  trainer.init()
  # across replicas the TF slab's update stays dense (tf_trainer.DlrmTrainer.sparse_slab)
  assert trainer.sparse_slab == (sparse and mesh == "data=1")
  plan = spec.plan(cfg, trainer.runtime.model)
  rng = np.random.default_rng(11)
  for path, var in tf_layers.params_by_path(trainer.model).items():
    var.assign(slab_of(cfg, plan) if path == ("embedding", "slab") else
               rng.normal(0, 0.3, var.shape))
  layout = spec.batch_layout(cfg, 1)
  batch = {k: tf.constant(v.astype(layout[k][1])) for k, v in repeated_batch(cfg).items()}
  make = lambda i, n: tf.data.Dataset.from_tensors(batch).repeat()
  trainer._train_iter = trainer._distributed(  # pylint: disable=protected-access
      make, cfg.train.global_batch_size)
  trainer.train(2)
  sums = {id(v): s for v, s in zip(trainer.model.trainable_variables, trainer.optimizer.sums)}
  out = {}
  for path, var in tf_layers.params_by_path(trainer.model).items():
    out[path] = var.numpy()
    out[("sum",) + path] = sums[id(var)].numpy()
  for key in (("embedding", "slab"), ("sum", "embedding", "slab")):
    out.update({key[:-1] + (f"table_{f}",): t for f, t in enumerate(plan.from_slab(out.pop(key)))})
  return out, int(trainer.iterations.numpy())


def test_tf_sparse_update_equals_the_dense_one():
  """One replica sparse; on data=2 the fallback (dense) with sparse_tables on."""
  dense, steps = tf_trained(False)
  assert steps == 2
  for mesh in ("data=1", "data=2"):
    run, steps = tf_trained(True, mesh)
    assert steps == 2
    assert_trees_close(run, dense, RTOL, 1e-12, dtype=np.float64)
    table = run[("sum", "embedding", "table_0")]
    assert (table[:3] > 0).all() and (table[3:] == 0).all()


def test_tf_sparse_gradient_is_deduplicated_slices():
  cfg = config()
  trainer = spec.SPEC.make_trainer("tf", cfg, RunContext(seed=0, preset="tiny"))
  trainer.build()
  layout = spec.batch_layout(cfg, 1)
  batch = {k: tf.constant(v.astype(layout[k][1])) for k, v in repeated_batch(cfg).items()}
  _, grads = trainer.loss_and_grads(batch)
  slab = trainer.model.slab
  grad = grads[[id(v) for v in trainer.model.trainable_variables].index(id(slab))]
  assert isinstance(grad, tf.IndexedSlices)
  ids = grad.indices.numpy()
  assert len(np.unique(ids)) == len(ids) < cfg.train.global_batch_size
  dense = tf_trainer.dense_gradient(grad).numpy()
  np.testing.assert_array_equal(np.flatnonzero(np.abs(dense).sum(1)), np.sort(ids))
