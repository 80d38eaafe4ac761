"""The SSD mini set: generated images of filled shapes (no download), learnable in minutes.

Each image is a random dark background colour with Gaussian pixel noise and
1..mini_max_objects shapes of 4 classes -- a red rectangle, a green ellipse, a blue triangle
(apex up), a yellow plus, each colour varied by up to +-24 per channel -- box sides 12-40 px at
64 px (scaled with the image size). Boxes never touch, so no shape hides part of another and
every box is the tight box of its shape's drawn pixels. Form and colour both tell the class, so
a small model learns it in a few epochs and the run's time goes to what SSD is about: placing
boxes (mAP over IoU 0.50..0.95 rewards tight ones).

Elements have the structure tensorflow-datasets' coco/2017 yields (decoded): image uint8
(H,W,3), image/id int64, image/filename, objects {id int64, area int64, bbox float32 (n,4)
normalised (ymin, xmin, ymax, xmax), label int64 0-based, is_crowd bool}, so the mini and the
COCO sets go through one preprocessing. Deterministic in data.mini_seed; train and eval are
different random streams.
"""
import dataclasses
import os

import numpy as np
from workloads.common.host_tf import tf

from workloads.common import mini_cache

CLASSES = ("rectangle", "ellipse", "triangle", "plus")
PALETTE = np.array([(220, 40, 40), (40, 200, 40), (50, 80, 235), (230, 210, 40)])
FORMAT_VERSION = 2
PLACEMENT_TRIES = 16        # candidate positions per shape; a shape with no free spot is dropped


def _fields(data_cfg) -> dict:
  """What the generated set depends on (its cache key)."""
  fields = {k: v for k, v in dataclasses.asdict(data_cfg).items()
            if k.startswith("mini_") or k in ("image_size", "train_examples", "eval_examples")}
  return {**fields, "version": FORMAT_VERSION}


def _shape_masks(cls, y0, x0, h, w, size):
  """(N,S,S) pixels of each image's shape of class cls in its box (rows y0..y0+h-1 and columns
  x0..x0+w-1), tested at pixel centres."""
  yy = np.arange(size, dtype=np.float32)[None, :, None] + 0.5
  xx = np.arange(size, dtype=np.float32)[None, None, :] + 0.5
  y0, x0, h, w, cls = (a[:, None, None] for a in (y0, x0, h, w, cls))
  u = (xx - x0) / w          # 0..1 across the box
  v = (yy - y0) / h          # 0..1 down the box
  inside = (u >= 0) & (u <= 1) & (v >= 0) & (v <= 1)
  ellipse = (2 * u - 1) ** 2 + (2 * v - 1) ** 2 <= 1
  triangle = np.abs(2 * u - 1) <= v            # apex at the top centre, base at the bottom
  plus = (np.abs(2 * u - 1) <= 1 / 3) | (np.abs(2 * v - 1) <= 1 / 3)
  return inside & np.select([cls == 0, cls == 1, cls == 2], [True, ellipse, triangle], plus)


