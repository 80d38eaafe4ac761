"""ImageNet for every image classifier (ResNet-50, EfficientNet), both frameworks: the tfds
`imagenet2012` pipeline with MLPerf preprocessing, and the generated mini image set.

Sources:
  imagenet2012  the real dataset through tensorflow-datasets, MLPerf preprocessing;
  mini          a generated, learnable, deterministic image set (no download);
  synthetic     random batches of the real shape (`synthetic_batch`), device-resident.
Every pipeline yields batches of {'image': float32 [B,H,W,3], 'label': int32 [B]}; eval
batches add 'mask' (1.0 for real examples, 0.0 for padding) so every example counts once.
`data_cfg` is any config with the fields the functions read (image_size, shuffle_buffer,
train_examples/eval_examples, mini_*): ResNet's and EfficientNet's DataConfig.
"""
import dataclasses

import numpy as np

from workloads.common.host_tf import tf, tfds
from workloads.common import records
from workloads.common.batching import host_batch_size, host_slice, padded_eval

# ImageNet channel statistics on 0..255 pixels (MLPerf reference).
MEAN_RGB = (123.68, 116.78, 103.94)
STDDEV_RGB = (58.393, 57.12, 57.375)
EVAL_RESIZE = 256                  # eval: shorter side to 256, then the central 224 (at 224)


@dataclasses.dataclass(frozen=True)
class Preprocessing:
  """What differs between the classifiers' ImageNet preprocessing. MLPERF (ResNet): bilinear
  resize, eval = shorter side to 256/224 x size then the central crop. EFFICIENTNET
  (tensorflow/tpu preprocessing.py): bicubic resize, eval = the central 0.875 of the shorter
  side cropped from the decoded image, then resized to the size; torchvision's ImageNet mean
  and std x 255 (efficientnet_builder.py MEAN_RGB / STDDEV_RGB)."""
  resize_method: str = "bilinear"
  eval_crop_padding: int = 0           # 0: resize-then-crop (MLPerf); else crop-then-resize
  mean_rgb: tuple = MEAN_RGB
  stddev_rgb: tuple = STDDEV_RGB


MLPERF = Preprocessing()
EFFICIENTNET = Preprocessing(resize_method="bicubic", eval_crop_padding=32,
                             mean_rgb=(0.485 * 255, 0.456 * 255, 0.406 * 255),
                             stddev_rgb=(0.229 * 255, 0.224 * 255, 0.225 * 255))


def normalize(image, prep=MLPERF):
  return (tf.cast(image, tf.float32) - prep.mean_rgb) / prep.stddev_rgb


# ----------------------------------------------------------------------------- ImageNet

def _random_crop_and_resize(image_bytes, image_size, method="bilinear"):
  """Inception-style crop: area in [0.08, 1] and aspect ratio in [3/4, 4/3], then resize."""
  shape = tf.io.extract_jpeg_shape(image_bytes)
  begin, size, _ = tf.image.sample_distorted_bounding_box(
      shape, bounding_boxes=tf.zeros([1, 0, 4]), min_object_covered=0.1,
      aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10,
      use_image_if_no_bounding_boxes=True)
  offset_y, offset_x, _ = tf.unstack(begin)
  height, width, _ = tf.unstack(size)
  window = tf.stack([offset_y, offset_x, height, width])
  image = tf.io.decode_and_crop_jpeg(image_bytes, window, channels=3)
  return tf.image.resize(image, [image_size, image_size], method=method)


