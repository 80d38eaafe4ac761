"""SSD's default boxes (anchors), target assignment, box coding and NMS, as the MLPerf reference
does them (mlcommons/training retired_benchmarks/ssd-v1/ssd/utils.py: DefaultBoxes, Encoder,
calc_iou_tensor; base_model.py Loss._loc_vec; train.py dboxes300_coco, coco_eval).

Framework-neutral numpy, plus `assign_targets`, the same match + encode in TensorFlow ops for
the tf.data input pipeline. No JAX here: the TF trainer's input pipeline imports this module.

Formats: xywh = (centre x, centre y, width, height); ltrb = (left, top, right, bottom); all
coordinates are fractions of the image side (the reference's dboxes are normalised, and its
COCODetection.__getitem__ divides the annotations by the image's width and height).

Where the reference differs from what one might expect (kept as the reference has it):
  * The clipping to [0, 1] is on the (cx, cy, w, h) anchors, not on their corners
    (DefaultBoxes.__init__: `self.dboxes.clamp_(min=0, max=1)` before the ltrb conversion):
    the 1x1 map's 2:1 boxes get width 1 (not 1.23), level 2's last column centre becomes 1
    (9.5 / 9.375 > 1), and anchors' ltrb corners can still lie outside [0, 1].
  * The matcher's best IoU is kept by `> criteria` (strictly), NMS keeps `iou < criteria`
    (suppresses IoU >= criteria), the score filter is `score > threshold`.
  * The eval NMS threshold is 0.5 (train.py coco_eval passes overlap_threshold=0.50),
    not decode_batch's default 0.45.
"""
import math

import numpy as np

SCALE_XY, SCALE_WH = 0.1, 0.2     # the reference's box-coding variances (dboxes300_coco)

# ----------------------------------------------------------------------------- anchors


def default_boxes(fig_size, feat_size, steps, scales, aspect_ratios) -> np.ndarray:
  """The reference's default boxes, float32 (num_anchors, 4) in xywh, clipped to [0, 1].

  Order (checked against DefaultBoxes.__init__, utils.py lines 243-257): maps in order; within a map, the box sizes
  in the order [(sk1, sk1), (sk3, sk3), then per aspect ratio a: (sk1*sqrt(a), sk1/sqrt(a)),
  (sk1/sqrt(a), sk1*sqrt(a))] as the outer loop, and positions row-major (row i, column j;
  `itertools.product(range(sfeat), repeat=2)`) as the inner loop, with
  cx = (j + 0.5) / fk, cy = (i + 0.5) / fk, fk = fig_size / step (a float: 300 / 8 = 37.5).
  The models' heads order their outputs the same way (channel = value * k + anchor).
  """
  out = []
  for level, size in enumerate(feat_size):
    sk1 = scales[level] / fig_size
    sk2 = scales[level + 1] / fig_size
    sk3 = math.sqrt(sk1 * sk2)
    sizes = [(sk1, sk1), (sk3, sk3)]
    for alpha in aspect_ratios[level]:
      w, h = sk1 * math.sqrt(alpha), sk1 / math.sqrt(alpha)
      sizes += [(w, h), (h, w)]
    fk = fig_size / steps[level]
    rows, cols = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    cx = (cols.ravel() + 0.5) / fk
    cy = (rows.ravel() + 0.5) / fk
    for w, h in sizes:
      out.append(np.stack([cx, cy, np.full_like(cx, w), np.full_like(cx, h)], axis=-1))
  # The reference builds the boxes in Python floats, stores float32, then clamps.
  return np.clip(np.concatenate(out).astype(np.float32), 0.0, 1.0)


# ----------------------------------------------------------------------------- formats


def xywh_to_ltrb(b):
  b = np.asarray(b)
  return np.concatenate([b[..., :2] - 0.5 * b[..., 2:], b[..., :2] + 0.5 * b[..., 2:]], -1)


def ltrb_to_xywh(b):
  b = np.asarray(b)
  return np.concatenate([0.5 * (b[..., :2] + b[..., 2:]), b[..., 2:] - b[..., :2]], -1)


def iou(a_ltrb, b_ltrb):
  """(..., n, 4), (..., m, 4) ltrb -> (..., n, m) IoU, the reference calc_iou_tensor's
  arithmetic in the inputs' precision: intersection / (area_a + area_b - intersection)."""
  a, b = np.asarray(a_ltrb), np.asarray(b_ltrb)
  al, at, ar, ab = (a[..., :, None, k] for k in range(4))     # (..., n, 1) each
  bl, bt, br, bb = (b[..., None, :, k] for k in range(4))     # (..., 1, m) each
  inter = (np.maximum(np.minimum(ar, br) - np.maximum(al, bl), 0) *
           np.maximum(np.minimum(ab, bb) - np.maximum(at, bt), 0))
  union = (ar - al) * (ab - at) + (br - bl) * (bb - bt) - inter
  with np.errstate(invalid="ignore", divide="ignore"):   # 0/0 of two empty boxes: NaN, as torch
    return inter / union


