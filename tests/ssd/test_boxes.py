"""workloads/ssd/boxes.py against references written out here: the default boxes from the
reference formula by hand, the matcher against a plain loop over (object, anchor) pairs, the
TF target assignment against the numpy one, NMS against tf.image.non_max_suppression per
class and against hand-made cases."""
import math

import numpy as np
import pytest
import tensorflow as tf

from workloads.ssd import boxes, spec

REF_GEOMETRY = dict(fig_size=300, feat_size=(38, 19, 10, 5, 3, 1), steps=(8, 16, 32, 64, 100, 300),
                    scales=(21, 45, 99, 153, 207, 261, 315),
                    aspect_ratios=((2,), (2, 3), (2, 3), (2, 3), (2,), (2,)))


@pytest.fixture(scope="module")
def ref_anchors():
  return boxes.default_boxes(**REF_GEOMETRY)


@pytest.fixture(scope="module")
def small_anchors():
  """The mini preset's 380 anchors (64 px; maps 8, 4, 2, 1): small enough for plain loops."""
  return boxes.default_boxes(**spec.anchor_geometry(spec.mini()))


# ----------------------------------------------------------------------------- default boxes

def test_reference_geometry_has_8732_boxes_as_the_spec_counts(ref_anchors):
  assert ref_anchors.shape == (8732, 4) and ref_anchors.dtype == np.float32
  assert spec.anchor_geometry(spec.reference()) == REF_GEOMETRY
  for preset in (spec.reference, spec.mini, spec.tiny):
    cfg = preset()
    assert len(boxes.default_boxes(**spec.anchor_geometry(cfg))) == spec.num_anchors(cfg)


def test_spot_checked_boxes_follow_the_reference_formula(ref_anchors):
  # Level 0: 38x38 positions x 4 sizes; sizes outer, positions (row, column) inner.
  fk0, s1, s2 = 300 / 8, 21 / 300, 45 / 300
  per_size = 38 * 38
  np.testing.assert_allclose(ref_anchors[0], [0.5 / fk0, 0.5 / fk0, s1, s1], rtol=1e-6)
  # the next position along a row moves x, the next row moves y
  np.testing.assert_allclose(ref_anchors[1][:2], [1.5 / fk0, 0.5 / fk0], rtol=1e-6)
  np.testing.assert_allclose(ref_anchors[38][:2], [0.5 / fk0, 1.5 / fk0], rtol=1e-6)
  sk3 = math.sqrt(s1 * s2)                                  # the (sk3, sk3) box
  np.testing.assert_allclose(ref_anchors[per_size], [0.5 / fk0, 0.5 / fk0, sk3, sk3], rtol=1e-6)
  # aspect ratio 2 at row 1, column 2: wide, then its tall swap
  r2 = math.sqrt(2)
  want = [2.5 / fk0, 1.5 / fk0, s1 * r2, s1 / r2]
  np.testing.assert_allclose(ref_anchors[2 * per_size + 38 + 2], want, rtol=1e-6)
  want = [2.5 / fk0, 1.5 / fk0, s1 / r2, s1 * r2]
  np.testing.assert_allclose(ref_anchors[3 * per_size + 38 + 2], want, rtol=1e-6)
  # level 1 starts after 4 * 38^2 = 5776 boxes; its 5th and 6th sizes are ratio 3
  fk1, t1 = 300 / 16, 45 / 300
  np.testing.assert_allclose(ref_anchors[5776 + 4 * 361],
                             [0.5 / fk1, 0.5 / fk1, t1 * math.sqrt(3), t1 / math.sqrt(3)],
                             rtol=1e-6)
  # the 1x1 map's four boxes are the last four, centred
  u1, u2 = 261 / 300, 315 / 300
  want = [[0.5, 0.5, u1, u1], [0.5, 0.5, math.sqrt(u1 * u2), math.sqrt(u1 * u2)],
          [0.5, 0.5, 1.0, u1 / r2], [0.5, 0.5, u1 / r2, 1.0]]    # u1 * sqrt2 = 1.23 -> 1
  np.testing.assert_allclose(ref_anchors[-4:], want, rtol=1e-6)


