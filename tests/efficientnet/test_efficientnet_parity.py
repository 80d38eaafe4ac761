"""TF <-> JAX parity for EfficientNet in float64 (see tests/resnet/test_resnet_parity.py for why
float64 and why 1e-9): with the flax weights copied into the Keras model, the same logits in
eval and train mode (stochastic depth and dropout off: their masks come from different
generators), batch statistics, loss, gradients, two TF-semantics RMSProp steps and two steps of
the large-batch recipe (LARS with the loss's L2 term); both RMSProp implementations against the
numpy formula, and the LARS recipe's schedule against Keras' PolynomialDecay. A wrong padding, epsilon, SE width or
activation shows at 1e-3 or more."""
import jax
import jax.numpy as jnp
import keras
import numpy as np
import optax
import pytest
import tensorflow as tf

from tests.conftest import rel_err, workload_config

from workloads.common import jax_top1, tf_top1
from workloads.efficientnet import jax_model, jax_trainer, spec, tf_model, tf_trainer
from workloads.optim import jax_optimizers, schedules, tf_optimizers
from workloads.optim.configs import LarsPolyConfig, RmsPropConfig
from workloads.parallel import tf_layers

# Width 0.25 / depth 0.25 (7 blocks: every kernel size, stride and expand ratio), 32x32.
MODEL = spec.ModelConfig(variant="custom", width_coefficient=0.25, depth_coefficient=0.25,
                         dropout_rate=0.0, drop_connect_rate=0.0, num_classes=5,
                         bn_momentum=0.9)
SIZE, BATCH, TOL = 32, 6, 1e-9
CFG = workload_config(spec, MODEL, image_size=SIZE)

pytestmark = pytest.mark.usefixtures("jax_float64")     # tests/conftest.py


@pytest.fixture(scope="module")
def models():
  flax_model = jax_model.build(CFG, jnp.float64)
  variables = jax.jit(flax_model.init, static_argnames="train")(
      jax.random.key(0), jnp.zeros((1, SIZE, SIZE, 3)), train=False)
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda p: jnp.asarray(rng.normal(0, 0.3, p.shape), jnp.float64),
                        variables["params"])
  stats = jax.tree_util.tree_map_with_path(
      lambda path, s: jnp.asarray(rng.uniform(0.5, 1.5, s.shape) if path[-1].key == "var"
                                  else rng.normal(0, 0.2, s.shape), jnp.float64),
      variables["batch_stats"])
  variables = {"params": params, "batch_stats": stats}
  batch = {"image": rng.normal(size=(BATCH, SIZE, SIZE, 3)),
           "label": rng.integers(0, MODEL.num_classes, BATCH).astype(np.int32)}
  keras_model = tf_model.build(CFG, "float64")   # built once: slow
  return flax_model, variables, batch, keras_model


def keras64(models):
  """The shared Keras model with the flax weights (re)loaded: tests change its weights."""
  _, variables, _, keras_model = models
  return tf_layers.load_flax_variables(keras_model, variables)


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def test_conversion_covers_every_trainable_weight(models):
  _, variables, _, _ = models
  keras_model = keras64(models)
  paths = {id(v): p for p, v in tf_layers.params_by_path(keras_model).items()}
  assert len(paths) == len(keras_model.trainable_variables)
  assert len(jax.tree.leaves(variables["params"])) == len(paths)


def test_eval_and_train_mode_logits_and_batch_statistics_agree(models):
  flax_model, variables, batch, _ = models
  keras_model = keras64(models)
  jax_eval = jax.jit(flax_model.apply, static_argnames="train")(variables, batch["image"],
                                                                train=False)
  tf_eval = keras_model(batch["image"], training=False)
  assert tf_eval.dtype == tf.float64 and jax_eval.dtype == jnp.float64
  assert rel_err(tf_eval, jax_eval) < TOL
  jax_train, updates = jax.jit(flax_model.apply, static_argnames=("train", "mutable"))(
      variables, batch["image"], train=True, mutable=("batch_stats",))
  tf_train = keras_model(batch["image"], training=True)
  assert rel_err(tf_train, jax_train) < TOL and rel_err(tf_train, tf_eval) > 1e-3
  new = updates["batch_stats"]["block6a"]["bn"]
  layer = keras_model.get_layer("block6a.bn")
  assert rel_err(layer.moving_mean.numpy(), new["mean"]) < TOL
  assert rel_err(layer.moving_variance.numpy(), new["var"]) < TOL


def _jax_loss_and_grads(flax_model, variables, batch):
  """A jitted params -> (loss, grads), built once per model (the BN statistics and the batch
  are fixed), so optimizer steps do not recompile."""
  key = id(flax_model)
  if key not in _GRAD_FNS:
    def loss_fn(params):
      logits, _ = flax_model.apply({"params": params, "batch_stats": variables["batch_stats"]},
                                   batch["image"], train=True, mutable=["batch_stats"])
      return jax_top1.cross_entropy(logits, batch["label"], MODEL.num_classes, 0.1)
    _GRAD_FNS[key] = jax.jit(jax.value_and_grad(loss_fn))
  return _GRAD_FNS[key](variables["params"])


