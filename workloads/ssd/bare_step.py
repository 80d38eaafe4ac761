"""SSD300-ResNet34's bare step (workloads/common/jax_bare_step.py): 300x300x3 images, 8,732
anchors, 81 classes, SGD with momentum."""
import jax.numpy as jnp
import numpy as np
import optax

from workloads.common.jax_bare_step import Anchor, images

GPU_BATCH = 64
ANCHOR = Anchor(0.40, 0.45, "MLPerf v1.1 8x A100, MXNet")


def build(batch, dtype, rng, shapes):
  from workloads.ssd import jax_model, spec  # pylint: disable=import-outside-toplevel
  cfg = spec.SPEC.configure(*shapes)
  model = jax_model.build(cfg, dtype)
  size, anchors, classes = cfg.data.image_size, spec.num_anchors(cfg), cfg.model.num_classes

  def loss(params, batch_stats, b, key):
    del key
    (locs, logits), updates = model.apply({"params": params, "batch_stats": batch_stats},
                                          b["image"], train=True, mutable=["batch_stats"])
    return jax_model.ssd_loss(locs, logits, b["boxes"], b["labels"]), updates["batch_stats"]

  # ssd input_pipeline.synthetic_batch: ~1% positive anchors with random classes
  positive = rng.random((batch, anchors)) < 0.01
  labels = np.where(positive, rng.integers(1, classes, (batch, anchors)), 0).astype(np.int32)
  data = {"image": images(rng, batch, size),
          "boxes": rng.standard_normal((batch, anchors, 4), dtype=np.float32),
          "labels": labels}
  return dict(spec=spec, cfg=cfg,
              init=lambda key: model.init(key, jnp.zeros((1, size, size, 3)), train=False),
              loss=loss, batch=data, tx=optax.sgd(1e-3, momentum=0.9),
              shapes=f"image {batch}x{size}x{size}x3 f32, {anchors} anchors x {classes} classes")
