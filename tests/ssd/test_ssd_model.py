"""SSD300-ResNet34's size and layout (both frameworks), and TF <-> JAX parity in float64 (see
tests/resnet/test_resnet_parity.py for why float64 and 1e-9): with the flax weights copied into
the Keras model, the same head outputs in eval and train mode, the same loss (hard-negative
mining included, both against a numpy transcription of the reference loss), gradients and two
SGD steps; the ImageNet backbone checkpoint loads identically into both."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import rel_err
from workloads.optim import jax_optimizers, tf_optimizers
from workloads.parallel import tf_layers
from workloads.ssd import checkpoint, jax_model, jax_trainer, spec, tf_model, tf_trainer

TOL = 1e-9


def conv_params(c_in, c_out, k, bias):
  return k * k * c_in * c_out + (c_out if bias else 0)


def test_reference_parameter_count_derivation():
  """19,972,534 = ResNet-34 through layer3 + five extra layers + the six maps' heads, counted
  from the reference's layer list (torchvision resnet34, ssd300.py), not from either model."""
  bn = lambda c: 2 * c
  basic = lambda c_in, c, project: (conv_params(c_in, c, 3, False) + bn(c) + conv_params(c, c, 3, False)
                                    + bn(c) + (conv_params(c_in, c, 1, False) + bn(c) if project else 0))
  backbone = conv_params(3, 64, 7, False) + bn(64)
  backbone += 3 * basic(64, 64, False)
  backbone += basic(64, 128, True) + 3 * basic(128, 128, False)
  backbone += basic(128, 256, True) + 5 * basic(256, 256, False)
  extras = sum(conv_params(c_in, mid, 1, True) + conv_params(mid, out, 3, True) for c_in, mid, out in
               ((256, 256, 512), (512, 256, 512), (512, 128, 256), (256, 128, 256), (256, 128, 256)))
  heads = sum(conv_params(c, k * 4, 3, True) + conv_params(c, k * 81, 3, True) for c, k in
              zip((256, 512, 512, 256, 256, 256), (4, 6, 6, 6, 4, 4)))
  assert (backbone, extras, heads) == (8_170_304, 3_574_400, 8_227_830)
  assert backbone + extras + heads == 19_972_534

  cfg = spec.SPEC.configure("reference")
  flax_model = jax_model.build(cfg)
  shapes = jax.eval_shape(lambda: flax_model.init(jax.random.key(0), jnp.zeros((1, 300, 300, 3)),
                                                  train=False))["params"]
  count = lambda tree: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))
  assert count(shapes) == 19_972_534
  assert count({k: v for k, v in shapes.items() if checkpoint.is_backbone((k,))}) == backbone
  assert count({k: v for k, v in shapes.items() if k.startswith("extra")}) == extras
  keras_model = tf_model.build(cfg)
  assert sum(int(np.prod(v.shape)) for v in keras_model.trainable_variables) == 19_972_534
  assert [tuple(o.shape[1:]) for o in keras_model.outputs] == [(8732, 4), (8732, 81)]
  assert spec.feature_maps(cfg) == [(38, 256), (19, 512), (10, 512), (5, 256), (3, 256), (1, 256)]


