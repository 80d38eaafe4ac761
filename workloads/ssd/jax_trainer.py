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
from flax.training import train_state

from workloads.optim import jax_optimizers
from workloads.parallel.jax_trainer_base import MeshTrainer, apply_update
from workloads.ssd import boxes, checkpoint, host_eval, jax_model, spec


class TrainState(train_state.TrainState):
  batch_stats: dict


def loss_and_grads(apply_fn, params, batch_stats, batch):
  def loss_fn(p):
    (locs, logits), updates = apply_fn({"params": p, "batch_stats": batch_stats},
                                       batch["image"], train=True, mutable=["batch_stats"])
    return jax_model.ssd_loss(locs, logits, batch["boxes"], batch["labels"]), updates
  (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  return loss, grads, updates["batch_stats"]


def train_step(state, batch, *, runtime):
  if runtime.grouped_bn:                             # per device, BN pooled over groups
    step = runtime.grouped_bn_step(functools.partial(loss_and_grads, state.apply_fn))
    loss, grads, stats = step(state.params, state.batch_stats, batch)
  else:
    loss, grads, stats = loss_and_grads(state.apply_fn, state.params, state.batch_stats, batch)
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


class SsdTrainer(MeshTrainer):
  spec = spec.SPEC

  def __init__(self, cfg, ctx):
    super().__init__(cfg, ctx)
    self.model = jax_model.build(cfg, self.dtype, "bn" if self.runtime.grouped_bn else None)
    self.schedule = spec.schedule_for(cfg, self.train_examples)
    opt = cfg.optimizer
    # torch SGD: weight decay on every parameter (the reference passes all to one group)
    self.tx = jax_optimizers.sgd_momentum(
        lambda step: self.schedule(step, ops=jnp), opt.weight_decay, opt.momentum,
                                          mask=None)
    self.dboxes = boxes.default_boxes(**spec.anchor_geometry(cfg))

  def create_state(self, rng):
    size = self.cfg.data.image_size
    variables = self.model.init(rng, jnp.zeros((1, size, size, 3)), train=False)
    return TrainState.create(apply_fn=self.model.apply, params=variables["params"], tx=self.tx,
                             batch_stats=variables["batch_stats"])

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


def make_trainer(cfg, ctx):
  return SsdTrainer(cfg, ctx)
