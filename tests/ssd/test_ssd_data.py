"""SSD data: the generated mini set, the reference's augmentation, and the input pipelines on
the mini set and on COCO 2017 in tensorflow-datasets' real format (tfds.testing.mock_data,
fed hand-made examples through the real coco/2017 features: JPEG-encoded images, objects)."""
import dataclasses
import functools
import json
import random
import types

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from workloads.common.batching import eval_batches_per_host
from workloads.ssd import augment, boxes, input_pipeline, mini_shapes, spec


@pytest.fixture
def cfg(tmp_path, monkeypatch):
  """The tiny preset, its generated sets cached under tmp_path."""
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  return spec.tiny()


def _mini_arrays(cfg, split):
  return mini_shapes.load(mini_shapes.prepare(cfg.data), split)


# ----------------------------------------------------------------------------- mini set

def test_mini_set_is_deterministic_and_its_boxes_enclose_exactly_the_drawn_pixels(cfg):
  a, b = mini_shapes.generate(cfg.data, "eval"), mini_shapes.generate(cfg.data, "eval")
  assert all(a[k].tobytes() == b[k].tobytes() for k in a)
  assert not np.array_equal(mini_shapes.generate(cfg.data, "train")["image"][:24], a["image"])
  cached = _mini_arrays(cfg, "eval")
  assert all(np.array_equal(cached[k], a[k]) for k in a)

  size, noise = cfg.data.image_size, cfg.data.mini_pixel_noise
  assert a["image"].shape == (cfg.data.eval_examples, size, size, 3)
  assert set(a["count"]) <= set(range(1, cfg.data.mini_max_objects + 1))
  for image, bbox, label, count in zip(a["image"], a["bbox"], a["label"], a["count"]):
    pixels = np.rint(bbox[:count] * size).astype(int)        # ymin, xmin, ymax, xmax edges
    assert np.allclose(pixels, bbox[:count] * size, atol=1e-4)
    assert set(label[:count]) <= {0, 1, 2, 3} and (label[count:] == -1).all()
    sides = np.concatenate([pixels[:, 2] - pixels[:, 0], pixels[:, 3] - pixels[:, 1]])
    assert sides.min() >= 10 and sides.max() <= 40
    # The background: the median colour outside every box; a pixel is drawn when it differs
    # from it by far more than the noise (the shapes differ by >= 64 in each channel).
    outside = np.ones((size, size), bool)
    for y0, x0, y1, x1 in pixels:
      outside[y0:y1, x0:x1] = False
    background = np.median(image[outside], axis=0)
    drawn = np.abs(image.astype(float) - background).mean(-1) > 4 * noise
    assert not drawn[outside].any()
    for y0, x0, y1, x1 in pixels:         # the tight box of the drawn pixels is the box
      rows, cols = np.nonzero(drawn[y0:y1, x0:x1])
      assert (rows.min(), cols.min(), rows.max() + 1, cols.max() + 1) == (
          0, 0, y1 - y0, x1 - x0)


def test_mini_elements_have_the_tfds_coco_structure(cfg):
  ex = next(iter(mini_shapes.dataset(_mini_arrays(cfg, "eval"))))
  obj = ex["objects"]
  assert ex["image"].dtype == tf.uint8 and ex["image"].shape == (64, 64, 3)
  assert ex["image/id"].dtype == tf.int64 and ex["image/filename"].dtype == tf.string
  assert obj["bbox"].dtype == tf.float32 and obj["bbox"].shape[1] == 4
  assert obj["label"].dtype == tf.int64 and obj["is_crowd"].dtype == tf.bool
  assert obj["area"].dtype == tf.int64 and obj["id"].dtype == tf.int64
  assert len({len(v) for v in obj.values()}) == 1


# ----------------------------------------------------------------------------- augmentation

def test_flip_mirrors_image_and_boxes():
  image = np.zeros((4, 6, 3), np.uint8)
  image[1, 0] = 255                                  # a pixel in the first column
  flipped, fboxes = augment.flip(tf.constant(image), tf.constant([[0.0, 0.25, 0.5, 0.75]]))
  assert flipped.numpy()[1, 5].tolist() == [255] * 3 and flipped.numpy()[1, 0].sum() == 0
  np.testing.assert_allclose(fboxes.numpy(), [[0.5, 0.25, 1.0, 0.75]])