_GRAD_FNS = {}


def _tf_loss_and_grads(keras_model, batch, l2=0.0):
  with tf.GradientTape() as tape:
    logits = keras_model(batch["image"], training=True)
    loss = tf_top1.cross_entropy_sum(logits, batch["label"], MODEL.num_classes, 0.1) / len(
        batch["label"])
    if l2:
      loss += tf_trainer.l2_term(keras_model, l2)
  return loss, tape.gradient(loss, keras_model.trainable_variables)


def test_loss_and_gradients_agree(models):
  flax_model, variables, batch, _ = models
  keras_model = keras64(models)
  jax_loss, jax_grads = _jax_loss_and_grads(flax_model, variables, batch)
  tf_loss, tf_grads = _tf_loss_and_grads(keras_model, batch)
  assert rel_err(tf_loss, jax_loss) < TOL
  paths = {id(v): p for p, v in tf_layers.params_by_path(keras_model).items()}
  ours = [np.ravel(g) for g in tf_grads]
  theirs = [np.ravel(_get(jax_grads, paths[id(v)])) for v in keras_model.trainable_variables]
  whole = np.linalg.norm(np.concatenate(theirs))
  assert rel_err(np.concatenate(ours), np.concatenate(theirs)) < TOL
  for var, a, b in zip(keras_model.trainable_variables, ours, theirs):
    assert np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-3 * whole) < TOL, paths[id(var)]


OPT = RmsPropConfig(decay=0.9, momentum=0.9, epsilon=1e-3, weight_decay=1e-2)
SCHEDULE = schedules.WarmupExponentialSchedule(base_lr=0.1, warmup_steps=0, decay_steps=1,
                                               decay_factor=0.5)      # lr 0.1, 0.05, 0.025


def numpy_rmsprop(w, grads, decayed, steps):
  """tf.raw_ops.ApplyRMSProp with TF1's ms=1 start, the L2 gradient, lr(step) per step."""
  ms, mom = np.ones_like(w), np.zeros_like(w)
  for step, g in enumerate(grads[:steps]):
    g = g + OPT.weight_decay * w * decayed
    ms = OPT.decay * ms + (1 - OPT.decay) * g * g
    mom = OPT.momentum * mom + SCHEDULE(step) * g / np.sqrt(ms + OPT.epsilon)
    w = w - mom
  return w


def test_rmsprop_two_steps_match_the_numpy_formula_in_both_frameworks():
  rng = np.random.default_rng(3)
  w0 = rng.normal(size=(3, 4))
  grads = [rng.normal(size=(3, 4)) * s for s in (1.0, 0.01)]   # small g: eps inside matters
  grads = [grads[0], grads[1], grads[0]]
  tx = jax_optimizers.make_rmsprop(OPT, SCHEDULE)
  params = {"conv": {"kernel": jnp.asarray(w0)}, "conv_bn": {"scale": jnp.asarray(w0)}}
  state = tx.init(params)
  for g in grads:
    updates, state = tx.update({"conv": {"kernel": g}, "conv_bn": {"scale": g}}, state, params)
    params = optax.apply_updates(params, updates)
  assert rel_err(params["conv"]["kernel"], numpy_rmsprop(w0, grads, 1.0, 3)) < TOL
  assert rel_err(params["conv_bn"]["scale"], numpy_rmsprop(w0, grads, 0.0, 3)) < TOL
  decayed, plain = keras.Variable(w0, name="decayed"), keras.Variable(w0, name="plain")
  opt = tf_optimizers.make_rmsprop(OPT, SCHEDULE, [plain], dtype="float64")
  for g in grads:
    opt.apply([tf.constant(g), tf.constant(g)], [decayed, plain])
  assert rel_err(decayed.numpy(), numpy_rmsprop(w0, grads, 1.0, 3)) < TOL
  assert rel_err(plain.numpy(), numpy_rmsprop(w0, grads, 0.0, 3)) < TOL
  assert rel_err(decayed.numpy(), w0) > 1e-3


def test_rmsprop_steps_on_the_model_agree(models):
  flax_model, variables, batch, _ = models
  tx = jax_optimizers.make_rmsprop(OPT, SCHEDULE)
  params, opt_state = variables["params"], tx.init(variables["params"])
  keras_model = keras64(models)
  update = jax.jit(tx.update)
  optimizer = tf_optimizers.make_rmsprop(OPT, SCHEDULE,
                                         tf_model.batch_norm_variables(keras_model),
                                         dtype="float64")
  paths = {id(v): p for p, v in tf_layers.params_by_path(keras_model).items()}
  for _ in range(2):          # two steps: momentum, mean square and lr all move
    _, grads = _jax_loss_and_grads(flax_model, {**variables, "params": params}, batch)
    updates, opt_state = update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    _, tf_grads = _tf_loss_and_grads(keras_model, batch)
    optimizer.apply(tf_grads, keras_model.trainable_variables)
  for var in keras_model.trainable_variables:
    theirs = _get(params, paths[id(var)])          # depthwise: [k,k,1,C] vs Keras' [k,k,C,1]
    assert rel_err(var.numpy().ravel(), np.ravel(theirs)) < TOL, paths[id(var)]
  assert rel_err(params["predictions"]["kernel"], variables["params"]["predictions"]["kernel"]) > 1e-3


