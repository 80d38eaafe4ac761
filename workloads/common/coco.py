"""COCO box mAP as the MLPerf SSD reference scores it (mlcommons/training, retired_benchmarks/
ssd-v1/ssd/train.py `coco_eval`): every detection becomes a row [image_id, x, y, w, h, score,
category_id] in original-image pixels, pycocotools' COCOeval(gt, dt, 'bbox') runs
evaluate/accumulate/summarize, and the metric is stats[0] (AP averaged over IoU .50:.95, all
areas, 100 detections per image).

The model predicts labels 1..80 (0 is background); label k is the k-th COCO category id in the
order instances_val2017.json lists them (ascending id), as the reference's COCODetection builds
its label map. tensorflow-datasets' coco/2017 `objects/label` is the same index starting at 0.

Detections are gathered per image on each host (`DetectionAccumulator.add`), can be merged
across hosts (`merge`), and are scored once against a ground truth read from the official json
(`ground_truth_from_json`) or built in memory from tfds-style records
(`ground_truth_from_records`). Framework-neutral: numpy and pycocotools only."""
import contextlib
import io

import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

# The 80 category ids COCO 2017 uses, ascending (1..90 with gaps at 12, 26, 29, 30, 45, 66, 68,
# 69, 71 and 83).
COCO_CATEGORY_IDS = tuple(
    [*range(1, 12), *range(13, 26), 27, 28, *range(31, 45), *range(46, 66), 67, 70,
     *range(72, 83), *range(84, 91)])


def category_id(label):
  """COCO category id of reference label(s) 1..80 (scalar or array)."""
  label = np.asarray(label)
  if np.any((label < 1) | (label > len(COCO_CATEGORY_IDS))):
    raise ValueError(f"labels must lie in 1..{len(COCO_CATEGORY_IDS)}")
  ids = np.asarray(COCO_CATEGORY_IDS)[label - 1]
  return int(ids) if ids.ndim == 0 else ids


@contextlib.contextmanager
def _quiet():
  """pycocotools prints progress and the summary table on stdout; keep the harness log clean."""
  with contextlib.redirect_stdout(io.StringIO()):
    yield


def _coco_from_dataset(dataset):
  with _quiet():
    coco = COCO()
    coco.dataset = dataset
    coco.createIndex()
  return coco


def ground_truth_from_json(path):
  """The ground truth from an official annotation file (instances_val2017.json)."""
  with _quiet():
    return COCO(path)


def ground_truth_from_records(records, num_categories=80, category_ids=None):
  """The ground truth built in memory from tensorflow-datasets-style records.

  Each record is a dict with "image_id" (int), "height" and "width" (original pixels), "boxes"
  ((n, 4) normalised ymin, xmin, ymax, xmax: tfds coco/2017 `objects/bbox`), "labels" ((n,)
  ints 0..C-1 indexing the sorted category list: tfds `objects/label`), and optionally
  "is_crowd" ((n,) bool, default False) and "areas" ((n,) annotation areas in pixels).

  Category ids: `category_ids` if given; otherwise COCO's 80 ids when num_categories == 80, else
  1..num_categories (for generated data sets).

  Areas: without "areas" each object's area is its box area w*h in pixels. The official json's
  area is the segmentation mask's area (smaller than the box for most objects), and COCOeval
  only uses it to place objects in the small/medium/large ranges. So stats[3..5] and the
  per-size recalls can differ slightly from the official scores, while stats[0] (area 'all',
  the range [0, 1e5**2] in cocoeval.Params.setDetParams, which holds every possible box and
  mask area) does not change. tfds coco/2017 1.1.0 does keep the json area, as int64, in
  `objects/area`: pass it as "areas" for official size ranges (up to the int truncation)."""
  records = list(records)
  if category_ids is None:
    category_ids = (COCO_CATEGORY_IDS if num_categories == len(COCO_CATEGORY_IDS)
                    else tuple(range(1, num_categories + 1)))
  cat_ids = np.asarray(category_ids)
  images, annotations = [], []
  for rec in records:
    height, width = float(rec["height"]), float(rec["width"])
    boxes = np.asarray(rec["boxes"], np.float64).reshape(-1, 4)
    labels = np.asarray(rec["labels"], np.int64).reshape(-1)
    crowd = np.asarray(rec.get("is_crowd", np.zeros(len(labels), bool)), bool).reshape(-1)
    ymin, xmin = boxes[:, 0] * height, boxes[:, 1] * width
    h, w = boxes[:, 2] * height - ymin, boxes[:, 3] * width - xmin
    areas = np.asarray(rec["areas"], np.float64) if "areas" in rec else w * h
    images.append({"id": int(rec["image_id"]), "height": int(rec["height"]),
                   "width": int(rec["width"])})
    for i in range(len(labels)):
      annotations.append({
          # Annotation ids must not be 0: COCOeval marks "unmatched" with a 0 id.
          "id": len(annotations) + 1, "image_id": int(rec["image_id"]),
          "category_id": int(cat_ids[labels[i]]),
          "bbox": [float(xmin[i]), float(ymin[i]), float(w[i]), float(h[i])],
          "area": float(areas[i]), "iscrowd": int(crowd[i])})
  return _coco_from_dataset({
      "info": {},  # COCO.loadRes copies dataset["info"] (pycocotools 2.0.10) and fails without
      "images": images, "annotations": annotations,
      "categories": [{"id": int(c), "name": str(int(c)), "supercategory": ""} for c in cat_ids]})


