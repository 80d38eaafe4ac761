"""SSD's input, both frameworks: COCO 2017 through tensorflow-datasets, the generated mini set
of shapes (mini_shapes.py, in the same element format), or synthetic batches. The entry points
every workload's input_pipeline.py offers the base trainers:

  data_source(cfg, ctx)  -> (data folder, train_samples to log)       (before run_start)
  train_dataset(cfg, global_batch_size, seed, data_dir, process_index, process_count)
  eval_dataset(cfg, global_batch_size, data_dir, process_index, process_count)
  synthetic_batch(cfg, batch_size, seed) -> numpy batch of the real shapes
and, for the COCO metric, eval_ground_truth(cfg, data_dir) -> pycocotools COCO.

Train batches: {image float32 (B,S,S,3), boxes float32 (B,A,4) encoded offsets, labels int32
(B,A)}: targets are assigned here, per example (boxes.assign_targets), as the reference's
dataset does. Eval batches: {image, image_id int32, image_size float32 (B,2) original
(height, width), mask}.

What the reference's COCODetection (ssd-v1/ssd/utils.py) reads, and so this: every annotation
of an image, crowd ones included, is a training box; images without any annotation are dropped
(117,266 of train2017's 118,287 images are left), in eval too: the reference runs the model on
the 4,952 val2017 images with annotations (train.py logs len(val_coco)), and scores against
the whole json, so the 48 empty images add no false positives. Eval batches are padded for
cfg.data.eval_examples (4,952, spec.COCO_EVAL_EXAMPLES), the same count on every host.
"""
import os

import numpy as np
from workloads.common.host_tf import tf, tfds

from workloads.common import coco, mini_cache, records
from workloads.common.batching import eval_batches_per_host, host_batch_size, pad_and_batch
from workloads.ssd import augment, boxes, mini_shapes, spec

TFDS_NAME = "coco/2017"


# ----------------------------------------------------------------------------- per example

def _ltrb_and_labels(objects):
  """tfds' (ymin, xmin, ymax, xmax) boxes -> (left, top, right, bottom); 0-based labels ->
  model classes 1..C-1 (0 is background)."""
  ymin, xmin, ymax, xmax = tf.unstack(tf.reshape(objects["bbox"], [-1, 4]), axis=1)
  return (tf.stack([xmin, ymin, xmax, ymax], 1),
          tf.cast(objects["label"], tf.int32) + 1)


def _decoded(image):
  """The image as uint8 (H,W,3): tfds coco/2017 read with the image undecoded gives its JPEG
  bytes; the mini set's are arrays already."""
  if image.dtype == tf.string:
    return tf.io.decode_jpeg(image, channels=3)
  return image


def _has_boxes(ex):
  return tf.size(ex["objects"]["label"]) > 0


def _train_example(cfg, seed, augmenting=True):
  """(stream index, tfds element) -> one train example with its anchor targets. The example's
  augmentation draws from (seed, index)."""
  dboxes = tf.constant(boxes.default_boxes(**spec.anchor_geometry(cfg)), tf.float32)

  def fn(index, ex):
    gt_boxes, gt_labels = _ltrb_and_labels(ex["objects"])
    image, gt_boxes, gt_labels = augment.train_preprocess(
        _decoded(ex["image"]), gt_boxes, gt_labels, cfg.data.image_size,
        tf.stack([tf.cast(seed, tf.int64), tf.cast(index, tf.int64)]),
        cfg.data.num_cropping_iterations, augmenting)
    offsets, labels = boxes.assign_targets(gt_boxes, gt_labels, dboxes)
    return {"image": image, "boxes": offsets, "labels": tf.cast(labels, tf.int32)}
  return fn


def _eval_example(cfg):
  def fn(ex):
    image = _decoded(ex["image"])
    return {"image": augment.eval_preprocess(image, cfg.data.image_size),
            "image_id": tf.cast(ex["image/id"], tf.int32),
            "image_size": tf.cast(tf.shape(image)[:2], tf.float32)}
  return fn


# ----------------------------------------------------------------------------- mini

def _mini_folder(cfg, data_dir):
  """data_source's folder when given it, else the set prepared in the default cache."""
  if data_dir and os.path.exists(os.path.join(data_dir, "train.npz")):
    return data_dir
  return mini_shapes.prepare(cfg.data)