def generate(data_cfg, split) -> dict:
  """numpy arrays of the train or eval set: image uint8 (N,S,S,3); per object slot (K of
  them, the present ones first): bbox float32 (N,K,4) (ymin, xmin, ymax, xmax), label int64
  (N,K) (-1: none), area int64 (N,K); count int32 (N,); image_id int64 (N,)."""
  size, k = data_cfg.image_size, data_cfg.mini_max_objects
  n = data_cfg.train_examples if split == "train" else data_cfg.eval_examples
  rng = np.random.default_rng([data_cfg.mini_seed, 0 if split == "train" else 1])
  lo = max(2, round(12 * size / 64))
  hi = max(lo, min(size, round(40 * size / 64)))

  background = rng.integers(0, 100, (n, 3))
  images = np.broadcast_to(background[:, None, None, :], (n, size, size, 3)).astype(np.float32)
  wanted = rng.integers(1, k + 1, n)
  placed = np.zeros((n, 0, 4), np.int64)        # y0, x0, y1, x1 (exclusive) of earlier slots
  present = np.zeros((n, k), bool)
  bbox = np.zeros((n, k, 4), np.float32)
  label = np.full((n, k), -1, np.int64)
  area = np.zeros((n, k), np.int64)
  for slot in range(k):
    # PLACEMENT_TRIES candidates per image at once; the first that keeps a 1 px gap to every
    # earlier box wins (the first shape always fits).
    h = rng.integers(lo, hi + 1, (n, PLACEMENT_TRIES))
    w = rng.integers(lo, hi + 1, (n, PLACEMENT_TRIES))
    y0 = rng.integers(0, size - h + 1)
    x0 = rng.integers(0, size - w + 1)
    cand = np.stack([y0, x0, y0 + h, x0 + w], -1)[:, :, None, :]           # (N,T,1,4)
    prev = placed[:, None, :, :]                                           # (N,1,slot,4)
    apart = ((cand[..., 2] < prev[..., 0]) | (prev[..., 2] < cand[..., 0]) |
             (cand[..., 3] < prev[..., 1]) | (prev[..., 3] < cand[..., 1])).all(-1)   # (N,T)
    first = apart.argmax(1)
    ok = apart[np.arange(n), first] & (slot < wanted)
    box = cand[np.arange(n), first, 0]                                     # (N,4)
    cls = rng.integers(0, len(CLASSES), n)
    colour = np.clip(PALETTE[cls] + rng.integers(-24, 25, (n, 3)), 0, 255)
    mask = _shape_masks(cls, box[:, 0], box[:, 1], box[:, 2] - box[:, 0],
                        box[:, 3] - box[:, 1], size) & ok[:, None, None]
    images = np.where(mask[..., None], colour[:, None, None, :].astype(np.float32), images)
    # The tight box of the drawn pixels, in pixel edges (so it encloses them exactly).
    rows, cols = mask.any(2), mask.any(1)
    ymin, xmin = rows.argmax(1), cols.argmax(1)
    ymax, xmax = size - rows[:, ::-1].argmax(1), size - cols[:, ::-1].argmax(1)
    bbox[:, slot] = np.where(ok[:, None], np.stack([ymin, xmin, ymax, xmax], -1) / size, 0)
    present[:, slot], label[:, slot] = ok, np.where(ok, cls, -1)
    area[:, slot] = mask.sum((1, 2))
    placed = np.concatenate([placed, np.where(ok[:, None], box, -10 * size)[:, None]], 1)

  images += rng.normal(scale=data_cfg.mini_pixel_noise, size=images.shape)
  order = np.argsort(~present, axis=1, kind="stable")    # present slots first
  take = lambda a: np.take_along_axis(a, order.reshape(order.shape + (1,) * (a.ndim - 2)), 1)
  return {"image": np.clip(np.rint(images), 0, 255).astype(np.uint8),
          "bbox": take(bbox), "label": take(label), "area": take(area),
          "count": present.sum(1).astype(np.int32),
          "image_id": np.arange(1, n + 1, dtype=np.int64)}


def prepare(data_cfg, root=None) -> str:
  """The folder holding train.npz and eval.npz, generated once under `root` (default
  ~/.cache/mlperf-tf-jax/ssd_mini) keyed by the generator's settings."""
  def write(staging):
    for split in ("train", "eval"):
      np.savez(os.path.join(staging, f"{split}.npz"), **generate(data_cfg, split))
    return {"train_examples": data_cfg.train_examples, "eval_examples": data_cfg.eval_examples}
  folder, _ = mini_cache.prepare(root or mini_cache.default_root("ssd"), _fields(data_cfg), write)
  return folder


def load(folder, split) -> dict:
  with np.load(os.path.join(folder, f"{split}.npz")) as f:
    return dict(f)


def dataset(arrays) -> "tf.data.Dataset":
  """The set as tfds coco/2017 elements (decoded image), in image_id order."""
  slots = arrays["label"].shape[1]

  def element(ex):
    n = ex["count"]
    return {"image": ex["image"], "image/id": ex["image_id"],
            "image/filename": tf.strings.as_string(ex["image_id"], width=12, fill="0") + ".png",
            "objects": {"id": ex["image_id"] * slots + tf.range(n, dtype=tf.int64),
                        "area": ex["area"][:n], "bbox": ex["bbox"][:n],
                        "label": ex["label"][:n], "is_crowd": tf.zeros([n], tf.bool)}}
  return tf.data.Dataset.from_tensor_slices(arrays).map(element)


def records(arrays) -> list[dict]:
  """Ground-truth records for COCO evaluation (coco.ground_truth_from_records' input)."""
  size = arrays["image"].shape[1]
  return [{"image_id": int(i), "height": size, "width": size, "boxes": b[:c], "labels": l[:c],
           "is_crowd": np.zeros(c, bool), "areas": a[:c]}
          for i, b, l, a, c in zip(arrays["image_id"], arrays["bbox"], arrays["label"],
                                   arrays["area"], arrays["count"])]
