"""COCO box mAP as the MLPerf SSD reference scores it: the category map against the published
list of COCO ids, and the accumulator's scores against pycocotools run directly on json files
that this test writes itself (ground truth and detections, converted box by box here)."""
import contextlib
import io
import json
import subprocess
import sys

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from workloads.common import coco

# COCO 2017 leaves these ids out of 1..90.
MISSING_IDS = {12, 26, 29, 30, 45, 66, 68, 69, 71, 83}

# Hand-made ground truth: images of different sizes (id -> (height, width)), objects as
# (image, category id, [x, y, w, h] in pixels, iscrowd, segmentation area). Sizes cover COCO's
# small (< 32**2), medium and large ranges; object 6 has a medium box (40 x 40 = 1600) whose
# segmentation area (900) is small, so it changes size range with the area definition.
IMAGES = {101: (480, 640), 202: (640, 427), 303: (375, 500), 404: (200, 300)}
OBJECTS = [
    (101, 1, [100.0, 120.0, 200.0, 150.0], 0, 21000.0),
    (101, 1, [400.0, 50.0, 60.0, 80.0], 0, 3500.0),
    (101, 13, [10.0, 10.0, 20.0, 25.0], 0, 400.0),
    (101, 1, [300.0, 300.0, 300.0, 150.0], 1, 30000.0),      # crowd
    (202, 90, [50.5, 60.25, 300.0, 400.0], 0, 90000.0),
    (202, 13, [200.0, 500.0, 40.0, 40.0], 0, 900.0),
    (202, 27, [5.0, 5.0, 100.0, 50.0], 0, 4000.0),
    (303, 1, [0.0, 0.0, 250.0, 375.0], 0, 60000.0),
    (303, 27, [260.0, 100.0, 80.0, 90.0], 0, 6000.0),
    # image 404 has no objects
]

# Hand-made detections: (image, reference label 1..80, [l, t, r, b] normalised, score).
# Label 1 is id 1, label 12 is id 13, label 25 is id 27, label 80 is id 90.
DETECTIONS = [
    (101, 1, [0.16, 0.25, 0.47, 0.56], 0.9),     # good match of the large person
    (101, 1, [0.62, 0.11, 0.72, 0.28], 0.6),     # the medium person, loose
    (101, 1, [0.55, 0.70, 0.80, 0.95], 0.8),     # on the crowd: ignored, not a false positive
    (101, 12, [0.015, 0.02, 0.05, 0.075], 0.7),  # the small object
    (101, 25, [0.2, 0.2, 0.3, 0.3], 0.3),        # wrong class: false positive
    (202, 80, [0.12, 0.09, 0.82, 0.72], 0.95),
    (202, 80, [0.1, 0.1, 0.8, 0.7], 0.5),        # duplicate: false positive
    (202, 12, [0.47, 0.78, 0.56, 0.84], 0.4),
    (202, 25, [0.01, 0.01, 0.25, 0.09], 0.85),
    (303, 1, [0.0, 0.0, 0.5, 0.98], 0.99),
    (303, 25, [0.5, 0.25, 0.7, 0.5], 0.2),
    (303, 25, [0.52, 0.27, 0.68, 0.52], 0.65),
    (404, 1, [0.1, 0.1, 0.5, 0.5], 0.75),        # no ground truth here: false positive
]


def _gt_json(path, box_areas):
  """The ground truth as a COCO annotation file, with segmentation or box areas."""
  annotations = []
  for n, (image, cat, bbox, crowd, seg_area) in enumerate(OBJECTS):
    annotations.append({"id": n + 1, "image_id": image, "category_id": cat, "bbox": bbox,
                        "area": bbox[2] * bbox[3] if box_areas else seg_area,
                        "iscrowd": crowd, "segmentation": []})
  path.write_text(json.dumps({
      "info": {}, "licenses": [],
      "images": [{"id": i, "height": h, "width": w, "file_name": f"{i}.jpg"}
                 for i, (h, w) in IMAGES.items()],
      "annotations": annotations,
      "categories": [{"id": c, "name": f"c{c}", "supercategory": ""}
                     for c in range(1, 91) if c not in MISSING_IDS]}))
  return str(path)


LABEL_TO_ID = {1: 1, 12: 13, 25: 27, 80: 90}


def _dt_json(path, detections):
  """Detections in the reference's result format, converted box by box."""
  results = []
  for image, label, (l, t, r, b), score in detections:
    height, width = IMAGES[image]
    results.append({"image_id": image, "category_id": LABEL_TO_ID[label], "score": score,
                    "bbox": [l * width, t * height, (r - l) * width, (b - t) * height]})
  path.write_text(json.dumps(results))
  return str(path)


def _direct_stats(gt_path, dt_path, image_ids=None):
  """pycocotools on the two files, as the reference runs it."""
  with contextlib.redirect_stdout(io.StringIO()):
    gt = COCO(gt_path)
    evaluator = COCOeval(gt, gt.loadRes(dt_path), "bbox")
    if image_ids is not None:
      evaluator.params.imgIds = image_ids
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
  return [float(s) for s in evaluator.stats]