class DetectionAccumulator:
  """Collects per-image detections as reference-format rows and scores them with COCOeval."""

  def __init__(self, category_ids=COCO_CATEGORY_IDS):
    self.category_ids = tuple(int(c) for c in category_ids)
    self._chunks = [np.zeros((0, 7), np.float64)]  # concatenated lazily by `rows`
    self._image_ids = []

  def __len__(self):
    return len(self._image_ids)

  @property
  def num_images(self):
    return len(self._image_ids)

  @property
  def image_ids(self):
    return list(self._image_ids)

  @property
  def rows(self):
    """All detections as one (rows, 7) float64 array [image_id, x, y, w, h, score, category]."""
    if len(self._chunks) > 1:
      self._chunks = [np.concatenate(self._chunks)]
    return self._chunks[0]

  def add(self, image_ids, image_sizes, detections):
    """Adds N images: ids (N,), original (height, width) (N, 2), and per image a tuple of
    normalised ltrb boxes (k, 4), scores (k,) and labels 1..C (k,); k may be 0."""
    image_ids = [int(i) for i in np.asarray(image_ids).reshape(-1)]
    image_sizes = np.asarray(image_sizes, np.float64).reshape(-1, 2)
    if not len(image_ids) == len(image_sizes) == len(detections):
      raise ValueError("image_ids, image_sizes and detections must have one entry per image")
    seen = set(self._image_ids)
    if len(set(image_ids)) != len(image_ids) or seen.intersection(image_ids):
      # A repeated image (e.g. eval padding left unmasked) would count its detections twice.
      raise ValueError("an image was added twice")
    cat_ids = np.asarray(self.category_ids)
    chunks = []  # kept aside until every image checks out, so a bad batch adds nothing
    for image_id, (height, width), (boxes, scores, labels) in zip(
        image_ids, image_sizes, detections):
      boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
      scores = np.asarray(scores, np.float64).reshape(-1)
      labels = np.asarray(labels, np.int64).reshape(-1)
      if not len(boxes) == len(scores) == len(labels):
        raise ValueError("boxes, scores and labels of an image differ in length")
      if len(labels) == 0:
        continue
      if labels.min() < 1 or labels.max() > len(cat_ids):
        raise ValueError(f"labels must lie in 1..{len(cat_ids)} (0 is background)")
      left, top, right, bottom = boxes.T
      # The reference's conversion from the resized image's [0, 1] ltrb to original pixels.
      chunks.append(np.stack([
          np.full(len(labels), image_id, np.float64),
          left * width, top * height, (right - left) * width, (bottom - top) * height,
          scores, cat_ids[labels - 1].astype(np.float64)], axis=1))
    self._chunks.extend(chunks)
    self._image_ids.extend(image_ids)

  def merge(self, other):
    """Adds another accumulator's images and detections (e.g. gathered from another host)."""
    if other.category_ids != self.category_ids:
      raise ValueError("accumulators map labels to different categories")
    if set(self._image_ids).intersection(other.image_ids):
      raise ValueError("an image was added twice")
    self._chunks.append(other.rows)
    self._image_ids.extend(other.image_ids)
    return self

  def evaluate(self, ground_truth, only_annotated=False):
    """COCOeval 'bbox' over exactly the images added (a subset is scored as that subset).

    only_annotated=True also leaves out images without any ground-truth annotation, as the
    reference does (its COCODetection drops them, so val2017 is scored on 4952 of 5000 images);
    detections on such images would otherwise count as false positives.

    Returns {"box_map": stats[0], "stats": the 12 summary stats, "images": images scored}."""
    image_ids = sorted(self._image_ids)
    unknown = set(image_ids).difference(ground_truth.getImgIds())
    if unknown:
      raise ValueError(f"{len(unknown)} image ids are not in the ground truth, e.g. "
                       f"{sorted(unknown)[:5]}")
    if only_annotated:
      image_ids = [i for i in image_ids if ground_truth.getAnnIds(imgIds=[i])]
    if not image_ids:
      # COCOeval reads an empty imgIds as "every image"; with nothing to score, say so (-1 is
      # COCOeval's "undefined").
      return {"box_map": 0.0, "stats": [-1.0] * 12, "images": 0}
    rows = self.rows  # COCOeval itself leaves out rows of images outside params.imgIds
    with _quiet():
      if len(rows):
        detections = ground_truth.loadRes([
            {"image_id": int(r[0]), "bbox": r[1:5], "score": r[5], "category_id": int(r[6])}
            for r in rows.tolist()])
      else:
        # COCO.loadRes indexes the first result, so it cannot take an empty list; an empty
        # result set scores every ground-truth object as missed.
        detections = _coco_from_dataset({
            "info": {}, "images": ground_truth.dataset["images"], "annotations": [],
            "categories": ground_truth.dataset["categories"]})
      evaluator = COCOeval(ground_truth, detections, "bbox")
      evaluator.params.imgIds = image_ids
      evaluator.evaluate()
      evaluator.accumulate()
      evaluator.summarize()
    stats = [float(s) for s in evaluator.stats]
    # COCOeval reports -1 where nothing could be scored (no ground truth at all); the quality
    # target compares against a fraction, so report that as 0.
    return {"box_map": max(stats[0], 0.0), "stats": stats, "images": len(image_ids)}
