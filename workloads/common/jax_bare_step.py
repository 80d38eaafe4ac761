"""What the workloads' bare steps (workloads/<w>/bare_step.py, timed by bench/gpu_models.py)
share: the image batch and an image classifier's builder. A bare step is a workload's model and
loss with plain optax on one synthetic batch, outside the harness: the peer bench/gpu_harness.py
measures the harness's own synthetic run against. JAX only (no TensorFlow: the GPU image has
none).

A workload's bare_step.py has:
  GPU_BATCH    the per-device batch that fits an 80 GB GPU in bf16 without rematerialisation;
  ANCHOR       Anchor: the MFU goal, the public figure's MFU per GPU and its source;
  build(batch, dtype, rng, shapes) -> a dict:
    spec, cfg    the workload's spec module and the config (spec.SPEC.configure(*shapes));
    init(key)    -> variables ({'params': ..., 'batch_stats': ...} for batch-norm models);
    loss(params, batch_stats or None, batch, dropout_key) -> (loss, new batch_stats or None);
    batch        numpy arrays of spec.batch_layout's shapes and dtypes (as input_pipeline's
                 synthetic_batch makes them);
    tx           the optax optimizer;  shapes: a one-line description of the inputs.
"""
import dataclasses

import jax.numpy as jnp
import numpy as np
import optax


@dataclasses.dataclass(frozen=True)
class Anchor:
  """A public per-GPU figure the harness's MFU is read against (bench/gpu_harness.py)."""
  mfu_goal: float
  mfu: float
  source: str


def images(rng, batch, size):
  return rng.standard_normal((batch, size, size, 3), dtype=np.float32)


def classifier(spec, cfg, model, batch, rng, shapes, dropout):
  """An image classifier's builder dict: top-1's label-smoothed cross entropy, SGD."""
  from workloads.common import jax_top1  # pylint: disable=import-outside-toplevel
  m, size = cfg.model, cfg.data.image_size
  smoothing = cfg.optimizer.label_smoothing

  def loss(params, batch_stats, b, key):
    rngs = {"dropout": key} if dropout else {}
    logits, updates = model.apply({"params": params, "batch_stats": batch_stats}, b["image"],
                                  train=True, mutable=["batch_stats"], rngs=rngs)
    return (jax_top1.cross_entropy(logits, b["label"], m.num_classes, smoothing),
            updates["batch_stats"])

  data = {"image": images(rng, batch, size),
          "label": rng.integers(0, m.num_classes, (batch,)).astype(np.int32)}
  return dict(spec=spec, cfg=cfg,
              init=lambda key: model.init(key, jnp.zeros((1, size, size, 3)), train=False),
              loss=loss, batch=data, tx=optax.sgd(1e-3, momentum=0.9),
              shapes=f"{shapes}image {batch}x{size}x{size}x3 f32, label {batch} i32")