def test_clipping_is_on_centre_and_size_not_on_corners(ref_anchors):
  assert ref_anchors.min() >= 0 and ref_anchors.max() <= 1
  # level 2 (10x10, step 32): the last column's centre 9.5 / 9.375 = 1.013 is clipped to 1
  level2 = 5776 + 6 * 361
  assert 9.5 / (300 / 32) > 1
  np.testing.assert_allclose(ref_anchors[level2 + 9], [1.0, 0.5 / 9.375, 99 / 300, 99 / 300],
                             rtol=1e-6)
  # ... so corners may leave [0, 1] (the reference clamps xywh, not ltrb)
  assert boxes.xywh_to_ltrb(ref_anchors)[level2 + 9, 2] > 1


# ----------------------------------------------------------------------------- formats, IoU

def test_format_round_trip_and_iou_by_hand():
  xywh = np.array([[0.5, 0.5, 0.2, 0.4], [0.1, 0.3, 0.2, 0.2]])
  ltrb = boxes.xywh_to_ltrb(xywh)
  np.testing.assert_allclose(ltrb, [[0.4, 0.3, 0.6, 0.7], [0.0, 0.2, 0.2, 0.4]])
  np.testing.assert_allclose(boxes.ltrb_to_xywh(ltrb), xywh)
  a = np.array([[0, 0, 2, 2], [0, 0, 1, 1]], np.float32)
  b = np.array([[1, 1, 3, 3], [5, 5, 6, 6], [0, 0, 2, 1]], np.float32)
  # [0,0,2,2] vs [1,1,3,3]: 1 / 7; disjoint: 0; [0,0,2,1] inside: 2 / 4
  np.testing.assert_allclose(boxes.iou(a, b), [[1 / 7, 0, 0.5], [0, 0, 0.5]], rtol=1e-6)


# ----------------------------------------------------------------------------- matching

def _brute_force_match(gt_ltrb, gt_labels, dboxes_xywh, criteria=0.5):
  """Encoder.encode as loops: each anchor's first best object; then objects in order, each
  (re)claiming its first best anchor. IoUs in float32 scalar ops, the same arithmetic."""
  f = np.float32
  anchors = [(f(cx) - f(0.5) * f(w), f(cy) - f(0.5) * f(h), f(cx) + f(0.5) * f(w),
              f(cy) + f(0.5) * f(h)) for cx, cy, w, h in dboxes_xywh]

  def pair_iou(g, a):
    iw = max(f(0), min(g[2], a[2]) - max(g[0], a[0]))
    ih = max(f(0), min(g[3], a[3]) - max(g[1], a[1]))
    inter = iw * ih
    return inter / ((g[2] - g[0]) * (g[3] - g[1]) + (a[2] - a[0]) * (a[3] - a[1]) - inter)

  gts = [tuple(f(v) for v in g) for g in gt_ltrb]
  table = [[pair_iou(g, a) for a in anchors] for g in gts]
  owner, value = [0] * len(anchors), [f(-1)] * len(anchors)
  for k in range(len(anchors)):
    for g in range(len(gts)):
      if table[g][k] > value[k]:                      # strict: the first best stays
        owner[k], value[k] = g, table[g][k]
  for g in range(len(gts)):
    best = max(range(len(anchors)), key=lambda k: (table[g][k], -k))   # first best anchor
    owner[best], value[best] = g, 2.0
  out_boxes = np.array(dboxes_xywh, np.float32)
  out_labels = np.zeros(len(anchors), np.int64)
  for k in range(len(anchors)):
    if value[k] > criteria:
      l, t, r, b = gts[owner[k]]
      out_boxes[k] = [(l + r) / 2, (t + b) / 2, r - l, b - t]
      out_labels[k] = gt_labels[owner[k]]
  return out_boxes, out_labels


def _random_objects(rng, n):
  centre = rng.uniform(0.1, 0.9, (n, 2))
  size = rng.uniform(0.05, 0.6, (n, 2))
  ltrb = np.clip(np.concatenate([centre - size / 2, centre + size / 2], 1), 0, 1)
  return ltrb.astype(np.float32), rng.integers(1, 5, n)


def _cases():
  """(gt_ltrb, labels): random, none, duplicate objects with different labels, a tiny object
  (best IoU far below 0.5) and two objects sharing their best anchor."""
  rng = np.random.default_rng(0)
  cases = [_random_objects(rng, n) for n in (1, 3, 6)]
  cases.append((np.zeros((0, 4), np.float32), np.zeros((0,), np.int64)))
  box = [0.2, 0.2, 0.45, 0.5]
  cases.append((np.array([box, box, [0.6, 0.1, 0.95, 0.4]], np.float32), np.array([1, 2, 3])))
  cases.append((np.array([[0.50, 0.50, 0.52, 0.53], [0.10, 0.10, 0.80, 0.90]], np.float32),
                np.array([4, 1])))
  cases.append((np.array([[0.40, 0.40, 0.60, 0.60], [0.41, 0.40, 0.61, 0.60]], np.float32),
                np.array([1, 2])))
  return cases