def test_crop_keeps_the_boxes_whose_centres_are_inside_clipped_and_relative():
  image = tf.reshape(tf.range(10 * 20 * 3, dtype=tf.int32), (10, 20, 3))
  gt = tf.constant([[0.0, 0.0, 0.5, 0.5],       # centre (0.25, 0.25): inside
                    [0.05, 0.1, 0.15, 0.2],     # centre (0.1, 0.15): left of the window
                    [0.6, 0.6, 1.0, 1.0],       # centre (0.8, 0.8): inside, cut at the right
                    [0.7, 0.2, 0.9, 0.3]])      # centre (0.8, 0.25): inside
  window = tf.constant([0.2, 0.1, 0.9, 0.9])   # left, top, right, bottom
  out, kept, labels = augment.apply_crop(image, gt, tf.constant([1, 2, 3, 4]), window)
  assert labels.numpy().tolist() == [1, 3, 4]
  np.testing.assert_allclose(kept.numpy(), [[0, 0, 0.3 / 0.7, 0.4 / 0.8],
                                            [0.4 / 0.7, 0.5 / 0.8, 1, 1],
                                            [0.5 / 0.7, 0.1 / 0.8, 1, 0.2 / 0.8]], atol=1e-6)
  np.testing.assert_array_equal(out.numpy(), image.numpy()[1:9, 4:18])   # int(x * side)


def test_crop_choices_follow_the_reference_conditions():
  rng = np.random.default_rng(0)
  xy = rng.uniform(0, 0.7, (3, 2))
  gt = tf.constant(np.concatenate([xy, xy + rng.uniform(0.05, 0.3, (3, 2))], 1), tf.float32)
  sample = tf.function(lambda seed: augment.sample_crop(gt, seed, 1))
  cropped_count = 0
  for i in range(60):
    window, cropped = sample(tf.constant([7, i], tf.int64))
    window = window.numpy()
    if not cropped:
      assert window.tolist() == [0, 0, 1, 1]
      continue
    cropped_count += 1
    w, h = window[2] - window[0], window[3] - window[1]
    assert 0.3 <= w <= 1 and 0.3 <= h <= 1 and 0.5 <= w / h <= 2
    assert window.min() >= 0 and window.max() <= 1 + 1e-6
    centres = (gt.numpy()[:, :2] + gt.numpy()[:, 2:]) / 2
    assert ((centres > window[:2]) & (centres < window[2:])).all(1).any()
  assert 0 < cropped_count < 60         # each round keeps the image whole with p = 1/7


def _reference_crop(gt, rng, num_iterations):
  """SSDCropping's loop as the reference writes it (one round after another, each try drawn
  and judged in turn, with Python's random): the window, or None for the whole image."""
  def iou(box, window):
    inter = (max(min(box[2], window[2]) - max(box[0], window[0]), 0.0)
             * max(min(box[3], window[3]) - max(box[1], window[1]), 0.0))
    area = lambda b: (b[2] - b[0]) * (b[3] - b[1])
    return inter / (area(box) + area(window) - inter)

  for _ in range(augment.MAX_CROP_ROUNDS):
    min_iou = rng.choice(augment.CROP_MIN_IOU)
    if min_iou is None:
      return None
    for _ in range(num_iterations):
      w, h = rng.uniform(0.3, 1.0), rng.uniform(0.3, 1.0)
      if not 0.5 <= w / h <= 2:
        continue
      left, top = rng.uniform(0, 1 - w), rng.uniform(0, 1 - h)
      window = (left, top, left + w, top + h)
      if not all(iou(box, window) > min_iou for box in gt):
        continue
      if not any(left < (b[0] + b[2]) / 2 < left + w and top < (b[1] + b[3]) / 2 < top + h
                 for b in gt):
        continue
      return window
  return None


