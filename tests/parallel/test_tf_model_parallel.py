"""Megatron-style model parallelism in the TF runtime (tf_model_parallel.py) on logical CPU
devices, in float64: the Transformer on data x model meshes, from the one-replica model's
weights, gives the loss and the parameters after two Adam steps of one replica (rtol 1e-9),
and the same gradients; each replica holds only its shard (bytes read from the replica-local
variables); a sharded weight's gradient is summed over its data peers, never over `model`;
the beam-search eval translates to the same tokens."""
import numpy as np
import pytest
import tensorflow as tf

from harness.workload import RunContext
from workloads.parallel import tf_layers
from workloads.parallel import tf_model_parallel as mp
from workloads.transformer import spec
from tests.trees import assert_trees_close

RTOL = 1e-9


def tiny_config(mesh, vocab=48, source="synthetic"):
  # tf.distribute's replicated steps never XLA-compile; neither does the one-replica reference
  overrides = ["train.jit_compile=false", f"data.source={source}", "data.packing=true",
               "model.dropout=0", "model.attention_dropout=0", "model.relu_dropout=0",
               "train.global_batch_size=8", "optimizer.warmup_steps=2", "data.max_length=12",
               "data.eval_max_length=12", "model.hidden_size=32", "model.num_heads=4",
               "model.filter_size=64"] + ([f"model.vocab_size={vocab}"] if vocab else [])
  cfg = spec.SPEC.configure("tiny", overrides)
  cfg.parallel.mesh = mesh
  return cfg


def float64_trainer(mesh, vocab=48, source="synthetic", data_dir=None, wus=False, compiled=True):
  """`compiled`: init (the train loop traced); else build (the model and optimizer only)."""
  cfg = tiny_config(mesh, vocab, source)
  cfg.parallel.weight_update_sharding = wus
  trainer = spec.SPEC.make_trainer("tf", cfg,
                                   RunContext(seed=0, preset="tiny", data_dir=data_dir))
  trainer.dtype = "float64"
  trainer.init() if compiled else trainer.build()
  return trainer


def copy_weights(source, target):
  """The one-replica model's weights into the model-parallel one (shards split from them)."""
  weights = tf_layers.params_by_path(source.model)
  for path, var in tf_layers.params_by_path(target.model).items():
    if isinstance(var, mp.ShardedWeight):
      var.assign_full(weights[path].numpy())
    else:
      var.assign(weights[path].numpy())


def whole_weights(trainer):
  return {path: (var.full_value() if isinstance(var, mp.ShardedWeight) else var.numpy())
          for path, var in tf_layers.params_by_path(trainer.model).items()}


_TRACED = {}      # id(trainer) -> (trainer, its traced loss and gradient function)


def summed_gradients(trainer, with_loss=False):
  """Every weight's gradient as the train step reduces it (a shard's over its data peers),
  assembled whole on the host from the replicas; with_loss: (the loss, those gradients), from
  the same traced step (one trace a trainer serves both)."""
  rt, batch = trainer.runtime, trainer.train_dataset(0, 1)
  paths = list(tf_layers.params_by_path(trainer.model))
  by_var = {id(v): p for p, v in tf_layers.params_by_path(trainer.model).items()}

  def replica(batch):
    loss, grads = trainer.loss_and_grads(batch)
    n = len(trainer.model.trainable_variables)
    whole = [g / rt.model for g in rt.all_sum(grads[:n])] if rt.distributed else grads[:n]
    return loss, whole + [rt.data_sum(g) for g in grads[n:]]

  if id(trainer) not in _TRACED:          # traced once a trainer: it reads the variables
    iterator = trainer._distributed(lambda i, n: batch, 8)   # pylint: disable=protected-access
    _TRACED[id(trainer)] = trainer, tf.function(
        lambda: trainer.strategy.run(replica, args=(next(iterator),)))
  losses, grads = _TRACED[id(trainer)][1]()       # the same synthetic batch every call
  local = lambda g: trainer.strategy.experimental_local_results(g)
  out = {}
  for var, grad in zip(trainer.model.trainable_variables, grads):
    path = next(p for p, v in tf_layers.params_by_path(trainer.model).items() if v is var)
    out[path] = local(grad)[0].numpy()
  for weight, grad in zip(rt.sharded_weights, grads[len(trainer.model.trainable_variables):]):
    path = by_var[id(weight)]
    shards = {}
    for r, value in enumerate(local(grad)):
      shards.setdefault(rt.shape.coordinates(r)["model"], value.numpy())
    out[path] = np.concatenate([shards[m] for m in range(rt.model)], weight.dim)
  assert set(out) == set(paths)
  if with_loss:         # a model peer's loss is its data shard's: summed over data replicas
    return sum(v.numpy() for v in local(losses)) / rt.model, out
  return out