# ----------------------------------------------------------------------------- training targets


def match(gt_ltrb, gt_labels, dboxes_xywh, criteria=0.5):
  """The reference Encoder.encode: each anchor's box (xywh) and class.

  Each anchor takes its best-IoU ground truth (the first on ties, as argmax); each ground
  truth's best anchor (the first on ties) is forced to it with IoU 2.0, so every object gets
  at least one anchor however small it is; where two objects share a best anchor the later
  one wins (the reference's `best_dbox_idx[best_bbox_idx[idx]] = idx` on CPU). Anchors whose
  IoU > criteria get the object's box and label; the rest keep their default box and label 0.
  Computed in float32 like the reference. n = 0 objects: every anchor is background (the
  reference never sees that: its crop keeps at least one box and its loader drops empty
  images).
  """
  dboxes_xywh = np.asarray(dboxes_xywh, np.float32)
  gt_ltrb = np.asarray(gt_ltrb, np.float32).reshape(-1, 4)
  gt_labels = np.asarray(gt_labels).reshape(-1)
  num_anchors, n = len(dboxes_xywh), len(gt_ltrb)
  labels = np.zeros(num_anchors, np.int32)
  if n == 0:
    return dboxes_xywh.copy(), labels
  ious = iou(gt_ltrb, xywh_to_ltrb(dboxes_xywh))            # (n, A)
  best_gt = np.argmax(ious, axis=0)                          # per anchor
  best_gt_iou = ious[best_gt, np.arange(num_anchors)]
  best_anchor = np.argmax(ious, axis=1)                      # per object
  # The last object naming an anchor as its best wins it: the largest object index there.
  forced = np.full(num_anchors, -1)
  np.maximum.at(forced, best_anchor, np.arange(n))
  is_forced = forced >= 0
  best_gt = np.where(is_forced, forced, best_gt)
  best_gt_iou = np.where(is_forced, 2.0, best_gt_iou)
  matched = best_gt_iou > criteria
  labels[matched] = gt_labels[best_gt[matched]]
  boxes = dboxes_xywh.copy()
  boxes[matched] = ltrb_to_xywh(gt_ltrb)[best_gt[matched]]
  return boxes, labels


def encode(boxes_xywh, dboxes_xywh, scale_xy=SCALE_XY, scale_wh=SCALE_WH):
  """The regression target the reference loss builds from the matched boxes (Loss._loc_vec):
  ((cx - dcx) / dw / scale_xy, (cy - dcy) / dh / scale_xy, log(w / dw) / scale_wh, ...)."""
  b, d = np.asarray(boxes_xywh), np.asarray(dboxes_xywh)
  xy = (1.0 / scale_xy) * (b[..., :2] - d[..., :2]) / d[..., 2:]
  with np.errstate(divide="ignore"):    # a zero-width object: -inf, as the reference
    wh = (1.0 / scale_wh) * np.log(b[..., 2:] / d[..., 2:])
  return np.concatenate([xy, wh], -1)


def decode(offsets, dboxes_xywh, scale_xy=SCALE_XY, scale_wh=SCALE_WH):
  """The reference Encoder.scale_back_batch's boxes: offsets (..., A, 4) -> ltrb (..., A, 4)."""
  o, d = np.asarray(offsets), np.asarray(dboxes_xywh)
  xy = o[..., :2] * scale_xy * d[..., 2:] + d[..., :2]
  wh = np.exp(o[..., 2:] * scale_wh) * d[..., 2:]
  return np.concatenate([xy - 0.5 * wh, xy + 0.5 * wh], -1)


