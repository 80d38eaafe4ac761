"""The host side of the COCO eval, shared by both trainers (framework-neutral). The device eval
step has decoded each image's boxes and kept each class's MAX_CANDIDATES best anchors (the
reference's decode_single keeps no more before its NMS); here, per image, the reference's
per-class NMS and top MAX_OUTPUT (boxes.nms_candidates), then the detections go to a COCO
accumulator (original-image pixels, COCO category ids) and COCOeval scores them once at the end.
Padding rows (mask 0) are dropped, so every val image counts exactly once."""
from workloads.common import coco
from workloads.ssd import boxes

MAX_CANDIDATES = 200        # per class, before NMS (reference decode_single max_num)
MAX_OUTPUT = 200            # per image, after NMS (reference max_output)
SCORE_THRESHOLD = 0.05      # reference nms_valid_thresh
IOU_THRESHOLD = 0.5         # reference criteria


def category_ids(cfg):
  """COCO's 80 ids for COCO; 1..C for a generated set of C classes."""
  if cfg.data.source == "coco2017":
    return coco.COCO_CATEGORY_IDS
  return tuple(range(1, cfg.model.num_classes))


def accumulate(acc, outputs, cfg):
  """outputs (numpy, the whole global batch): boxes (B, C-1, K, 4), scores (B, C-1, K),
  image_id (B,), image_size (B, 2), mask (B,)."""
  if acc is None:
    acc = coco.DetectionAccumulator(category_ids(cfg))
  real = outputs["mask"] > 0
  detections = [boxes.nms_candidates(b, s, SCORE_THRESHOLD, IOU_THRESHOLD, MAX_OUTPUT)
                for b, s in zip(outputs["boxes"][real], outputs["scores"][real])]
  acc.add(outputs["image_id"][real], outputs["image_size"][real], detections)
  return acc


def finalize(acc, ground_truth, metric_name):
  result = acc.evaluate(ground_truth)
  return {metric_name: float(result["box_map"]), "count": int(result["images"])}


class CocoEvaluator:
  """SSD's Evaluator (harness.workload): every batch's candidates on the host, NMS and the COCO
  accumulator, COCOeval at finalize; the ground truth is read at the first finalize (after
  run_start) and kept."""
  on_host = True

  def __init__(self, cfg, data_dir, metric_name, pipeline):
    """`pipeline()`: the workload's input pipeline, which reads the ground truth (tf.data: it
    loads with the framework, at the first finalize)."""
    self.cfg, self.data_dir, self.metric_name = cfg, data_dir, metric_name
    self._pipeline, self._ground_truth = pipeline, None

  def accumulate(self, acc, outputs):
    return accumulate(acc, outputs, self.cfg)

  def finalize(self, acc):
    if self._ground_truth is None:
      self._ground_truth = self._pipeline().eval_ground_truth(self.cfg, self.data_dir)
    return finalize(acc, self._ground_truth, self.metric_name)