def restart(trainer, weights):
  """A trainer back at `weights` ({path: value}) with fresh optimizer state and step 0."""
  for path, var in tf_layers.params_by_path(trainer.model).items():
    var.assign(weights[path])
  trainer.optimizer.iterations.assign(0)
  for slot in trainer.optimizer.variables:
    if slot is not trainer.optimizer.iterations:
      slot.assign(tf.zeros_like(slot))


def assert_same(a, b):
  assert_trees_close(a, b, RTOL, 1e-13)


@pytest.fixture(scope="module")
def one_replica():
  return float64_trainer("data=1")


TRAINERS = {}


def model_parallel(mesh, wus=False):
  """One trainer per mesh for the module (building and tracing 8 replicas is most of a test)."""
  if (mesh, wus) not in TRAINERS:
    trainer = TRAINERS[mesh, wus] = float64_trainer(mesh, wus=wus)
    # the collectives its init traced (one train step), before other tests trace more
    trainer.traced_calls = dict(trainer.runtime.collective_calls)
    trainer.traced_bytes = dict(trainer.runtime.collective_bytes)
  return TRAINERS[mesh, wus]


# model alone (model=4) and model with data and weight-update
# sharding (data=2,model=4 repeated what these show at twice the replicas to trace; model=2
# alone and data=2,model=2 without sharding, what the two kept show: suite time)
@pytest.mark.parametrize("mesh,wus", [("data=1,model=4", False), ("data=2,model=2", True)])
def test_transformer_model_parallel_equals_one_replica(one_replica, mesh, wus):
  """With weight-update sharding the whole weights' update is split over every replica and
  each shard's over its data peers."""
  sharded = model_parallel(mesh, wus)
  copy_weights(one_replica, sharded)
  start = whole_weights(one_replica)
  assert_same(summed_gradients(sharded), summed_gradients(one_replica))
  losses = [sharded.train(1)["loss"] for _ in range(2)]
  sharded_weights = whole_weights(sharded)
  restart(one_replica, start)
  expected = [one_replica.train(1)["loss"] for _ in range(2)]
  np.testing.assert_allclose(losses, expected, rtol=RTOL)
  assert_same(sharded_weights, whole_weights(one_replica))


