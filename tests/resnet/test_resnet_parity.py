"""TF <-> JAX parity for ResNet: same parameter counts, and with the JAX weights copied into the
Keras model, the same logits (eval and train mode), loss, gradients, and LARS / SGD steps.

The comparisons run in float64 in both frameworks (JAX under jax.enable_x64 for this module
only; the Keras model built with dtype float64), where two correct implementations differ only
by summation order: a relative error of order depth x sqrt(fan-in) x eps64 ~ 10 x 25 x 1.1e-16
~ 3e-14, far below the 1e-9 the tests allow, and far above what a real difference gives (a
wrong stride, epsilon or momentum shows at 1e-3 or more). Float32 tolerances were what one CPU
happened to produce, and failed on another (Intel vs AMD summation order)."""
import jax
import jax.numpy as jnp
import keras
import numpy as np
import optax
import pytest
import tensorflow as tf

from tests.conftest import rel_err, workload_config

from workloads.common import jax_top1, tf_top1
from workloads.optim.configs import LarsSgdConfig as OptimizerConfig
from workloads.optim import jax_optimizers, schedules, tf_optimizers
from workloads.parallel import tf_layers
from workloads.resnet import jax_model, jax_trainer, spec, tf_model, tf_trainer

STAGES, WIDTH, CLASSES, SIZE, BATCH = (1, 2), 4, 5, 32, 8
CFG = workload_config(spec, spec.ModelConfig(stage_sizes=STAGES, width=WIDTH, num_classes=CLASSES),
                      image_size=SIZE)
TOL = 1e-9                 # float64 agreement (see above), optimizer steps included (the Keras
                           # learning rate is computed in float64 too: make_optimizer(dtype=))

pytestmark = pytest.mark.usefixtures("jax_float64")     # tests/conftest.py


@pytest.fixture(scope="module")
def models():
  flax_model = jax_model.build(CFG, jnp.float64)
  variables = flax_model.init(jax.random.key(0), jnp.zeros((1, SIZE, SIZE, 3)), train=False)
  # Random values everywhere (the zero-initialised BN scales would hide the residual branches).
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda p: jnp.asarray(rng.normal(0, 0.3, p.shape), jnp.float64),
                        variables["params"])
  stats = jax.tree_util.tree_map_with_path(
      lambda path, s: jnp.asarray(rng.uniform(0.5, 1.5, s.shape) if path[-1].key == "var"
                                  else rng.normal(0, 0.2, s.shape), jnp.float64),
      variables["batch_stats"])
  variables = {"params": params, "batch_stats": stats}
  keras_model = keras64()
  tf_layers.load_flax_variables(keras_model, variables)
  batch = {"image": rng.normal(size=(BATCH, SIZE, SIZE, 3)),
           "label": rng.integers(0, CLASSES, BATCH).astype(np.int32)}
  return flax_model, variables, keras_model, batch


def keras64():
  return tf_model.build(CFG, "float64")


@pytest.mark.parametrize("preset", ["mini", "reference", "synthetic"])
def test_same_parameter_count_in_both_frameworks(preset):
  cfg = spec.SPEC.config(preset)
  flax_model = jax_model.build(cfg)
  size = cfg.data.image_size
  shapes = jax.eval_shape(lambda: flax_model.init(jax.random.key(0), jnp.zeros((1, size, size, 3))))
  jax_count = sum(np.prod(x.shape) for x in jax.tree.leaves(shapes["params"]))
  keras_model = tf_model.build(cfg)
  assert keras_model.count_params() - _bn_stat_count(keras_model) == jax_count
  if preset != "mini":
    assert jax_count == 25_557_032


def _bn_stat_count(model):
  return sum(np.prod(l.moving_mean.shape) * 2 for l in model.layers
             if isinstance(l, keras.layers.BatchNormalization))


def test_conversion_covers_every_weight(models):
  flax_model, variables, keras_model, _ = models
  paths = {id(v): p for p, v in tf_layers.params_by_path(keras_model).items()}
  assert len(paths) == len(keras_model.trainable_variables)
  assert len(jax.tree.leaves(variables["params"])) == len(paths)


def test_eval_mode_logits_agree(models):
  flax_model, variables, keras_model, batch = models
  jax_logits = flax_model.apply(variables, batch["image"], train=False)
  tf_logits = keras_model(batch["image"], training=False)
  assert tf_logits.dtype == tf.float64 and jax_logits.dtype == jnp.float64
  assert rel_err(tf_logits, jax_logits) < TOL