def _accumulate(detections, image_ids=tuple(IMAGES), acc=None):
  """Feeds detections to an accumulator image by image, in the model's output layout."""
  acc = coco.DetectionAccumulator() if acc is None else acc
  per_image = []
  for image in image_ids:
    mine = [d for d in detections if d[0] == image]
    per_image.append((np.array([d[2] for d in mine], np.float32).reshape(-1, 4),
                      np.array([d[3] for d in mine], np.float32),
                      np.array([d[1] for d in mine], np.int32)))
  sizes = np.array([IMAGES[i] for i in image_ids], np.float32)
  acc.add(np.array(image_ids, np.int32), sizes, per_image)
  return acc


def _as_float32(detections):
  """The detections as the accumulator sees them (the model's float32), for the direct path."""
  return [(i, lab, [float(np.float32(v)) for v in box], float(np.float32(s)))
          for i, lab, box, s in detections]


def test_category_map():
  ids = coco.COCO_CATEGORY_IDS
  assert len(ids) == 80 and ids[0] == 1 and ids[-1] == 90
  assert set(range(1, 91)) - set(ids) == MISSING_IDS
  assert list(ids) == sorted(ids)
  assert coco.category_id(1) == 1 and coco.category_id(80) == 90
  # Labels right after each gap.
  np.testing.assert_array_equal(coco.category_id(np.array([11, 12, 24, 25, 26, 27, 40, 41])),
                                [11, 13, 25, 27, 28, 31, 44, 46])
  with pytest.raises(ValueError):
    coco.category_id(0)
  with pytest.raises(ValueError):
    coco.category_id(81)


def test_rows_are_reference_format():
  acc = _accumulate(DETECTIONS[:2], image_ids=(101,))
  # Image 101 is 640 wide and 480 high: x = l * 640, y = t * 480, w = (r - l) * 640, ...
  l, t, r, b = (float(np.float32(v)) for v in DETECTIONS[1][2])  # float32 in, float64 out
  np.testing.assert_allclose(acc.rows[1], [101, l * 640, t * 480, (r - l) * 640,
                                           (b - t) * 480, float(np.float32(0.6)), 1], rtol=1e-12)
  assert acc.rows.shape == (2, 7) and len(acc) == acc.num_images == 1


def test_matches_pycocotools_on_json_files(tmp_path):
  gt_path = _gt_json(tmp_path / "gt.json", box_areas=False)
  expected = _direct_stats(gt_path, _dt_json(tmp_path / "dt.json", _as_float32(DETECTIONS)))
  assert 0.3 < expected[0] < 0.9  # a score with both hits and misses in it
  result = _accumulate(DETECTIONS).evaluate(coco.ground_truth_from_json(gt_path))
  assert result["images"] == 4
  assert result["box_map"] == pytest.approx(expected[0], abs=1e-12)
  np.testing.assert_allclose(result["stats"], expected, rtol=0, atol=1e-12)


def test_merged_hosts_match_one_accumulator(tmp_path):
  gt = coco.ground_truth_from_json(_gt_json(tmp_path / "gt.json", box_areas=False))
  whole = _accumulate(DETECTIONS).evaluate(gt)
  merged = _accumulate(DETECTIONS, (101, 404)).merge(_accumulate(DETECTIONS, (202, 303)))
  assert merged.evaluate(gt) == whole
  with pytest.raises(ValueError):
    merged.merge(_accumulate(DETECTIONS, (101,)))


def test_records_ground_truth_matches_json(tmp_path):
  """tfds-style records (normalised ymin, xmin, ymax, xmax; labels 0..79) give the json's
  scores when the json carries box areas; with segmentation areas only the size ranges move."""
  sorted_ids = sorted(set(range(1, 91)) - MISSING_IDS)
  records = []
  for image, (h, w) in IMAGES.items():
    objs = [o for o in OBJECTS if o[0] == image]
    records.append({
        "image_id": image, "height": h, "width": w,
        "boxes": np.array([[y / h, x / w, (y + bh) / h, (x + bw) / w]
                           for _, _, (x, y, bw, bh), _, _ in objs], np.float64).reshape(-1, 4),
        "labels": np.array([sorted_ids.index(o[1]) for o in objs], np.int64),
        "is_crowd": np.array([bool(o[3]) for o in objs], bool)})
  from_records = coco.ground_truth_from_records(records)
  acc = _accumulate(DETECTIONS)
  dt_path = _dt_json(tmp_path / "dt.json", _as_float32(DETECTIONS))

  box_area_json = _direct_stats(_gt_json(tmp_path / "box.json", box_areas=True), dt_path)
  got = acc.evaluate(from_records)["stats"]
  np.testing.assert_allclose(got, box_area_json, rtol=0, atol=1e-12)

  seg_area_json = _direct_stats(_gt_json(tmp_path / "seg.json", box_areas=False), dt_path)
  assert got[0] == pytest.approx(seg_area_json[0], abs=1e-12)
  assert got[3] != seg_area_json[3] and got[4] != seg_area_json[4]  # object 6 moved range
  # The json areas passed along (tfds objects/area) give the official size ranges back.
  for rec in records:
    rec["areas"] = [o[4] for o in OBJECTS if o[0] == rec["image_id"]]
  np.testing.assert_allclose(acc.evaluate(coco.ground_truth_from_records(records))["stats"],
                             seg_area_json, rtol=0, atol=1e-12)