@pytest.mark.parametrize("num_iterations", [1, 3])
def test_crop_draws_all_rounds_at_once_with_the_reference_loops_distribution(num_iterations):
  """sample_crop judges every round at once and takes the first that ends; the reference
  tries them one after another. Same distribution: the share of cropped images and the mean
  crop area agree within 5 standard errors (3,000 draws against 30,000 of the loop)."""
  gt = np.array([[0.1, 0.2, 0.35, 0.5], [0.5, 0.45, 0.9, 0.95], [0.3, 0.05, 0.6, 0.3]],
                np.float32)
  draws = tf.data.Dataset.range(3000).map(
      lambda i: augment.sample_crop(tf.constant(gt), tf.stack([tf.constant(11, tf.int64), i]),
                                    num_iterations)).batch(3000).get_single_element()
  windows, cropped = draws[0].numpy().astype(np.float64), draws[1].numpy()
  rng = random.Random(5)
  reference = [_reference_crop(gt.astype(np.float64).tolist(), rng, num_iterations)
               for _ in range(30000)]
  ref_cropped = np.array([w is not None for w in reference])

  def agree(ours, theirs):
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    stderr = np.sqrt(ours.var() / len(ours) + theirs.var() / len(theirs))
    assert abs(ours.mean() - theirs.mean()) < 5 * stderr, (ours.mean(), theirs.mean(), stderr)
  agree(cropped, ref_cropped)
  area = lambda w: (w[:, 2] - w[:, 0]) * (w[:, 3] - w[:, 1])
  agree(area(windows[cropped]), area(np.array([w for w in reference if w is not None])))
  assert (windows[~cropped] == [0, 0, 1, 1]).all()


def test_train_augmentation_keeps_boxes_inside_the_image():
  image = tf.constant(np.random.default_rng(1).integers(0, 256, (48, 80, 3)), tf.uint8)
  gt = tf.constant([[0.1, 0.2, 0.5, 0.9], [0.55, 0.05, 0.95, 0.4]])
  fn = tf.function(lambda s: augment.train_preprocess(image, gt, tf.constant([1, 2]), 32, s, 3))
  for i in range(20):
    out, b, l = fn(tf.constant([3, i], tf.int64))
    assert out.shape == (32, 32, 3) and np.isfinite(out.numpy()).all()
    assert len(b) >= 1 and b.numpy().min() >= 0 and b.numpy().max() <= 1
    assert (b.numpy()[:, 2:] >= b.numpy()[:, :2]).all() and set(l.numpy()) <= {1, 2}
    # ImageNet normalisation of [0,1] pixels.
    lo = (0 - np.array(augment.MEAN)) / augment.STD
    hi = (1 - np.array(augment.MEAN)) / augment.STD
    assert (out.numpy() >= lo - 1e-5).all() and (out.numpy() <= hi + 1e-5).all()


# ----------------------------------------------------------------------------- mini pipelines

def test_train_batches_have_the_layout_and_the_reference_targets(cfg):
  batch = next(input_pipeline.train_dataset(cfg, 16, seed=0, augmenting=False)
               .as_numpy_iterator())
  layout = spec.batch_layout(cfg, 16)
  assert batch.keys() == layout.keys()
  for k, (shape, dtype, _) in layout.items():
    assert batch[k].shape == shape and batch[k].dtype == dtype, k
  # Unaugmented: the image is the set's image normalised; find each one and check its
  # targets against boxes.match + encode (numpy) of its boxes.
  arrays = _mini_arrays(cfg, "train")
  dboxes = boxes.default_boxes(**spec.anchor_geometry(cfg))
  normalised = (arrays["image"] / 255.0 - augment.MEAN) / augment.STD
  for image, offsets, labels in zip(batch["image"], batch["boxes"], batch["labels"]):
    j = np.abs(normalised - image).reshape(len(normalised), -1).max(1).argmin()
    np.testing.assert_allclose(normalised[j], image, atol=1e-5)
    n = arrays["count"][j]
    ymin, xmin, ymax, xmax = arrays["bbox"][j, :n].T
    xywh, want = boxes.match(np.stack([xmin, ymin, xmax, ymax], 1), arrays["label"][j, :n] + 1,
                             dboxes)
    np.testing.assert_array_equal(labels, want)
    np.testing.assert_allclose(offsets, boxes.encode(xywh, dboxes), rtol=1e-5, atol=1e-5)
    assert (labels > 0).sum() >= n        # every object has at least its best anchor


def test_augmented_batches_are_seeded_and_host_slices_of_the_global_batch(cfg):
  take = lambda ds: next(ds.as_numpy_iterator())
  one = take(input_pipeline.train_dataset(cfg, 16, seed=3))
  again = take(input_pipeline.train_dataset(cfg, 16, seed=3))
  assert all(np.array_equal(one[k], again[k]) for k in one)
  assert np.isfinite(one["image"]).all() and np.isfinite(one["boxes"]).all()
  assert ((one["labels"] > 0).sum(1) >= 1).all()
  assert one["labels"].max() < cfg.model.num_classes
  for host in range(2):
    part = take(input_pipeline.train_dataset(cfg, 16, seed=3, process_index=host,
                                             process_count=2))
    assert all(np.array_equal(part[k], one[k][host * 8:(host + 1) * 8]) for k in one)