def assign_targets(gt_ltrb, gt_labels, dboxes_xywh, criteria=0.5, scale_xy=SCALE_XY, scale_wh=SCALE_WH):
  """`match` then `encode` in TensorFlow ops, for tf.data `map` (graph mode): no Python
  branching on tensor values, any number of objects (0 included, a dynamic first dimension).
  Returns (offsets float32 (A, 4), labels int32 (A,)).

  Deterministic choices where TF's ops leave them open: first-max indices are computed
  explicitly (tf.argmax does not promise which index wins a tie), and "the later object
  wins a shared best anchor" is a segment max over object indices (a scatter with repeated
  indices has no defined order).
  """
  import tensorflow as tf    # pylint: disable=import-outside-toplevel

  dboxes_np = np.asarray(dboxes_xywh, np.float32)
  num_anchors = len(dboxes_np)
  dboxes = tf.constant(dboxes_np)
  anchors_ltrb = tf.constant(xywh_to_ltrb(dboxes_np))
  gt = tf.reshape(tf.cast(gt_ltrb, tf.float32), [-1, 4])
  labels_in = tf.reshape(tf.cast(gt_labels, tf.int32), [-1])
  n = tf.shape(gt)[0]

  ious = _tf_iou(gt, anchors_ltrb)                                          # (n, A)
  # A dummy last object with IoU -1 everywhere keeps the per-anchor reduction non-empty
  # when n = 0; it never wins otherwise (real IoUs are >= 0) and never passes `> criteria`.
  padded = tf.concat([ious, -tf.ones([1, num_anchors])], axis=0)           # (n + 1, A)
  best_gt = _first_argmax(padded, axis=0)                                   # (A,)
  best_gt_iou = tf.reduce_max(padded, axis=0)
  best_anchor = _first_argmax(ious, axis=1)                                 # (n,)
  # Per anchor, the largest index of the objects whose best anchor it is (int32 min if none).
  forced = tf.math.unsorted_segment_max(tf.range(n), best_anchor, num_anchors)
  is_forced = forced >= 0
  best_gt = tf.where(is_forced, forced, best_gt)
  best_gt_iou = tf.where(is_forced, 2.0, best_gt_iou)
  matched = best_gt_iou > criteria

  gt_xywh = tf.concat([0.5 * (gt[:, :2] + gt[:, 2:]), gt[:, 2:] - gt[:, :2]], axis=1)
  gt_xywh = tf.concat([gt_xywh, tf.ones([1, 4])], axis=0)     # the dummy's box (never used)
  labels_in = tf.concat([labels_in, tf.zeros([1], tf.int32)], axis=0)
  boxes = tf.where(matched[:, None], tf.gather(gt_xywh, best_gt), dboxes)
  labels = tf.where(matched, tf.gather(labels_in, best_gt), 0)

  xy = (1.0 / scale_xy) * (boxes[:, :2] - dboxes[:, :2]) / dboxes[:, 2:]
  wh = (1.0 / scale_wh) * tf.math.log(boxes[:, 2:] / dboxes[:, 2:])
  return tf.concat([xy, wh], axis=1), labels


def _tf_iou(a, b):
  """`iou` in TF: the same float32 arithmetic, (n, 4), (m, 4) -> (n, m)."""
  import tensorflow as tf    # pylint: disable=import-outside-toplevel
  a, b = a[:, None, :], b[None, :, :]
  wh = tf.maximum(tf.minimum(a[..., 2:], b[..., 2:]) - tf.maximum(a[..., :2], b[..., :2]), 0.0)
  inter = wh[..., 0] * wh[..., 1]
  area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
  area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
  return inter / (area_a + area_b - inter)


def _first_argmax(x, axis):
  """The smallest index holding the maximum along `axis` (numpy's and torch's tie rule)."""
  import tensorflow as tf    # pylint: disable=import-outside-toplevel
  top = tf.reduce_max(x, axis=axis, keepdims=True)
  size = tf.shape(x)[axis]
  index = tf.range(size)
  index = index[:, None] if axis == 0 else index[None, :]
  return tf.reduce_min(tf.where(tf.equal(x, top), index, size), axis=axis)


# ----------------------------------------------------------------------------- detection