def test_each_replica_holds_only_its_shard_and_shard_gradients_stay_off_model():
  """On the equality test's data=2,model=2 trainer (weight-update sharding: its traced step
  read here, no second trainer built and traced)."""
  trainer = model_parallel("data=2,model=2", wus=True)
  rt = trainer.runtime
  assert trainer.model.vocab_parallel
  for weight in rt.sharded_weights:
    whole = int(np.prod(weight.full_shape)) * 8
    for component in weight.variable.values:          # one per replica, on its device
      assert int(np.prod(component.shape)) * 8 * 2 == whole, weight.name
  assert len({c.device for c in rt.sharded_weights[0].variable.values}) == 4
  # the traced step: one data-peer sum per sharded weight's gradient, and one more that puts
  # the shards' updated slices back together (weight-update sharding: each data peer updates
  # its slice of every shard, packed in one sum of the same bytes); the optimizer's own
  # whole-tensor norms are none here (Adam); the model axis carries activations only
  calls = {k: v // rt.num_replicas for k, v in trainer.traced_calls.items()}
  assert calls["all_reduce_over_data"] - 1 == len(rt.sharded_weights) == 1 + 3 * 4 + 2 * 3
  nbytes = {k: v // rt.num_replicas for k, v in trainer.traced_bytes.items()}
  assert nbytes["all_reduce_over_data"] == 2 * sum(w.bytes_per_replica()
                                                   for w in rt.sharded_weights)
  # over `model`: activations (local batch 4 x 12 positions x 32) and smaller, never a weight
  assert nbytes["all_reduce_over_model"] <= calls["all_reduce_over_model"] * 4 * 12 * 32 * 8
  info = trainer.describe()
  whole_bytes = sum(int(np.prod(v.shape)) * 8 for v in trainer.model.trainable_variables)
  assert info.parameter_bytes_per_device == whole_bytes + sum(
      int(np.prod(w.full_shape)) * 8 // 2 for w in rt.sharded_weights)


def test_a_vocab_the_model_axis_does_not_divide_stays_whole():
  trainer = float64_trainer("data=1,model=4", vocab=50, compiled=False)
  assert not trainer.model.vocab_parallel
  assert not isinstance(trainer.model.embedding, mp.ShardedWeight)
  assert len(trainer.runtime.sharded_weights) == 3 * 4 + 2 * 3


def test_beam_search_eval_of_a_model_parallel_transformer_scores_the_same(tmp_path):
  # built, not initialised: the train loop init traces and runs is not this test's (the eval
  # is traced at its first call)
  one = float64_trainer("data=1", vocab=0, source="mini", data_dir=str(tmp_path),
                        compiled=False)
  sharded = float64_trainer("data=2,model=2", vocab=0, source="mini", data_dir=str(tmp_path),
                            compiled=False)
  copy_weights(one, sharded)
  result_one, result_sharded = one.evaluate(), sharded.evaluate()
  assert result_sharded == result_one and result_one["count"] == one.cfg.data.eval_examples


def bert_trainer(mesh, wus=False):
  from workloads.bert import spec as bert_spec   # pylint: disable=import-outside-toplevel
  cfg = bert_spec.SPEC.configure("tiny", [
      "train.jit_compile=false", "data.source=synthetic", "model.hidden_size=32",
      "model.num_heads=4", "model.intermediate_size=64", "train.global_batch_size=8"])
  cfg.parallel.mesh, cfg.parallel.weight_update_sharding = mesh, wus
  trainer = bert_spec.SPEC.make_trainer("tf", cfg, RunContext(seed=0, preset="tiny"))
  trainer.dtype = "float64"
  trainer.init()
  return trainer


def bert_weights(trainer, values=None):
  """{flax path: whole value}; with `values`, assigns them first."""
  out = {}
  for path, var in tf_layers.params_by_path(trainer.model).items():
    if values is not None:
      var.assign_full(values[path]) if isinstance(var, mp.ShardedWeight) else var.assign(
          values[path])
    out[path] = var.full_value() if isinstance(var, mp.ShardedWeight) else var.numpy()
  return out


# data=2,model=2 with weight-update sharding: data x model and the sharded LAMB update at once
# (model=2 alone showed nothing this does not: suite time)
@pytest.mark.parametrize("mesh,wus", [("data=2,model=2", True)])
def test_bert_model_parallel_with_lamb_equals_one_replica(mesh, wus):
  """Vocabulary-parallel MLM loss with the tied, split output bias; LAMB's trust ratios over
  whole kernels (the shards' squares summed over model, and with weight-update sharding over
  the data peers' slices too) and its global-norm clip over whole and sharded gradients
  together (the tiny model's global gradient norm is 2.19, over the clip norm 1.0)."""
  one, sharded = bert_trainer("data=1"), bert_trainer(mesh, wus)
  assert sharded.model.vocab_parallel
  start = bert_weights(one)
  bert_weights(sharded, start)
  expected = [one.train(1)["loss"] for _ in range(2)]
  losses = [sharded.train(1)["loss"] for _ in range(2)]
  np.testing.assert_allclose(losses, expected, rtol=RTOL)
  assert_same(bert_weights(sharded), bert_weights(one))


def test_tf_model_parallel_equals_jax_on_the_same_weights():
  """The flax model's float64 weights loaded into the TF model on data=2,model=2: the same
  loss and gradients (TF's assembled from the replicas' shards) as JAX on one device. The
  module's data=2,model=2 trainer (weight-update sharding, which splits only the update) and
  its traced loss and gradients: every weight is loaded from flax below."""
  import jax                                       # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp                          # pylint: disable=import-outside-toplevel
  from workloads.transformer import jax_model, jax_trainer, tf_model  # pylint: disable=import-outside-toplevel
  trainer = model_parallel("data=2,model=2", wus=True)
  batch = {k: v.numpy() for k, v in next(iter(trainer.train_dataset(0, 1))).items()}
  cfg = trainer.cfg
  with jax.enable_x64(True):
    flax_model = jax_model.build(cfg, jnp.float64)
    ids = jnp.zeros((1, cfg.data.max_length), jnp.int32)
    params = jax.tree.map(lambda p: jnp.asarray(p, jnp.float64),
                          flax_model.init(jax.random.key(3), ids, ids)["params"])
    loss_fn = lambda p: jax_trainer.loss_fn(p, flax_model.apply, batch,
                                            cfg.optimizer.label_smoothing)[0]
    jax_loss, jax_grads = jax.jit(jax.value_and_grad(loss_fn))(params)
    jax_grads = jax.tree.map(np.asarray, jax_grads)
  tf_layers.load_flax_variables(trainer.model, {"params": jax.tree.map(np.asarray, params)})
  tf_loss, tf_grads = summed_gradients(trainer, with_loss=True)     # on `batch` again
  np.testing.assert_allclose(tf_loss, float(jax_loss), rtol=RTOL)
  for path, grad in tf_grads.items():
    expected = jax_grads
    for key in path:
      expected = expected[key]
    np.testing.assert_allclose(grad.reshape(expected.shape), expected, rtol=RTOL, atol=1e-13,
                               err_msg=str(path))