def test_match_equals_the_plain_loop(small_anchors):
  for gt, labels in _cases():
    got_boxes, got_labels = boxes.match(gt, labels, small_anchors)
    want_boxes, want_labels = _brute_force_match(gt, labels, small_anchors)
    np.testing.assert_array_equal(got_labels, want_labels)
    np.testing.assert_allclose(got_boxes, want_boxes, rtol=1e-6, atol=1e-7)


def test_match_edge_cases_by_hand(small_anchors):
  ltrb = boxes.xywh_to_ltrb(small_anchors)
  # no objects: every anchor background with its own box
  got_boxes, got_labels = boxes.match(np.zeros((0, 4)), np.zeros(0), small_anchors)
  assert not got_labels.any()
  np.testing.assert_array_equal(got_boxes, small_anchors)
  # a tiny object (best IoU < 0.5) gets exactly its best anchor
  tiny = np.array([[0.50, 0.50, 0.52, 0.53]], np.float32)
  ious = boxes.iou(tiny, ltrb)[0]
  assert ious.max() < 0.1
  _, got_labels = boxes.match(tiny, [7], small_anchors)
  assert np.flatnonzero(got_labels).tolist() == [int(np.argmax(ious))]
  # two identical objects: anchors take the first's label, the shared best anchor the last's
  box = np.array([[0.2, 0.2, 0.45, 0.5]] * 2, np.float32)
  _, got_labels = boxes.match(box, [1, 2], small_anchors)
  best = int(np.argmax(boxes.iou(box[:1], ltrb)[0]))
  assert got_labels[best] == 2
  assert (got_labels == 1).sum() >= 1 and (got_labels == 2).sum() == 1


def test_tf_assign_targets_equals_numpy_match_then_encode(ref_anchors):
  """Eagerly and inside tf.data map (graph mode, unknown object count, 0 objects included)."""
  cases = _cases()

  def numpy_targets(gt, labels):
    matched, want_labels = boxes.match(gt, labels, ref_anchors)
    return boxes.encode(matched, ref_anchors), want_labels

  def check(got, want):
    (got_off, got_lab), (want_off, want_lab) = got, want
    assert got_off.dtype == np.float32 and got_lab.dtype == np.int32
    np.testing.assert_array_equal(got_lab, want_lab)
    np.testing.assert_allclose(got_off, want_off, rtol=1e-5,
                               atol=1e-5 * np.abs(want_off).max())

  for gt, labels in cases[:4]:
    got = boxes.assign_targets(tf.constant(gt), tf.constant(labels), ref_anchors)
    check([t.numpy() for t in got], numpy_targets(gt, labels))

  ds = tf.data.Dataset.from_generator(
      lambda: iter(cases),
      output_signature=(tf.TensorSpec([None, 4], tf.float32), tf.TensorSpec([None], tf.int64)))
  ds = ds.map(lambda g, l: boxes.assign_targets(g, l, ref_anchors))
  for (gt, labels), got in zip(cases, ds.as_numpy_iterator()):
    check(got, numpy_targets(gt, labels))
  # a matched anchor's target decodes back to its object
  gt, labels = cases[2]
  offsets, got_labels = boxes.assign_targets(gt, labels, ref_anchors)
  pos = np.flatnonzero(got_labels.numpy())
  decoded = boxes.decode(offsets.numpy(), ref_anchors)[pos]
  assert np.abs(decoded[:, None, :] - gt[None]).max(-1).min(-1).max() < 1e-5


def test_decode_inverts_encode(ref_anchors):
  rng = np.random.default_rng(1)
  xywh = np.concatenate([rng.uniform(0, 1, (8732, 2)), rng.uniform(0.01, 1, (8732, 2))], 1)
  offsets = boxes.encode(xywh, ref_anchors)
  # the formula on one box, by hand
  d = ref_anchors[100].astype(np.float64)
  np.testing.assert_allclose(offsets[100], [(xywh[100, 0] - d[0]) / d[2] / 0.1,
                                            (xywh[100, 1] - d[1]) / d[3] / 0.1,
                                            math.log(xywh[100, 2] / d[2]) / 0.2,
                                            math.log(xywh[100, 3] / d[3]) / 0.2], rtol=1e-6)
  np.testing.assert_allclose(boxes.decode(offsets, ref_anchors), boxes.xywh_to_ltrb(xywh),
                             rtol=1e-6, atol=1e-7)
  # batched (N, A, 4)
  batch = boxes.decode(np.stack([offsets, offsets]), ref_anchors)
  assert batch.shape == (2, 8732, 4)