def test_float32_logits_are_within_the_float32_bound_of_float64(models):
  """The models as they train (float32) against the float64 result: each layer adds ~eps32 x
  sqrt(fan-in <= 576) ~ 1.4e-6 relative, over ~8 layers ~1e-5; 1e-4 leaves room."""
  flax_model, variables, keras_model, batch = models
  exact = flax_model.apply(variables, batch["image"], train=False)
  model32 = tf_model.build(CFG)
  tf_layers.load_flax_variables(model32, variables)
  tf32 = model32(batch["image"].astype(np.float32), training=False)
  flax32 = jax_model.build(CFG)
  jax32 = flax32.apply(jax.tree.map(lambda x: x.astype(jnp.float32), variables),
                       batch["image"].astype(np.float32), train=False)
  assert tf32.dtype == tf.float32 and jax32.dtype == jnp.float32
  assert rel_err(tf32, exact) < 1e-4 and rel_err(jax32, exact) < 1e-4


def test_train_mode_logits_and_batch_statistics_agree(models):
  flax_model, variables, keras_model, batch = models
  jax_logits, updates = flax_model.apply(variables, batch["image"], train=True,
                                         mutable=["batch_stats"])
  clone = keras64()
  tf_layers.load_flax_variables(clone, variables)
  tf_logits = clone(batch["image"], training=True)
  assert rel_err(tf_logits, jax_logits) < TOL
  new_stats = updates["batch_stats"]["BottleneckBlock_1"]["BatchNorm_1"]
  layer = clone.get_layer("BottleneckBlock_1.BatchNorm_1")
  assert rel_err(layer.moving_mean.numpy(), new_stats["mean"]) < TOL
  assert rel_err(layer.moving_variance.numpy(), new_stats["var"]) < TOL


def _jax_value_and_grad(flax_model):
  """(params, batch_stats, batch) -> (loss, grads): one compiled program, not op by op."""
  def loss_fn(params, batch_stats, batch):
    logits, _ = flax_model.apply({"params": params, "batch_stats": batch_stats},
                                 batch["image"], train=True, mutable=["batch_stats"])
    return jax_top1.cross_entropy(logits, batch["label"], CLASSES, 0.1)
  return jax.jit(jax.value_and_grad(loss_fn))


def _tf_loss_and_grads(keras_model, batch):
  with tf.GradientTape() as tape:
    logits = keras_model(batch["image"], training=True)
    loss = tf_top1.cross_entropy_sum(logits, batch["label"], CLASSES, 0.1) / len(
        batch["label"])
  return loss, tape.gradient(loss, keras_model.trainable_variables)


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def test_loss_and_gradients_agree(models):
  flax_model, variables, keras_model, batch = models
  clone = keras64()
  tf_layers.load_flax_variables(clone, variables)
  jax_loss, jax_grads = _jax_value_and_grad(flax_model)(variables["params"],
                                                        variables["batch_stats"], batch)
  tf_loss, tf_grads = _tf_loss_and_grads(clone, batch)
  assert rel_err(tf_loss, jax_loss) < TOL
  paths = {id(v): p for p, v in tf_layers.params_by_path(clone).items()}
  ours = [np.ravel(g) for g in tf_grads]
  theirs = [np.ravel(_get(jax_grads, paths[id(v)])) for v in clone.trainable_variables]
  assert rel_err(np.concatenate(ours), np.concatenate(theirs)) < TOL
  whole = np.linalg.norm(np.concatenate(theirs))
  for var, a, b in zip(clone.trainable_variables, ours, theirs):
    # per tensor; a near-zero gradient (a BN bias before a max-pool) cancels, so measure
    # against the larger of its norm and 1e-3 of the whole gradient's
    assert np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-3 * whole) < TOL, paths[id(var)]


@pytest.mark.parametrize("name", ["lars", "sgd"])
def test_optimizer_steps_agree(models, name):
  flax_model, variables, _, batch = models
  opt_cfg = OptimizerConfig(name=name, base_learning_rate=0.5, weight_decay=1e-3, momentum=0.9)
  schedule = schedules.WarmupPolySchedule(base_lr=0.5, warmup_steps=0, decay_steps=10,
                                          end_lr=1e-4, power=2.0)
  tx = jax_optimizers.make_optimizer(opt_cfg, schedule)
  params, opt_state = variables["params"], None
  opt_state = tx.init(params)
  keras_model = keras64()
  tf_layers.load_flax_variables(keras_model, variables)
  optimizer = tf_optimizers.make_optimizer(opt_cfg, schedule,
                                           tf_model.decayed_variables(keras_model),
                                           keras_model.trainable_variables, dtype="float64")
  paths = {id(v): p for p, v in tf_layers.params_by_path(keras_model).items()}
  value_and_grad = _jax_value_and_grad(flax_model)
  for _ in range(2):                                  # two steps: momentum and lr both move
    _, grads = value_and_grad(params, variables["batch_stats"], batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    _, tf_grads = _tf_loss_and_grads(keras_model, batch)
    optimizer.apply(tf_grads, keras_model.trainable_variables)
  for var in keras_model.trainable_variables:
    assert rel_err(var.numpy(), _get(params, paths[id(var)])) < TOL, paths[id(var)]
  moved = rel_err(_get(params, ("classifier", "kernel")),
                  variables["params"]["classifier"]["kernel"])
  assert moved > 1e-4                                 # the steps did change the weights