def test_head_layout_is_the_reference_view_of_nchw():
  """Anchor a = (anchor k, row, column), coordinate = channel // k: torch's view(N, 4, -1) of
  the NCHW head output, which is the order of boxes.default_boxes."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 3, 5, 4 * 6)).astype(np.float32)
  nchw = x.transpose(0, 3, 1, 2).reshape(2, 4, -1)          # (N, 4, 6 * 3 * 5), as torch
  want = nchw.transpose(0, 2, 1)
  np.testing.assert_array_equal(np.asarray(jax_model._by_anchor(jnp.asarray(x), 4, 6)), want)


def test_hardest_negatives_are_the_first_k_of_a_stable_descending_sort():
  """Both frameworks' `hardest` select, per row, what ranking by a stable descending sort and
  keeping ranks below k does (the reference's sort, then its first k), on rows full of ties
  (values on a coarse grid, a run of zeros as the positives leave), for every k from 0 to A."""
  rng = np.random.default_rng(3)
  values = np.round(rng.exponential(1.0, (6, 40)), 1).astype(np.float32)
  values[:, ::5] = 0.0
  values[5] = 0.7                                        # one row all tied
  for k in range(0, 41):
    ks = np.full(6, k, np.int32)
    ks[0] = 40 - k                                       # rows with other k's alongside
    want = np.zeros(values.shape, bool)
    for row, (v, n) in enumerate(zip(values, ks)):
      want[row, np.argsort(-v, kind="stable")[:n]] = True
    np.testing.assert_array_equal(np.asarray(jax_model.hardest(jnp.asarray(values), ks)),
                                  want, err_msg=f"jax k={k}")
    np.testing.assert_array_equal(tf_trainer.hardest(tf.constant(values), tf.constant(ks)),
                                  want, err_msg=f"tf k={k}")


# ----------------------------------------------------------------------------- parity

def numpy_loss(locs, logits, gt, labels):
  """The reference Loss.forward (ssd-v1 base_model.py), one image at a time."""
  total = []
  for l, z, g, y in zip(locs, logits, gt, labels):
    pos = y > 0
    d = np.abs(l - g)
    sl1 = np.where(d < 1, 0.5 * d * d, d - 0.5).sum(1)[pos].sum()
    z = z - z.max(1, keepdims=True)
    con = np.log(np.exp(z).sum(1)) - z[np.arange(len(y)), y]
    neg_candidates = np.where(pos, 0.0, con)
    order = np.argsort(-neg_candidates, kind="stable")
    neg = np.zeros_like(pos)
    neg[order[:min(3 * pos.sum(), len(y))]] = True
    closs = (con * (pos | neg)).sum()
    total.append((sl1 + closs) / pos.sum() if pos.sum() else 0.0)
  return np.mean(total)


@pytest.fixture(scope="module")
def models():
  with jax.enable_x64(True):
    cfg = spec.SPEC.configure("tiny")
    flax_model = jax_model.build(cfg, jnp.float64)
    variables = jax.jit(flax_model.init, static_argnames="train")(
        jax.random.key(0), jnp.zeros((1, 64, 64, 3)), train=False)
    rng = np.random.default_rng(0)
    variables = jax.tree_util.tree_map_with_path(
        lambda path, v: (rng.uniform(0.5, 1.5, v.shape) if path[-1].key == "var" else
                         np.asarray(v, np.float64) + rng.normal(0, 0.05, v.shape)), variables)
    anchors = spec.num_anchors(cfg)
    labels = np.where(rng.random((4, anchors)) < 0.05, rng.integers(1, 5, (4, anchors)), 0)
    labels[3] = 0                                            # an image without positives
    batch = {"image": rng.normal(size=(4, 64, 64, 3)), "boxes": rng.normal(size=(4, anchors, 4)),
             "labels": labels.astype(np.int32)}
    keras_model = tf_model.build(cfg, "float64")
    tf_layers.load_flax_variables(keras_model, variables)
    yield cfg, flax_model, variables, batch, keras_model


def test_outputs_and_loss_agree(models):
  cfg, flax_model, variables, batch, keras_model = models
  with jax.enable_x64(True):
    apply = jax.jit(flax_model.apply, static_argnames=("train", "mutable"))
    for train in (False, True):
      out = apply(variables, batch["image"], train=train, mutable=("batch_stats",))[0]
      tf_out = keras_model(batch["image"], training=train)
      for a, b in zip(tf_out, out):
        assert rel_err(a, b) < TOL
    locs, logits = out
    want = numpy_loss(np.asarray(locs), np.asarray(logits), batch["boxes"], batch["labels"])
    jax_loss = jax_model.ssd_loss(locs, logits, batch["boxes"], batch["labels"])
    tf_loss = tf_trainer.ssd_loss_sum(*tf_out, batch["boxes"], batch["labels"]) / 4
    assert abs(float(jax_loss) - want) < TOL * want and abs(float(tf_loss) - want) < TOL * want


def test_gradients_and_two_sgd_steps_agree(models):
  cfg, flax_model, variables, batch, keras_model = models
  with jax.enable_x64(True):
    schedule = spec.schedule_for(cfg, 64)
    tx = jax_optimizers.sgd_momentum(lambda t: schedule(t, ops=jnp), 5e-4, 0.9, mask=None)
    params, stats = variables["params"], variables["batch_stats"]
    opt_state = tx.init(params)
    grad_fn = jax.jit(lambda p, s: jax_trainer.loss_and_grads(flax_model.apply, p, s, batch))
    optimizer = tf_optimizers.MLPerfMomentum(tf_optimizers.KerasSchedule(schedule, "float64"),
                                             decay=5e-4, momentum=0.9, lars=False)
    optimizer.build(keras_model.trainable_variables)
    paths = {id(v): p for p, v in tf_layers.params_by_path(keras_model).items()}
    assert len(paths) == len(keras_model.trainable_variables) == len(jax.tree.leaves(params))
    for step in range(2):
      loss, grads, stats = grad_fn(params, stats)
      with tf.GradientTape() as tape:
        tf_loss = tf_trainer.ssd_loss_sum(*keras_model(batch["image"], training=True),
                                          batch["boxes"], batch["labels"]) / 4
      tf_grads = tape.gradient(tf_loss, keras_model.trainable_variables)
      assert abs(float(tf_loss) - float(loss)) < TOL * float(loss)
      flat = lambda tree: np.concatenate([np.ravel(_get(tree, paths[id(v)]))
                                          for v in keras_model.trainable_variables])
      assert rel_err(np.concatenate([np.ravel(g) for g in tf_grads]), flat(grads)) < TOL
      updates, opt_state = tx.update(grads, opt_state, params)
      params = jax.tree.map(lambda p, u: p + u, params, updates)
      optimizer.apply(tf_grads, keras_model.trainable_variables)
      assert rel_err(np.concatenate([np.ravel(v.numpy()) for v in keras_model.trainable_variables]),
                     flat(params)) < TOL


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def test_backbone_checkpoint_loads_the_same_into_both(models, tmp_path):
  """A torchvision-named archive (OIHW kernels, running statistics) sets every backbone layer
  of both models and leaves the extra layers and heads as they were."""
  cfg, flax_model, variables, batch, keras_model = models
  rng = np.random.default_rng(1)
  weights = {}
  for path, module in checkpoint._modules(checkpoint._copy(variables["params"])):
    if checkpoint.is_backbone(path):
      key = checkpoint.torch_name(path)
      if "kernel" in module:
        h, w, i, o = module["kernel"].shape
        weights[key + ".weight"] = rng.normal(0, 0.1, (o, i, h, w))
      else:
        c = module["scale"].shape[0]
        for name in ("weight", "bias", "running_mean"):
          weights[f"{key}.{name}"] = rng.normal(0, 0.2, c)
        weights[f"{key}.running_var"] = rng.uniform(0.5, 1.5, c)
  weights["fc.weight"] = np.zeros((10, 512))                   # ignored
  np.savez(tmp_path / "backbone.npz", **weights)
  loaded = checkpoint.read(str(tmp_path), "backbone.npz")
  tf_layers.load_flax_variables(keras_model, variables)        # undo earlier tests' steps
  with jax.enable_x64(True):
    new = checkpoint.load_into_flax(variables, loaded)
    np.testing.assert_array_equal(new["params"]["layer2_0"]["downsample_conv"]["kernel"],
                                  weights["layer2.0.downsample.0.weight"].transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(new["batch_stats"]["bn1"]["var"], weights["bn1.running_var"])
    np.testing.assert_array_equal(new["params"]["conf0"]["kernel"],
                                  variables["params"]["conf0"]["kernel"])
    checkpoint.load_into_keras(keras_model, loaded)
    try:
      a = jax.jit(flax_model.apply, static_argnames="train")(new, batch["image"], train=False)
      b = keras_model(batch["image"], training=False)
      assert all(rel_err(x, y) < TOL for x, y in zip(b, a))
    finally:
      tf_layers.load_flax_variables(keras_model, variables)
  del weights["layer1.0.bn2.running_mean"]
  with pytest.raises(ValueError, match="layer1.0.bn2.running_mean"):
    checkpoint.load_into_flax(variables, weights)
