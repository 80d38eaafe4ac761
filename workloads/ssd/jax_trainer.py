"""SSD training and evaluation in JAX (flax + optax), behind the driver's Trainer API (the loop
and distribution: workloads/parallel/jax_trainer_base.py).

What is SSD's: the reference loss (smooth-L1 on positives plus cross entropy on positives and
3x as many hardest negatives, per image divided by its positives); torch-style SGD with weight
decay on every parameter and the warmup + step schedule; evaluation that decodes boxes and
takes each class's best candidates on device, then NMS and COCO mAP on the host (host_eval.py).
"""
import functools

import jax
import jax.numpy as jnp

from workloads.optim import jax_optimizers
from workloads.parallel import jax_batch_norm
from workloads.parallel.jax_trainer_base import apply_update
from workloads.ssd import boxes, checkpoint, host_eval, jax_model, spec


def loss_and_grads(apply_fn, params, batch_stats, batch):
  return jax_batch_norm.loss_and_grads(
      apply_fn, params, batch_stats, batch,
      lambda outputs, _: jax_model.ssd_loss(*outputs, batch["boxes"], batch["labels"]))


def train_step(state, batch, *, runtime):
  loss, grads, stats = jax_batch_norm.grouped_or_global(
      state, batch, runtime, functools.partial(loss_and_grads, state.apply_fn))
  return apply_update(state, grads, runtime, batch_stats=stats), loss


def candidates(locs, logits, dboxes, k):
  """Decoded ltrb boxes and scores of each foreground class's k best anchors: (N, C-1, k, 4),
  (N, C-1, k). The reference keeps at most 200 per class before its NMS, so this is exact."""
  xy = dboxes[:, :2] + boxes.SCALE_XY * locs[..., :2] * dboxes[:, 2:]
  wh = jnp.exp(boxes.SCALE_WH * locs[..., 2:]) * dboxes[:, 2:]
  ltrb = jnp.concatenate([xy - wh / 2, xy + wh / 2], -1)
  probs = jax.nn.softmax(logits, -1)[..., 1:].transpose(0, 2, 1)       # (N, C-1, A)
  scores, index = jax.lax.top_k(probs, k)
  picked = jnp.take_along_axis(ltrb[:, None], index[..., None], axis=2)
  return picked, scores


class SsdTrainer(jax_batch_norm.BatchNormTrainer):
  spec = spec.SPEC

  def __init__(self, cfg, ctx):
    super().__init__(cfg, ctx)
    self.model = jax_model.build(cfg, self.dtype, self.bn_axis)
    self.schedule = spec.schedule_for(cfg, self.train_examples)
    opt = cfg.optimizer
    # torch SGD: weight decay on every parameter (the reference passes all to one group)
    self.tx = jax_optimizers.sgd_momentum(
        lambda step: self.schedule(step, ops=jnp), opt.weight_decay, opt.momentum,
                                          mask=None)
    self.dboxes = boxes.default_boxes(**spec.anchor_geometry(cfg))

  def load_weights(self, state, shardings):
    """The ImageNet backbone, placed as the init was (without --data-dir, e.g. describe's
    generated data, nothing is read)."""
    if not (self.cfg.model.backbone_checkpoint and self.data_dir):
      return state
    weights = checkpoint.read(self.data_dir, self.cfg.model.backbone_checkpoint)
    variables = checkpoint.load_into_flax(
        jax.device_get({"params": state.params, "batch_stats": state.batch_stats}), weights)
    return state.replace(
        params=jax.device_put(variables["params"], shardings.params),
        batch_stats=jax.device_put(variables["batch_stats"], shardings.batch_stats))

  def train_step_fn(self, remat=None):
    del remat                                        # SSD does not pipeline
    return functools.partial(train_step, runtime=self.runtime)

  def eval_step(self, state, batch):
    locs, logits = state.apply_fn({"params": state.params, "batch_stats": state.batch_stats},
                                  batch["image"], train=False)
    k = min(host_eval.MAX_CANDIDATES, locs.shape[1])
    picked, scores = candidates(locs, logits, jnp.asarray(self.dboxes), k)
    return {"boxes": picked, "scores": scores, "image_id": batch["image_id"],
            "image_size": batch["image_size"], "mask": batch["mask"]}


make_trainer = SsdTrainer        # WorkloadSpec.trainer_modules: (cfg, ctx) -> the trainer