# ----------------------------------------------------------------------------- NMS

def _tf_nms(boxes_ltrb, scores, score_threshold, iou_threshold, max_candidates, max_output):
  """Per class: TF's greedy NMS over the top max_candidates above the threshold; then the top
  max_output over classes. TF's IoU ignores which axis is x, so ltrb goes in as is."""
  out = []
  for c in range(1, scores.shape[1]):
    s = scores[:, c]
    cand = np.flatnonzero(s > score_threshold)
    cand = cand[tf.math.top_k(s[cand], k=min(max_candidates, len(cand))).indices.numpy()]
    keep = tf.image.non_max_suppression(boxes_ltrb[cand], s[cand], max_output_size=len(cand),
                                        iou_threshold=iou_threshold).numpy()
    out += [(s[a], c, a) for a in cand[keep]]
  out = sorted(out, reverse=True)[:max_output]
  return (np.array([boxes_ltrb[a] for _, _, a in out]).reshape(-1, 4),
          np.array([s for s, _, _ in out]), np.array([c for _, c, _ in out]))


def test_nms_equals_tf_non_max_suppression_per_class():
  rng = np.random.default_rng(2)
  # clustered boxes so many pairs overlap around the threshold
  centres = rng.uniform(0.2, 0.8, (6, 2))[rng.integers(0, 6, 600)] + rng.normal(0, 0.03, (600, 2))
  size = rng.uniform(0.1, 0.3, (600, 2))
  ltrb = np.concatenate([centres - size / 2, centres + size / 2], 1).astype(np.float32)
  logits = rng.normal(0, 1.5, (600, 5))
  probs = (np.exp(logits) / np.exp(logits).sum(1, keepdims=True)).astype(np.float32)
  for kwargs in (dict(score_threshold=0.05, iou_threshold=0.5, max_candidates=200,
                      max_output=200),
                 dict(score_threshold=0.3, iou_threshold=0.3, max_candidates=50, max_output=40)):
    got = boxes.nms(ltrb, probs, **kwargs)
    want = _tf_nms(ltrb, probs, **kwargs)
    assert len(got[1]) > 20
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])


def test_nms_hand_made_survivors():
  ltrb = np.array([[0, 0, 1, 1],          # 0
                   [0, 0, 1, 0.5],        # 1: IoU with 0 exactly 0.5 -> suppressed (>=)
                   [0, 0, 1, 0.52],       # 2: IoU with 0 0.52 -> suppressed; with 1 0.96
                   [0, 0.3, 1, 1],        # 3: IoU with 0 0.7 -> suppressed
                   [2, 2, 3, 3],          # 4: disjoint -> kept
                   [0, 0.6, 1, 1.6]],     # 5: IoU with 0 0.25 -> kept
                  np.float32)
  probs = np.zeros((6, 3), np.float32)
  probs[:, 1] = [0.9, 0.8, 0.7, 0.6, 0.5, 0.04]    # box 5 falls below the 0.05 threshold
  probs[:, 2] = [0.0, 0.3, 0.0, 0.0, 0.0, 0.2]     # class 2 has its own NMS
  probs[:, 0] = 1 - probs[:, 1:].sum(1)            # background: never reported
  got_boxes, got_scores, got_labels = boxes.nms(ltrb, probs)
  np.testing.assert_allclose(got_scores, [0.9, 0.5, 0.3, 0.2])
  np.testing.assert_array_equal(got_labels, [1, 1, 2, 2])
  np.testing.assert_array_equal(got_boxes, ltrb[[0, 4, 1, 5]])
  # at threshold 0.55 boxes 1 (IoU 0.5) and 2 (0.52) survive box 0; box 1 (0.8) then
  # removes box 2 (IoU 0.96)
  _, got_scores, _ = boxes.nms(ltrb, probs, iou_threshold=0.55)
  np.testing.assert_allclose(got_scores, [0.9, 0.8, 0.5, 0.3, 0.2])
  # a class's candidates are its top max_candidates before NMS
  _, got_scores, got_labels = boxes.nms(ltrb, probs, max_candidates=1)
  np.testing.assert_allclose(got_scores, [0.9, 0.3])


