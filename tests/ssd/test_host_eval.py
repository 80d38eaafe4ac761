"""The eval-time constants of the SSD host eval (the reference's decode_single: IoU 0.5, score
threshold 0.05, 200 detections an image), each checked through `accumulate` on hand-made
candidates, so changing one fails here and not only by missing the mini target."""
import types

import numpy as np

from workloads.ssd import host_eval


def _disjoint(n, side=20):
  xy = np.stack(np.meshgrid(np.arange(side), np.arange(side)), -1).reshape(-1, 2)[:n]
  return (np.concatenate([xy, xy + 0.5], 1) / side).astype(np.float32)


def _rows(boxes, scores):
  """accumulate() on one image per entry; -> the accumulator's rows per image id."""
  cfg = types.SimpleNamespace(data=types.SimpleNamespace(source="generated"),
                              model=types.SimpleNamespace(num_classes=3))
  k = max(b.shape[1] for b in boxes)
  pad = lambda a, fill: np.concatenate([a, np.full((a.shape[0], k - a.shape[1], *a.shape[2:]),
                                                   fill, a.dtype)], 1)
  outputs = {"boxes": np.stack([pad(b, 0.0) for b in boxes]),
             "scores": np.stack([pad(s, 0.0) for s in scores]),
             "image_id": np.arange(1, len(boxes) + 1), "image_size": np.full((len(boxes), 2), 100),
             "mask": np.ones(len(boxes))}
  rows = host_eval.accumulate(None, outputs, cfg).rows
  return {i: rows[rows[:, 0] == i] for i in range(1, len(boxes) + 1)}


def test_iou_threshold_score_threshold_and_max_output():
  # image 1, class 1: A, B inside A with IoU 0.55 (dropped at 0.5, kept at 0.6);
  #          class 2: 250 disjoint boxes scored 0.70 .. 0.06: with A, 251 for 200 places
  a = np.array([0.0, 0.0, 0.5, 0.5], np.float32)
  b = np.array([0.0, 0.0, 0.5, 0.275], np.float32)
  boxes1 = np.zeros((2, 250, 4), np.float32)
  scores1 = np.zeros((2, 250), np.float32)
  boxes1[0, :2], scores1[0, :2] = [a, b], [0.9, 0.8]
  boxes1[1], scores1[1] = _disjoint(250), np.linspace(0.70, 0.06, 250)
  # image 2, class 1: two disjoint boxes scored just under and just over 0.05
  boxes2 = np.zeros((2, 2, 4), np.float32)
  scores2 = np.zeros((2, 2), np.float32)
  boxes2[0], scores2[0] = _disjoint(2), [0.049, 0.051]
  rows = _rows([boxes1, boxes2], [scores1, scores2])
  one, two = rows[1], rows[2]
  assert host_eval.MAX_OUTPUT == 200 and len(one) == 200
  assert np.isclose(one[:, 5], 0.9).sum() == 1           # A kept
  assert not np.isclose(one[:, 5], 0.8).any()            # B (IoU 0.55 >= 0.5) dropped
  assert len(two) == 1 and np.isclose(two[0, 5], 0.051)  # 0.049 < 0.05 dropped