def nms(boxes_ltrb, scores, score_threshold=0.05, iou_threshold=0.5, max_candidates=200,
        max_output=200):
  """The reference Encoder.decode_single on one image: boxes (A, 4) ltrb, scores (A, C)
  class probabilities (class 0, background, is skipped).

  Per class: scores > score_threshold; the max_candidates highest; greedy NMS that keeps
  the highest remaining box and drops every remaining box with IoU >= iou_threshold with it
  (the reference keeps `iou_sorted < criteria`; a 0/0 IoU is NaN and so dropped too). Then
  the max_output highest scores over all classes. Returns (boxes (k, 4), scores (k,), labels
  (k,) int32), highest score first (the reference returns them lowest first; COCO's
  evaluation sorts them itself). Equal scores (the reference's torch sort leaves ties
  unspecified): the lower class first, then inside a class the lower anchor index, a rule
  `nms_candidates` can follow with no anchor indices (a class's candidates are in anchor order
  among equal scores), so the two keep the same set when ties straddle max_output. No detections: empty arrays (the reference's
  torch.cat raises there and coco_eval skips the whole batch).

  Every class at once: candidates padded to (classes, max_candidates), and the greedy pass a
  loop over candidate ranks (at most max_candidates steps), not over classes or boxes.
  """
  boxes_ltrb, scores = np.asarray(boxes_ltrb), np.asarray(scores)
  # (class, anchor) pairs above the threshold, grouped by class, each class's by falling
  # score; equal scores stay in anchor order (a stable sort). The key class - score is exact
  # in float64 (a float32 score has 24 significant bits), and 3x faster than a lexsort.
  cls, anchor = np.nonzero(scores[:, 1:].T > score_threshold)
  cls += 1
  score = scores[anchor, cls]
  order = np.argsort(cls - score.astype(np.float64), kind="stable")
  cls, anchor = cls[order], anchor[order]
  # Each pair's rank within its class; keep the top max_candidates of each.
  classes, first, counts = np.unique(cls, return_index=True, return_counts=True)
  rank = np.arange(len(cls)) - np.repeat(first, counts)
  top = rank < max_candidates
  row = np.repeat(np.arange(len(classes)), counts)[top]
  rank, anchor = rank[top], anchor[top]
  width = int(rank.max()) + 1 if len(rank) else 0
  cand = np.zeros((len(classes), width), np.int64)           # anchor per (class, rank)
  valid = np.zeros((len(classes), width), bool)
  cand[row, rank], valid[row, rank] = anchor, True

  alive = _greedy(boxes_ltrb[cand], valid, iou_threshold)

  kept_row, kept_rank = np.nonzero(alive)
  kept_anchor = cand[kept_row, kept_rank]
  kept_cls = classes[kept_row].astype(np.int32)
  kept_scores = scores[kept_anchor, kept_cls]
  best = np.lexsort((kept_rank, kept_cls, -kept_scores))[:max_output]
  return boxes_ltrb[kept_anchor[best]], kept_scores[best], kept_cls[best]


def _greedy(boxes, valid, iou_threshold):
  """Greedy NMS of every class at once: boxes (classes, width, 4) ltrb, each class's by falling
  score, valid (classes, width) -> the kept ones (classes, width)."""
  left, top, right, bottom = np.moveaxis(boxes, -1, 0)   # (classes, width) each
  area = (right - left) * (bottom - top)
  alive = valid.copy()          # after step k, the ranks <= k still alive are the kept ones
  for k in range(boxes.shape[1]):
    kept = alive[:, k]
    if not kept.any():
      continue
    # IoU of each class's rank-k box with its lower-ranked ones (`iou`'s arithmetic, a row
    # at a time: the rows of dropped boxes are never needed).
    later = slice(k + 1, None)
    inter = (np.maximum(np.minimum(right[:, k, None], right[:, later]) -
                        np.maximum(left[:, k, None], left[:, later]), 0) *
             np.maximum(np.minimum(bottom[:, k, None], bottom[:, later]) -
                        np.maximum(top[:, k, None], top[:, later]), 0))
    with np.errstate(invalid="ignore", divide="ignore"):
      overlap = inter / (area[:, k, None] + area[:, later] - inter)
    alive[:, later] &= (overlap < iou_threshold) | ~kept[:, None]
  return alive


def nms_candidates(boxes_ltrb, scores, score_threshold=0.05, iou_threshold=0.5,
                   max_output=200):
  """`nms` on the candidates a device eval step kept: boxes (C-1, K, 4) ltrb and scores
  (C-1, K) of each foreground class's K best anchors, best first (top_k: equal scores in
  anchor order). With K = max_candidates this is exactly `nms` of the whole image, since
  `nms` looks at no more than those per class and breaks ties the same way (class, then rank
  in the class). Returns (boxes, scores, labels 1..C-1)."""
  boxes_ltrb, scores = np.asarray(boxes_ltrb), np.asarray(scores)
  alive = _greedy(boxes_ltrb, scores > score_threshold, iou_threshold)
  kept_row, kept_rank = np.nonzero(alive)
  kept_scores = scores[kept_row, kept_rank]
  best = np.lexsort((kept_rank, kept_row, -kept_scores))[:max_output]
  return (boxes_ltrb[kept_row[best], kept_rank[best]], kept_scores[best],
          (kept_row[best] + 1).astype(np.int32))


def decode_batch(locs, probs, dboxes_xywh, scale_xy=SCALE_XY, scale_wh=SCALE_WH, **nms_kwargs):
  """The reference Encoder.decode_batch: locs (N, A, 4) offsets and probs (N, A, C) softmax
  probabilities (the reference's scale_back_batch applies the softmax; here the caller has)
  -> per image (boxes ltrb, scores, labels) from `nms`."""
  boxes = decode(locs, dboxes_xywh, scale_xy, scale_wh)
  return [nms(b, p, **nms_kwargs) for b, p in zip(boxes, np.asarray(probs))]