def _center_crop_then_resize(image_bytes, image_size, padding, method):
  """The central square of size/(size + padding) of the shorter side, decoded alone, then
  resized (tensorflow/tpu `_decode_and_center_crop`, CROP_PADDING = 32)."""
  shape = tf.io.extract_jpeg_shape(image_bytes)
  height, width = shape[0], shape[1]
  crop = tf.cast(image_size / (image_size + padding) * tf.cast(tf.minimum(height, width), tf.float32), tf.int32)
  window = tf.stack([(height - crop + 1) // 2, (width - crop + 1) // 2, crop, crop])
  image = tf.io.decode_and_crop_jpeg(image_bytes, window, channels=3)
  image = tf.image.resize(image, [image_size, image_size], method=method)
  image.set_shape([image_size, image_size, 3])
  return image


def _center_crop(image_bytes, image_size):
  """Resize the shorter side to 256/224 * image_size, keep the aspect, crop the center."""
  image = tf.io.decode_jpeg(image_bytes, channels=3)
  height, width = tf.shape(image)[0], tf.shape(image)[1]
  resize = image_size * EVAL_RESIZE / 224
  scale = resize / tf.cast(tf.minimum(height, width), tf.float32)
  new_h = tf.cast(tf.round(tf.cast(height, tf.float32) * scale), tf.int32)
  new_w = tf.cast(tf.round(tf.cast(width, tf.float32) * scale), tf.int32)
  image = tf.image.resize(image, [new_h, new_w], method="bilinear")
  top, left = (new_h - image_size) // 2, (new_w - image_size) // 2
  image = image[top:top + image_size, left:left + image_size, :]
  image.set_shape([image_size, image_size, 3])
  return image


def preprocess_train(image_bytes, image_size, prep=MLPERF):
  image = _random_crop_and_resize(image_bytes, image_size, prep.resize_method)
  image = tf.image.random_flip_left_right(image)
  return normalize(image, prep)


def preprocess_eval(image_bytes, image_size, prep=MLPERF):
  if prep.eval_crop_padding:
    return normalize(_center_crop_then_resize(image_bytes, image_size, prep.eval_crop_padding,
                                              prep.resize_method), prep)
  return normalize(_center_crop(image_bytes, image_size), prep)


def _imagenet_split(split, data_dir, process_index, process_count):
  """Reads this host's share of a split (tfds even_splits: every example on exactly one host)."""
  host_split = tfds.even_splits(split, n=process_count, drop_remainder=False)[process_index]
  records.noted_tfds(tfds.builder("imagenet2012", data_dir=data_dir))
  return tfds.load("imagenet2012", split=host_split, data_dir=data_dir, shuffle_files=False,
                   decoders={"image": tfds.decode.SkipDecoding()},
                   download=False)


def imagenet_train(data_cfg, global_batch_size, seed, data_dir, process_index=0, process_count=1,
                   prep=MLPERF):
  host_batch = host_batch_size(global_batch_size, process_count)
  ds = _imagenet_split("train", data_dir, process_index, process_count)
  options = tf.data.Options()
  options.deterministic = False      # throughput over order; the shuffle is still seeded
  ds = ds.with_options(options).repeat().shuffle(data_cfg.shuffle_buffer, seed=seed)
  ds = ds.map(lambda ex: {"image": preprocess_train(ex["image"], data_cfg.image_size, prep),
                          "label": tf.cast(ex["label"], tf.int32)},
              num_parallel_calls=tf.data.AUTOTUNE)
  return ds.batch(host_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def imagenet_eval(data_cfg, global_batch_size, data_dir, process_index=0, process_count=1,
                  prep=MLPERF):
  ds = _imagenet_split("validation", data_dir, process_index, process_count)
  ds = ds.map(lambda ex: {"image": preprocess_eval(ex["image"], data_cfg.image_size, prep),
                          "label": tf.cast(ex["label"], tf.int32)},
              num_parallel_calls=tf.data.AUTOTUNE)
  total = data_cfg.eval_examples
  if process_count > 1:          # the split's real size, so no host ever truncates its share
    total = tfds.builder("imagenet2012", data_dir=data_dir).info.splits["validation"].num_examples
  return padded_eval(ds, total, global_batch_size, process_count).prefetch(tf.data.AUTOTUNE)


# ----------------------------------------------------------------------------- mini

def mini_arrays(data_cfg, num_classes, split):
  """A fixed, learnable image set: each class is a smooth random colour pattern; examples are
  that pattern shifted by up to 1/8 of the image, flipped, contrast-jittered and noised, and a
  `mini_label_noise` fraction carry a wrong label (so top-1 accuracy stays below 1.0, as the
  compliance checker requires). Deterministic in data_cfg.mini_seed; `split` is train|eval."""
  size = data_cfg.image_size
  count = data_cfg.train_examples if split == "train" else data_cfg.eval_examples
  templates_rng = np.random.default_rng(data_cfg.mini_seed)
  coarse = templates_rng.normal(size=(num_classes, 4, 4, 3)).astype(np.float32)
  # Upsample 4x4 -> size x size bilinearly, so patterns are smooth and shift-tolerant.
  templates = tf.image.resize(coarse, [size, size], method="bilinear").numpy()
  rng = np.random.default_rng([data_cfg.mini_seed, 0 if split == "train" else 1])
  labels = rng.integers(0, num_classes, size=count)
  max_shift = max(size // 8, 1)
  shifts = rng.integers(-max_shift, max_shift + 1, size=(count, 2))
  images = templates[labels]
  images = np.stack([np.roll(img, tuple(s), axis=(0, 1)) for img, s in zip(images, shifts)])
  flips = rng.random(count) < 0.5
  images[flips] = images[flips, :, ::-1]
  contrast = rng.uniform(0.6, 1.4, size=(count, 1, 1, 1))
  images = images * contrast + rng.normal(scale=data_cfg.mini_pixel_noise, size=images.shape)
  noisy = rng.permutation(count)[:int(round(data_cfg.mini_label_noise * count))]
  labels[noisy] = (labels[noisy] + rng.integers(1, num_classes, size=len(noisy))) % num_classes
  return images.astype(np.float32), labels.astype(np.int32)


def mini_train(data_cfg, num_classes, global_batch_size, seed, process_index=0, process_count=1):
  """Each host yields its slice of the same seeded global batch: the global batches do not
  depend on the number of hosts, so multi-host runs are comparable with one host step by step.
  The flips are stateless (seeded by the example's position in the stream) for the same reason."""
  images, labels = mini_arrays(data_cfg, num_classes, "train")
  ds = tf.data.Dataset.from_tensor_slices({"image": images, "label": labels}).cache()
  ds = ds.repeat().shuffle(data_cfg.shuffle_buffer, seed=seed).enumerate()
  ds = ds.map(lambda i, ex: {**ex, "image": tf.image.stateless_random_flip_left_right(
      ex["image"], seed=tf.stack([tf.cast(seed, tf.int64), i]))},
              num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(global_batch_size, drop_remainder=True)
  return host_slice(ds, global_batch_size, process_index, process_count).prefetch(
      tf.data.AUTOTUNE)


def mini_eval(data_cfg, num_classes, global_batch_size, process_index=0, process_count=1):
  images, labels = mini_arrays(data_cfg, num_classes, "eval")
  ds = tf.data.Dataset.from_tensor_slices({"image": images, "label": labels})
  ds = ds.shard(process_count, process_index)
  return padded_eval(ds, data_cfg.eval_examples, global_batch_size, process_count).cache(
      ).prefetch(tf.data.AUTOTUNE)


# ----------------------------------------------------------------------------- entry points

def train_dataset(data_cfg, num_classes, global_batch_size, seed, data_dir=None,
                  process_index=0, process_count=1, prep=MLPERF):
  """This host's batches: global_batch_size / process_count examples each; `prep` is the
  real dataset's preprocessing (the mini set is generated already normalised)."""
  if data_cfg.source == "mini":
    return mini_train(data_cfg, num_classes, global_batch_size, seed, process_index,
                      process_count)
  return imagenet_train(data_cfg, global_batch_size, seed, data_dir, process_index,
                        process_count, prep)


def eval_dataset(data_cfg, num_classes, global_batch_size, data_dir=None, process_index=0,
                 process_count=1, prep=MLPERF):
  """This host's share of the eval split in padded batches of global/process_count; with
  several hosts every host yields the same number of batches."""
  if data_cfg.source == "mini":
    return mini_eval(data_cfg, num_classes, global_batch_size, process_index, process_count)
  return imagenet_eval(data_cfg, global_batch_size, data_dir, process_index, process_count, prep)


def synthetic_batch(data_cfg, num_classes, batch_size, seed):
  """Random normalised images and labels of the real shapes (numpy)."""
  rng = np.random.default_rng(seed)
  size = data_cfg.image_size
  return {"image": rng.standard_normal((batch_size, size, size, 3), np.float32),
          "label": rng.integers(0, num_classes, (batch_size,), np.int32)}