def test_ema_matches_the_numpy_formula_in_both_frameworks():
  """tf.train.ExponentialMovingAverage(decay, num_updates=step): d = min(decay, (1+n)/(10+n))."""
  rng = np.random.default_rng(4)
  values = [rng.normal(size=(4,)) for _ in range(4)]
  expected = values[0]
  for n, v in enumerate(values[1:], start=1):
    d = min(0.5, (1 + n) / (10 + n))
    expected = d * expected + (1 - d) * v
  ema_jax = jnp.asarray(values[0])
  ema_tf = tf.Variable(values[0])
  for n, v in enumerate(values[1:], start=1):
    ema_jax = jax_trainer.ema_update(ema_jax, jnp.asarray(v), 0.5, n)
    tf_trainer.ema_update([ema_tf], [tf.constant(v)], 0.5, tf.constant(n, tf.int64))
  assert rel_err(ema_jax, expected) < TOL and rel_err(ema_tf.numpy(), expected) < TOL
  assert min((1 + 1) / 11, 0.5) < 0.5            # the num_updates cap was active


LARS = LarsPolyConfig(lars_weight_decay=1e-3, weight_decay=1e-2, lars_eta=0.02)
POLY = schedules.WarmupPolySchedule(base_lr=0.5, warmup_steps=0, decay_steps=3, end_lr=0.1,
                                    power=2.0, min_decay_step=1.0)


def test_lars_recipe_steps_on_the_model_agree(models):
  """Two steps of the large_batch recipe: the loss's L2 term (all but batch norm, biases too)
  in the gradient, then LARS (trust ratio and its own decay on kernels only)."""
  flax_model, variables, batch, _ = models
  keras_model = keras64(models)
  tx = jax_optimizers.make_optimizer(LARS, POLY, weight_decay=LARS.lars_weight_decay)
  params, opt_state = variables["params"], tx.init(variables["params"])
  update = jax.jit(tx.update)
  optimizer = tf_optimizers.make_optimizer(LARS, POLY, tf_layers.kernel_variables(keras_model),
                                           keras_model.trainable_variables, dtype="float64",
                                           weight_decay=LARS.lars_weight_decay)
  paths = {id(v): p for p, v in tf_layers.params_by_path(keras_model).items()}
  key = jax.random.key(0)          # dropout and stochastic depth are off
  grad_fn = jax.jit(lambda p: jax_trainer.loss_and_grads(
      flax_model.apply, p, variables["batch_stats"], batch, key, MODEL.num_classes, 0.1,
      l2=LARS.weight_decay)[1])
  for _ in range(2):
    grads = grad_fn(params)
    updates, opt_state = update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    _, tf_grads = _tf_loss_and_grads(keras_model, batch, l2=LARS.weight_decay)
    optimizer.apply(tf_grads, keras_model.trainable_variables)
  for var in keras_model.trainable_variables:
    assert rel_err(var.numpy().ravel(), np.ravel(_get(params, paths[id(var)]))) < TOL, \
        paths[id(var)]
  kernel = variables["params"]["predictions"]["kernel"]
  assert rel_err(params["predictions"]["kernel"], kernel) > 1e-4


def test_lars_recipe_schedule_is_tensorflow_tpus_poly():
  """utils.build_learning_rate('poly'): linear warmup, then tf.train.polynomial_decay of
  max(1, step - warmup) over total - warmup + 1 steps (Keras' PolynomialDecay is that op)."""
  from harness.config import TrainConfig
  opt = LarsPolyConfig(base_learning_rate_per_256=0.5, warmup_epochs=2.0, end_learning_rate=0.1)
  train = TrainConfig(global_batch_size=512, max_epochs=10)
  schedule = schedules.efficientnet_poly_for(opt, train, train_examples=5000)
  per_epoch = 5000 / 512
  warmup, total = int(2 * per_epoch), int(10 * per_epoch)
  assert schedule.base_lr == 1.0 and schedule.warmup_steps == warmup == 19
  poly = keras.optimizers.schedules.PolynomialDecay(1.0, total - warmup + 1, 0.1, power=2.0)
  for step in range(total + 3):
    expected = (1.0 * step / warmup if step < warmup
                else float(poly(max(1, step - warmup))))
    assert abs(float(schedule(step)) - expected) < 1e-6, step