def test_nms_truncates_to_max_output_and_handles_no_detections():
  grid = np.arange(10, dtype=np.float32) * 2
  ltrb = np.stack([grid, grid, grid + 1, grid + 1], 1)            # ten disjoint boxes
  probs = np.zeros((10, 3), np.float32)
  probs[:, 1] = np.linspace(0.1, 0.5, 10)
  probs[:, 2] = np.linspace(0.12, 0.52, 10)
  _, got_scores, got_labels = boxes.nms(ltrb, probs, max_output=3)
  np.testing.assert_allclose(got_scores, [0.52, 0.5, 0.52 - 0.4 / 9], rtol=1e-6)
  np.testing.assert_array_equal(got_labels, [2, 1, 2])
  assert len(boxes.nms(ltrb, probs)[1]) == 20
  got = boxes.nms(ltrb, probs, score_threshold=0.6)
  assert [g.shape for g in got] == [(0, 4), (0,), (0,)]


def test_decode_batch_decodes_then_runs_nms_per_image(ref_anchors):
  rng = np.random.default_rng(3)
  locs = rng.normal(0, 1, (2, 8732, 4)).astype(np.float32)
  logits = rng.normal(0, 2, (2, 8732, 4))
  probs = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).astype(np.float32)
  results = boxes.decode_batch(locs, probs, ref_anchors, iou_threshold=0.5)
  assert len(results) == 2
  for i, (b, s, l) in enumerate(results):
    want = boxes.nms(boxes.decode(locs[i], ref_anchors), probs[i])
    np.testing.assert_array_equal(b, want[0])
    np.testing.assert_array_equal(s, want[1])
    np.testing.assert_array_equal(l, want[2])
    assert len(s) == 200 and np.all(np.diff(s) <= 0)


def test_nms_on_device_candidates_equals_nms_of_the_whole_image():
  """The eval step keeps each class's 200 best anchors on device (top_k); NMS of those
  candidates is the reference's NMS of the whole image."""
  rng = np.random.default_rng(7)
  anchors, classes = 3000, 6
  centres = rng.uniform(0.1, 0.9, (anchors, 2))
  sizes = rng.uniform(0.05, 0.3, (anchors, 2))
  ltrb = np.concatenate([centres - sizes / 2, centres + sizes / 2], 1).astype(np.float32)
  logits = rng.normal(0, 2, (anchors, classes))
  probs = (np.exp(logits) / np.exp(logits).sum(1, keepdims=True)).astype(np.float32)
  want = boxes.nms(ltrb, probs)
  top = np.argsort(-probs[:, 1:].T, axis=1, kind="stable")[:, :200]     # (C-1, 200)
  cand_scores = np.take_along_axis(probs[:, 1:].T, top, 1)
  got = boxes.nms_candidates(ltrb[top], cand_scores)
  assert len(want[0]) > 50
  for a, b in zip(got, want):
    np.testing.assert_array_equal(a, b)


def test_nms_and_device_candidates_agree_when_ties_straddle_max_output():
  """Two classes, 150 disjoint boxes each, every score equal: 300 survivors for 200 places.
  Both keep class 1's 150 and class 2's 50 lowest anchors (class, then anchor order); ranking
  ties by rank alone (as nms_candidates did) would keep 100 of each."""
  anchors, side = 300, 20
  xy = np.stack(np.meshgrid(np.arange(side), np.arange(side)), -1).reshape(-1, 2)[:anchors]
  ltrb = np.concatenate([xy, xy + 0.5], 1).astype(np.float32) / side       # no two overlap
  probs = np.zeros((anchors, 3), np.float32)
  probs[150:, 1] = 0.5              # class 1 on the upper anchors, class 2 on the lower ones
  probs[:150, 2] = 0.5
  want = boxes.nms(ltrb, probs, max_output=200)
  top = np.argsort(-probs[:, 1:].T, axis=1, kind="stable")[:, :200]
  got = boxes.nms_candidates(ltrb[top], np.take_along_axis(probs[:, 1:].T, top, 1),
                             max_output=200)
  for a, b in zip(got, want):
    np.testing.assert_array_equal(a, b)
  labels = want[2]
  assert (labels == 1).sum() == 150 and (labels == 2).sum() == 50
  np.testing.assert_array_equal(want[0][150:], ltrb[:50])     # class 2's lowest anchors