def mini_train(cfg, global_batch_size, seed, data_dir=None, process_index=0, process_count=1,
               augmenting=True):
  """Each host prepares only its slice of the same seeded global batch; the augmentation is
  seeded by the example's position in the global stream, so the global batches do not depend
  on the number of hosts."""
  host = host_batch_size(global_batch_size, process_count)
  ds = mini_shapes.dataset(mini_shapes.load(_mini_folder(cfg, data_dir), "train")).cache()
  ds = ds.filter(_has_boxes).repeat().shuffle(cfg.data.shuffle_buffer, seed=seed).enumerate()
  if process_count > 1:
    ds = ds.filter(lambda i, ex: (i % global_batch_size) // host == process_index)
  ds = ds.map(_train_example(cfg, seed, augmenting), num_parallel_calls=tf.data.AUTOTUNE)
  return ds.batch(host, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def mini_eval(cfg, global_batch_size, data_dir=None, process_index=0, process_count=1):
  ds = mini_shapes.dataset(mini_shapes.load(_mini_folder(cfg, data_dir), "eval"))
  ds = ds.shard(process_count, process_index).map(_eval_example(cfg),
                                                  num_parallel_calls=tf.data.AUTOTUNE)
  return _padded(ds, cfg.data.eval_examples, global_batch_size, process_count).cache().prefetch(
      tf.data.AUTOTUNE)


def _padded(ds, eval_examples, global_batch_size, process_count):
  """Padded batches of global/process_count, exactly as many on every host as the trainers
  run (batching.eval_batches_per_host), with one host too."""
  host = host_batch_size(global_batch_size, process_count)
  return pad_and_batch(ds, host, eval_batches_per_host(eval_examples, host, process_count))


# ----------------------------------------------------------------------------- COCO 2017

def _coco_split(data_dir, split, process_index=0, process_count=1, shuffle_seed=None,
                decoders=None):
  """This host's share of a split (tfds.even_splits: every example on exactly one host), the
  image left as JPEG bytes (decoded after filtering and shuffling, which then hold bytes)."""
  host_split = tfds.even_splits(split, n=process_count, drop_remainder=False)[process_index]
  read_config = tfds.ReadConfig(shuffle_seed=shuffle_seed)
  return records.noted_tfds(tfds.builder(TFDS_NAME, data_dir=data_dir)).as_dataset(
      split=host_split, shuffle_files=shuffle_seed is not None, read_config=read_config,
      decoders=decoders or {"image": tfds.decode.SkipDecoding()})


def coco_train(cfg, global_batch_size, seed, data_dir, process_index=0, process_count=1,
               augmenting=True):
  host = host_batch_size(global_batch_size, process_count)
  ds = _coco_split(data_dir, "train", process_index, process_count, shuffle_seed=seed)
  options = tf.data.Options()
  options.deterministic = False        # throughput over order; the shuffle is still seeded
  ds = ds.with_options(options).filter(_has_boxes).repeat()
  ds = ds.shuffle(cfg.data.shuffle_buffer, seed=seed).enumerate()
  # Each host reads other images: its stream positions are interleaved with the other hosts'
  # so no two hosts draw the same augmentation for their i-th example.
  ds = ds.map(lambda i, ex: (i * process_count + process_index, ex))
  ds = ds.map(_train_example(cfg, seed, augmenting), num_parallel_calls=tf.data.AUTOTUNE)
  return ds.batch(host, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def coco_eval(cfg, global_batch_size, data_dir, process_index=0, process_count=1):
  ds = _coco_split(data_dir, "validation", process_index, process_count).filter(_has_boxes)
  ds = ds.map(_eval_example(cfg), num_parallel_calls=tf.data.AUTOTUNE)
  splits = tfds.builder(TFDS_NAME, data_dir=data_dir).info.splits
  # The split's real size when larger, so no host ever truncates its share.
  total = max(cfg.data.eval_examples,
              splits["validation"].num_examples if "validation" in splits else 0)
  return _padded(ds, total, global_batch_size, process_count).prefetch(tf.data.AUTOTUNE)


def count_train_examples(data_dir, cache_root=None) -> int:
  """Train images with at least one annotation (the reference's len(COCODetection)), counted
  once from the split's objects (images are not decoded) and kept in the mini-set cache,
  keyed by the dataset folder, since it reads every record."""
  builder = tfds.builder(TFDS_NAME, data_dir=data_dir)

  def write(_):
    ds = _coco_split(data_dir, "train")
    count = ds.map(lambda ex: tf.cast(tf.size(ex["objects"]["label"]) > 0, tf.int64),
                   num_parallel_calls=tf.data.AUTOTUNE).reduce(tf.constant(0, tf.int64),
                                                               lambda a, b: a + b)
    return {"train_examples": int(count)}
  splits = builder.info.splits
  fields = {"data_dir": os.path.abspath(builder.data_dir), "what": "coco_train_with_boxes",
            "split_size": splits["train"].num_examples if "train" in splits else None}
  _, info = mini_cache.prepare(cache_root or mini_cache.default_root("ssd"), fields, write)
  return info["train_examples"]


def coco_records(data_dir, split="validation") -> list[dict]:
  """Ground-truth records of a tfds split (coco.ground_truth_from_records' input); the image
  size comes from the JPEG header."""
  ds = _coco_split(data_dir, split).map(
      lambda ex: {"image_id": ex["image/id"], "shape": tf.io.extract_jpeg_shape(ex["image"]),
                  "objects": ex["objects"]}, num_parallel_calls=tf.data.AUTOTUNE)
  return [{"image_id": int(ex["image_id"]), "height": int(ex["shape"][0]),
           "width": int(ex["shape"][1]), "boxes": ex["objects"]["bbox"].reshape(-1, 4),
           "labels": ex["objects"]["label"], "is_crowd": ex["objects"]["is_crowd"],
           "areas": ex["objects"]["area"]}
          for ex in ds.as_numpy_iterator()]


# ----------------------------------------------------------------------------- entry points

def data_source(cfg, ctx):
  """(data folder, train_samples to log). Mini: generates its arrays once (untimed, before
  run_start) under --data-dir/ssd_mini or ~/.cache; COCO: counts the train images with boxes
  (once per dataset folder). Without --data-dir (`describe`) nothing is read: the config's
  count stands."""
  if cfg.data.source == "mini":
    root = os.path.join(ctx.data_dir, "ssd_mini") if ctx.data_dir else None
    return mini_shapes.prepare(cfg.data, root), cfg.data.train_examples
  if cfg.data.source == "coco2017" and ctx.data_dir:
    return ctx.data_dir, count_train_examples(ctx.data_dir)
  return ctx.data_dir, cfg.data.train_examples


def train_dataset(cfg, global_batch_size, seed, data_dir=None, process_index=0, process_count=1,
                  augmenting=True):
  """This host's slice of every global batch, forever. augmenting=False: resize and normalise
  only (tests)."""
  if cfg.data.source == "mini":
    return mini_train(cfg, global_batch_size, seed, data_dir, process_index, process_count,
                      augmenting)
  return coco_train(cfg, global_batch_size, seed, data_dir, process_index, process_count,
                    augmenting)


def eval_dataset(cfg, global_batch_size, data_dir=None, process_index=0, process_count=1):
  """This host's share of the eval split, every image on exactly one host, in padded batches
  of global/process_count (the same count on every host)."""
  if cfg.data.source == "mini":
    return mini_eval(cfg, global_batch_size, data_dir, process_index, process_count)
  return coco_eval(cfg, global_batch_size, data_dir, process_index, process_count)


def eval_ground_truth(cfg, data_dir):
  """The eval split's ground truth as a pycocotools COCO: the mini set's records; for COCO the
  annotation json in data_dir when there is one, else rebuilt from the tfds split."""
  num_categories = cfg.model.num_classes - 1
  if cfg.data.source == "mini":
    arrays = mini_shapes.load(_mini_folder(cfg, data_dir), "eval")
    return coco.ground_truth_from_records(mini_shapes.records(arrays),
                                          num_categories=num_categories)
  path = os.path.join(data_dir, cfg.data.annotations)
  if os.path.exists(path):
    return coco.ground_truth_from_json(path)
  return coco.ground_truth_from_records(coco_records(data_dir), num_categories=num_categories)


def synthetic_batch(cfg, batch_size, seed):
  """A train batch of the real layout: random images, ~1% positive anchors with random
  classes, finite offsets."""
  rng = np.random.default_rng(seed)
  size, anchors = cfg.data.image_size, spec.num_anchors(cfg)
  positive = rng.random((batch_size, anchors)) < 0.01
  labels = np.where(positive, rng.integers(1, cfg.model.num_classes, (batch_size, anchors)), 0)
  return {"image": rng.standard_normal((batch_size, size, size, 3), np.float32),
          "boxes": rng.standard_normal((batch_size, anchors, 4), np.float32),
          "labels": labels.astype(np.int32)}
