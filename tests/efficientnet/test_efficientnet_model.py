"""EfficientNet's architecture: trainable parameter counts equal keras.applications' for
B0..B7, the block table's structure (rounding, stochastic depth rates, strides), and the
depthwise convs as taps equal to each framework's grouped conv."""
import math
import os

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

from tests.conftest import workload_config
from workloads.efficientnet import jax_model, spec, tf_model
from workloads.optim import schedules
from workloads.optim.configs import RmsPropConfig
from harness.config import TrainConfig


def _flax_count(model, size=32):
  """Trainable parameters from shapes only (jax.eval_shape: nothing initialised or compiled;
  the count does not depend on the resolution)."""
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, size, size, 3)),
                                             train=False))
  return sum(math.prod(x.shape) for x in jax.tree.leaves(shapes["params"]))


def _trainable(model):
  return int(sum(np.prod(v.shape) for v in model.trainable_weights))


# keras.applications.EfficientNetB*(weights=None) trainable parameters (keras 3.15.1, pinned);
# B0 and B2 are rebuilt live below, so the table cannot drift from its source unnoticed.
# Building B3-B7 in Keras took ~90 s of CI per run (B7 alone ~35 s) for numbers that only
# change with a Keras upgrade: then rebuild them all with KERAS_APPLICATIONS_ALL=1.
KERAS_APPLICATIONS_TRAINABLE = {"b0": 5_288_548, "b1": 7_794_184, "b2": 9_109_994,
                                "b3": 12_233_232, "b4": 19_341_616, "b5": 30_389_784,
                                "b6": 43_040_704, "b7": 66_347_960}


def test_all_eight_variants_have_keras_applications_trainable_counts():
  """Our flax B0..B7 against keras.applications' counts (built at 32x32: the count does not
  depend on the resolution, and building is cheaper)."""
  live = list(spec.VARIANTS) if os.environ.get("KERAS_APPLICATIONS_ALL") else ["b0", "b2"]
  for name in live:
    reference = getattr(keras.applications, f"EfficientNet{name.upper()}")(
        weights=None, input_shape=(32, 32, 3))
    assert _trainable(reference) == KERAS_APPLICATIONS_TRAINABLE[name], name
    keras.backend.clear_session()
  for name in spec.VARIANTS:
    flax_model = jax_model.build(workload_config(spec, spec.variant(name)[0]))
    assert _flax_count(flax_model) == KERAS_APPLICATIONS_TRAINABLE[name], name
  # Our Keras model at B0 (the parity tests show both frameworks build the same layers).
  cfg = workload_config(spec, spec.variant("b0")[0], image_size=32)
  assert _trainable(tf_model.build(cfg)) == KERAS_APPLICATIONS_TRAINABLE["b0"]
  keras.backend.clear_session()


def test_variant_table_resolutions_and_dropout():
  sizes = [spec.variant(n)[1] for n in ("b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7")]
  assert sizes == [224, 240, 260, 300, 380, 456, 528, 600]
  assert [spec.VARIANTS[n][3] for n in ("b0", "b3", "b7")] == [0.2, 0.3, 0.5]


def test_blocks_of_b0():
  """16 blocks; drop rate 0.2 * index / 16; strides and SE width from the B0 table."""
  blocks = spec.blocks(1.0, 1.0, 0.2)
  assert [b.name for b in blocks][:4] == ["block1a", "block2a", "block2b", "block3a"]
  assert len(blocks) == 16
  np.testing.assert_allclose([b.drop_rate for b in blocks], 0.2 * np.arange(16) / 16)
  assert [b.strides for b in blocks if b.strides == 2] == [2] * 4
  assert blocks[0].se_filters == 8 and blocks[1].se_filters == 4      # 0.25 x block input
  assert blocks[2].se_filters == 6 and blocks[2].residual and not blocks[1].residual


@pytest.mark.parametrize("width,filters,expected", [
    (1.1, 32, 32),       # 35.2 -> 32 (within 10%)
    (1.8, 40, 72),       # 72
    (0.25, 16, 8),       # never below the divisor
    (1.4, 112, 160),     # 156.8 -> 160
])
def test_round_filters(width, filters, expected):
  assert spec.round_filters(filters, width) == expected