@pytest.mark.parametrize("hosts", [1, 2])
def test_eval_covers_every_image_once(cfg, hosts):
  layout = spec.batch_layout(cfg, 16 // hosts, with_mask=True)
  ids, steps = [], []
  for host in range(hosts):
    batches = list(input_pipeline.eval_dataset(cfg, 16, None, host, hosts).as_numpy_iterator())
    steps.append(len(batches))
    for b in batches:
      assert all(b[k].shape == s and b[k].dtype == d for k, (s, d, _) in layout.items())
      real = b["mask"] == 1
      ids += b["image_id"][real].tolist()
      assert (b["image_size"][real] == 64).all()
  assert sorted(ids) == list(range(1, cfg.data.eval_examples + 1))
  assert steps == [eval_batches_per_host(cfg.data.eval_examples, 16 // hosts, hosts)] * hosts


def test_mini_ground_truth_and_data_source(cfg, tmp_path):
  folder, samples = input_pipeline.data_source(cfg, types.SimpleNamespace(data_dir=str(tmp_path)))
  assert samples == cfg.data.train_examples and folder.startswith(str(tmp_path / "ssd_mini"))
  arrays = mini_shapes.load(folder, "eval")
  gt = input_pipeline.eval_ground_truth(cfg, folder)
  assert sorted(gt.getImgIds()) == list(range(1, cfg.data.eval_examples + 1))
  assert len(gt.getAnnIds()) == arrays["count"].sum()
  assert sorted(gt.getCatIds()) == [1, 2, 3, 4]
  ann = gt.loadAnns(gt.getAnnIds(imgIds=[1]))[0]
  ymin, xmin, ymax, xmax = arrays["bbox"][0, 0] * 64
  np.testing.assert_allclose(ann["bbox"], [xmin, ymin, xmax - xmin, ymax - ymin], atol=1e-4)


def test_synthetic_batch_has_the_train_layout(cfg):
  batch = input_pipeline.synthetic_batch(cfg, 8, seed=0)
  for k, (shape, dtype, _) in spec.batch_layout(cfg, 8).items():
    assert batch[k].shape == shape and batch[k].dtype == dtype
  positive = (batch["labels"] > 0).mean()
  assert 0.002 < positive < 0.05 and batch["labels"].max() < cfg.model.num_classes
  assert np.isfinite(batch["boxes"]).all()


# ----------------------------------------------------------------------------- COCO (tfds mock)

def _coco_examples(split, count, seed):
  """Examples in the decoded coco/2017 form: varied image sizes, a few objects each; image 1
  has no annotations, image 2 a crowd box first."""
  rng = np.random.default_rng(seed)
  out = []
  for i in range(count):
    h, w = rng.integers(40, 90, 2)
    n = 0 if i == 1 else int(rng.integers(1, 4))
    ymin, xmin = rng.uniform(0, 0.6, (2, n))
    ymax, xmax = ymin + rng.uniform(0.1, 0.4, n), xmin + rng.uniform(0.1, 0.4, n)
    out.append({"image": rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
                "image/filename": f"{i:012d}.jpg", "image/id": 1000 * (seed + 1) + i,
                "objects": {"id": np.arange(n, dtype=np.int64) + 10 * i,
                            "area": np.full(n, 50, np.int64),
                            "bbox": np.stack([ymin, xmin, ymax, xmax], 1).astype(np.float32),
                            "label": rng.integers(0, 80, n),
                            "is_crowd": np.arange(n) == 0 if i == 2 else np.zeros(n, bool)}})
  return out


@pytest.fixture
def coco_mock():
  """tfds coco/2017 serving hand-made examples through its real features (tfds' own random
  mock draws objects' fields with different lengths, which its Sequence encoder rejects);
  tfds.even_splits shares are honoured, so each host reads its own part."""
  examples = {"train": _coco_examples("train", 6, 0), "validation": _coco_examples("val", 5, 1)}

  def as_dataset(builder, split, decoders=None, read_config=None, shuffle_files=False, **_):
    name, index, parts = ((split.split, split.index, split.count) if hasattr(split, "count")
                          else (str(split), 0, 1))
    chosen = np.array_split(np.arange(len(examples[name])), parts)[index]
    features = builder.info.features
    encoded = [features.encode_example(examples[name][i]) for i in chosen]
    signature = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.tf_dtype),
                                      features.get_serialized_info())
    ds = tf.data.Dataset.from_generator(lambda: iter(encoded), output_signature=signature)
    return ds.map(functools.partial(features.decode_example, decoders=decoders))

  with tfds.testing.mock_data(as_dataset_fn=as_dataset,
                              policy=tfds.testing.MockPolicy.USE_CODE):
    yield examples


@pytest.fixture
def coco_cfg(cfg):
  cfg.data = dataclasses.replace(cfg.data, source="coco2017", eval_examples=5)
  cfg.model.num_classes = 81
  return cfg


def test_coco_counts_train_images_with_annotations(coco_cfg, coco_mock, tmp_path):
  data_dir, samples = input_pipeline.data_source(
      coco_cfg, types.SimpleNamespace(data_dir=str(tmp_path)))
  assert (data_dir, samples) == (str(tmp_path), 5)     # the image without annotations is out


def test_coco_train_batches(coco_cfg, coco_mock, tmp_path):
  batch = next(input_pipeline.train_dataset(coco_cfg, 4, 0, str(tmp_path)).as_numpy_iterator())
  for k, (shape, dtype, _) in spec.batch_layout(coco_cfg, 4).items():
    assert batch[k].shape == shape and batch[k].dtype == dtype, k
  assert ((batch["labels"] > 0).sum(1) >= 1).all() and np.isfinite(batch["image"]).all()
  assert batch["labels"].max() <= 80


@pytest.mark.parametrize("hosts", [1, 2])
def test_coco_eval_every_image_once_with_its_size(coco_cfg, coco_mock, tmp_path, hosts):
  # The image without annotations is not evaluated (as the reference's val loader drops it).
  want = {ex["image/id"]: ex["image"].shape[:2] for ex in coco_mock["validation"]
          if len(ex["objects"]["label"])}
  assert len(want) == 4
  seen, steps = {}, []
  for host in range(hosts):
    batches = list(input_pipeline.eval_dataset(coco_cfg, 4, str(tmp_path), host, hosts)
                   .as_numpy_iterator())
    steps.append(len(batches))
    for b in batches:
      assert b["image"].shape == (4 // hosts, 64, 64, 3)
      for i, size in zip(b["image_id"][b["mask"] == 1], b["image_size"][b["mask"] == 1]):
        assert i not in seen
        seen[i] = tuple(size)
  assert seen == {i: tuple(float(x) for x in s) for i, s in want.items()}
  assert len(set(steps)) == 1


def test_coco_ground_truth_rebuilt_from_the_split_or_read_from_the_json(coco_cfg, coco_mock,
                                                                        tmp_path):
  gt = input_pipeline.eval_ground_truth(coco_cfg, str(tmp_path))
  val = coco_mock["validation"]
  assert sorted(gt.getImgIds()) == sorted(ex["image/id"] for ex in val)
  assert len(gt.getAnnIds()) == sum(len(ex["objects"]["label"]) for ex in val)
  ex = val[0]
  h, w = ex["image"].shape[:2]
  ymin, xmin, ymax, xmax = ex["objects"]["bbox"][0]
  ann = gt.loadAnns(gt.getAnnIds(imgIds=[ex["image/id"]]))[0]
  assert gt.imgs[ex["image/id"]]["height"] == h and gt.imgs[ex["image/id"]]["width"] == w
  np.testing.assert_allclose(ann["bbox"], [xmin * w, ymin * h, (xmax - xmin) * w,
                                           (ymax - ymin) * h], rtol=1e-5)
  # With the official annotation file in the data folder, that file is the ground truth.
  path = tmp_path / coco_cfg.data.annotations
  path.parent.mkdir(parents=True)
  path.write_text(json.dumps({"images": [{"id": 7, "height": 10, "width": 10}],
                              "annotations": [], "categories": [{"id": 1, "name": "a"}]}))
  assert input_pipeline.eval_ground_truth(coco_cfg, str(tmp_path)).getImgIds() == [7]