def test_records_with_generated_classes():
  """A generated set with 3 classes: tfds labels 0..2 become ids 1..3, model labels 1..3."""
  records = [{"image_id": 7, "height": 100, "width": 200,
              "boxes": np.array([[0.1, 0.1, 0.5, 0.4], [0.5, 0.5, 0.9, 0.9]]),
              "labels": np.array([0, 2])}]
  gt = coco.ground_truth_from_records(records, num_categories=3)
  assert sorted(gt.getCatIds()) == [1, 2, 3]
  assert [gt.anns[a]["category_id"] for a in sorted(gt.anns)] == [1, 3]
  np.testing.assert_allclose(gt.anns[1]["bbox"], [20, 10, 60, 40])
  assert gt.anns[1]["area"] == pytest.approx(2400)
  acc = coco.DetectionAccumulator(category_ids=(1, 2, 3))
  acc.add([7], [[100, 200]], [(np.array([[0.1, 0.1, 0.4, 0.5], [0.5, 0.5, 0.9, 0.9]]),
                               np.array([0.9, 0.8]), np.array([1, 3]))])
  assert acc.evaluate(gt)["box_map"] == pytest.approx(1.0, abs=1e-12)


def test_perfect_and_empty_detections(tmp_path):
  gt = coco.ground_truth_from_json(_gt_json(tmp_path / "gt.json", box_areas=False))
  id_to_label = {c: k + 1 for k, c in enumerate(coco.COCO_CATEGORY_IDS)}
  perfect = [(image, id_to_label[cat], [x / IMAGES[image][1], y / IMAGES[image][0],
                                        (x + w) / IMAGES[image][1], (y + h) / IMAGES[image][0]],
              1.0)
             for image, cat, (x, y, w, h), crowd, _ in OBJECTS if not crowd]
  assert _accumulate(perfect).evaluate(gt)["box_map"] == pytest.approx(1.0, abs=1e-12)

  empty = _accumulate([]).evaluate(gt)  # four images, none with a detection
  assert empty["box_map"] == 0.0 and empty["stats"][0] == 0.0 and empty["images"] == 4
  assert coco.DetectionAccumulator().evaluate(gt)["box_map"] == 0.0


def test_images_not_added_are_not_scored(tmp_path):
  gt_path = _gt_json(tmp_path / "gt.json", box_areas=False)
  gt = coco.ground_truth_from_json(gt_path)
  # The direct run sees every detection (one on image 202 too) but scores only 101 and 303.
  dt_path = _dt_json(tmp_path / "dt.json", _as_float32(DETECTIONS))
  expected = _direct_stats(gt_path, dt_path, image_ids=[101, 303])
  assert expected[0] != _direct_stats(gt_path, dt_path)[0]  # the subset matters
  result = _accumulate(DETECTIONS, (101, 303)).evaluate(gt)
  assert result["images"] == 2
  np.testing.assert_allclose(result["stats"], expected, rtol=0, atol=1e-12)

  # only_annotated drops image 404 (no objects), as the reference's dataset does.
  without_404 = _direct_stats(gt_path, dt_path, image_ids=[101, 202, 303])
  result = _accumulate(DETECTIONS).evaluate(gt, only_annotated=True)
  assert result["images"] == 3
  np.testing.assert_allclose(result["stats"], without_404, rtol=0, atol=1e-12)


def test_bad_input_is_rejected(tmp_path):
  gt = coco.ground_truth_from_json(_gt_json(tmp_path / "gt.json", box_areas=False))
  acc = _accumulate(DETECTIONS, (101,))
  with pytest.raises(ValueError):
    _accumulate(DETECTIONS, (101,), acc=acc)   # the same image twice
  with pytest.raises(ValueError):
    acc.add([5], [[10, 10]], [(np.zeros((1, 4)), np.ones(1), np.zeros(1, int))])  # background
  acc.add([999], [[10, 10]], [(np.zeros((0, 4)), np.zeros(0), np.zeros(0, int))])
  with pytest.raises(ValueError):
    acc.evaluate(gt)                           # image 999 is not in the ground truth


def test_imports_no_framework():
  code = ("import sys, workloads.common.coco; "
          "assert not {'tensorflow', 'jax'} & set(sys.modules), 'framework imported'")
  subprocess.run([sys.executable, "-c", code], check=True)