def test_stochastic_depth_drops_whole_examples_and_rescales():
  """Train mode: each example's residual branch is either dropped or scaled by 1/(1-rate)."""
  block = spec.Block("block9a", 3, 8, 8, 1, 1, 2, drop_rate=0.5)
  conv = lambda *a, **k: jax_model.nn.Conv(*a, use_bias=k.pop("use_bias", False),
                                           padding="SAME", **k)
  norm = lambda **k: jax_model.nn.BatchNorm(use_running_average=True, **k)
  module = jax_model.MBConv(block, conv, norm)
  x = np.random.default_rng(1).normal(size=(64, 4, 4, 8)).astype(np.float32)
  variables = jax.jit(module.init, static_argnames="train")(jax.random.key(0), x, train=False)
  apply = jax.jit(lambda train: module.apply(variables, x, train=train,
                                            rngs={"dropout": jax.random.key(2)}) - x,
                  static_argnums=0)
  branch, out = np.asarray(apply(False)), np.asarray(apply(True))
  kept = np.array([np.allclose(o, 2 * b, rtol=1e-5, atol=1e-5) for o, b in zip(out, branch)])
  dropped = np.array([np.allclose(o, 0, atol=1e-6) for o in out])
  assert np.all(kept | dropped) and 10 < kept.sum() < 54


def test_learning_rate_schedule_warms_up_then_decays_in_stairs():
  """lr = base * step / warmup, then base * factor ** floor(step / decay_steps) from step 0."""
  s = schedules.WarmupExponentialSchedule(base_lr=0.1, warmup_steps=2, decay_steps=3,
                                          decay_factor=0.5)
  np.testing.assert_allclose([s(n) for n in (0, 1, 2, 3, 5, 6)],
                             [0, 0.05, 0.1, 0.05, 0.05, 0.025])
  # the reference at batch 2048: 0.128, 5 warmup epochs, decay every 2.4 epochs
  ref = schedules.warmup_exponential_for(RmsPropConfig(), TrainConfig(global_batch_size=2048),
                                         spec.IMAGENET_TRAIN_EXAMPLES)
  assert ref.base_lr == pytest.approx(0.128)
  assert ref.warmup_steps == int(5 * 1281167 / 2048) and ref.decay_steps == int(2.4 * 1281167 / 2048)


def test_variant_key_sets_coefficients_and_resolution():
  cfg = spec.SPEC.configure("reference", ["model.variant=b3"])
  assert (cfg.model.width_coefficient, cfg.model.depth_coefficient, cfg.model.dropout_rate,
          cfg.data.image_size) == (1.2, 1.4, 0.3, 300)
  ref = spec.SPEC.configure("reference")
  assert (ref.model.variant, ref.data.image_size, ref.model.width_coefficient) == ("b0", 224, 1.0)
  mini = spec.SPEC.configure("mini")
  assert mini.model.width_coefficient == 0.25 and mini.data.image_size == 32
  # an image size the user sets is kept, with or without a variant (the bench sets 64)
  for overrides in (["data.image_size=64"], ["model.variant=b3", "data.image_size=64"]):
    assert spec.SPEC.configure("synthetic", overrides).data.image_size == 64


def test_unknown_variant_is_a_one_line_usage_error(cli):
  proc = cli("describe", "efficientnet", "--set", "model.variant=b9")
  assert proc.returncode == 2 and "model.variant" in proc.stderr, proc.stderr
  assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("size,kernel,stride", [(8, 3, 1), (9, 3, 2), (8, 5, 2), (7, 5, 1)])
def test_depthwise_taps_equal_the_grouped_conv(size, kernel, stride):
  """The taps (the depthwise convs XLA compiles for a CPU) compute the frameworks' own grouped
  conv, 'SAME' padding included (odd sizes at stride 2 pad one more pixel after), forward and
  gradients in JAX, forward in Keras with the same kernel; float64, so only rounding differs."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, size, size + 1, 6))
  w = rng.standard_normal((kernel, kernel, 1, 6))
  with jax.enable_x64(True):
    def native(x, w):
      return jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME", feature_group_count=6,
                                          dimension_numbers=("NHWC", "HWIO", "NHWC"))
    taps = lambda x, w: jax_model.depthwise_as_taps(x, w, stride)
    np.testing.assert_allclose(taps(x, w), native(x, w), rtol=1e-12, atol=1e-12)
    grads = [jax.grad(lambda x, w: (f(x, w) ** 2).sum(), argnums=(0, 1))(x, w)
             for f in (taps, native)]
    for got, want in zip(*grads):
      np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
  layers = [cls(kernel, stride, padding="same", use_bias=False, dtype="float64")
            for cls in (tf_model.DepthwiseConv2DTaps, keras.layers.DepthwiseConv2D)]
  outputs = []
  for layer in layers:
    layer.build(x.shape)
    layer.set_weights([w.transpose(0, 1, 3, 2)])          # Keras: [k, k, C, 1]
    outputs.append(np.asarray(layer(x)))
  np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-12, atol=1e-12)
