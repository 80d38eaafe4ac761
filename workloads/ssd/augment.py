"""SSD preprocessing in TF graph ops (tf.data maps), after the MLPerf reference's
SSDTransformer (mlcommons/training retired_benchmarks/ssd-v1/ssd/utils.py):

  train: SSDCropping -> RandomHorizontalFlip -> Resize(size) -> ColorJitter(brightness=0.125,
         contrast=0.5, saturation=0.5, hue=0.05) -> [0,1] -> Normalize(ImageNet mean/std)
  eval:  Resize(size) -> [0,1] -> Normalize

Boxes are normalised (left, top, right, bottom), as the reference's. All randomness is
stateless, drawn from a per-example `seed` (shape [2]), so a pipeline is reproducible and an
example's augmentation does not depend on which host or thread prepares it.

Where this differs from the reference (torchvision on PIL images):
- the crop's rounds and tries are drawn all at once and the first acceptable one is taken
  (the same distribution as trying them one after another); the reference's "draw a new mode
  until a crop is accepted" loop is capped at MAX_CROP_ROUNDS rounds, after which the image
  stays whole (each round keeps it whole with probability 1/7: the cap is reached with
  probability (6/7)^MAX_CROP_ROUNDS, about 2e-7);
- colour jitter runs on float pixels, with no rounding to uint8 between its four steps;
- resizing is tf.image.resize's antialiased bilinear, PIL's bilinear Resize's nearest match.
"""
import functools
import math

from workloads.common.host_tf import tf

MEAN = (0.485, 0.456, 0.406)         # torchvision's ImageNet statistics on [0,1] pixels
STD = (0.229, 0.224, 0.225)
# SSDCropping's modes: None = keep the image; else the minimum IoU every box must exceed
# with the crop (-inf: any crop). The maximum IoU is +inf in all of them.
CROP_MIN_IOU = (None, 0.1, 0.3, 0.5, 0.7, 0.9, -math.inf)
MAX_CROP_ROUNDS = 100
BRIGHTNESS, CONTRAST, SATURATION, HUE = 0.125, 0.5, 0.5, 0.05


def _uniform(seed, shape=(), lo=0.0, hi=1.0):
  return tf.random.stateless_uniform(shape, seed, lo, hi)


def iou(boxes, window):
  """IoU of each box (n,4) with each window (m,4), all ltrb: (n, m)."""
  b, w = boxes[:, None, :], window[None, :, :]
  lt = tf.maximum(b[..., :2], w[..., :2])
  rb = tf.minimum(b[..., 2:], w[..., 2:])
  inter = tf.reduce_prod(tf.maximum(rb - lt, 0.0), -1)
  area = lambda x: (x[..., 2] - x[..., 0]) * (x[..., 3] - x[..., 1])
  return inter / (area(b) + area(w) - inter)


def _centres_inside(boxes, window):
  """(n, m): the box's centre strictly inside the window (the reference's test)."""
  xc = 0.5 * (boxes[:, None, 0] + boxes[:, None, 2])
  yc = 0.5 * (boxes[:, None, 1] + boxes[:, None, 3])
  return ((xc > window[None, :, 0]) & (xc < window[None, :, 2]) &
          (yc > window[None, :, 1]) & (yc < window[None, :, 3]))


def sample_crop(boxes, seed, num_iterations):
  """SSDCropping's choice: (window ltrb (4,), cropped bool). Each round draws a mode; "keep"
  ends with the whole image; otherwise `num_iterations` tries of w, h ~ U(0.3, 1), left ~
  U(0, 1 - w), top ~ U(0, 1 - h), accepted when 0.5 <= w/h <= 2, every box's IoU with the crop
  is > the mode's minimum, and at least one box's centre is inside. No try accepted: a new
  round (a new mode), as the reference's `while True`.

  All MAX_CROP_ROUNDS rounds are drawn and judged at once and the first that ends is taken:
  the rounds are independent, so this is the distribution of trying them one after another,
  in a few dozen ops instead of a while loop of them per round (the mini pipeline's crop
  0.48 -> 0.1 ms per example, 2 CPU cores)."""
  rounds, tries_per_round = MAX_CROP_ROUNDS, num_iterations
  min_iou = tf.constant([-math.inf if m is None else m for m in CROP_MIN_IOU], tf.float32)
  keys = tf.random.experimental.stateless_split(seed, 5)
  mode = tf.random.stateless_uniform([rounds], keys[0], 0, len(CROP_MIN_IOU), tf.int32)
  w = _uniform(keys[1], [rounds, tries_per_round], 0.3, 1.0)
  h = _uniform(keys[2], [rounds, tries_per_round], 0.3, 1.0)
  left = _uniform(keys[3], [rounds, tries_per_round]) * (1.0 - w)
  top = _uniform(keys[4], [rounds, tries_per_round]) * (1.0 - h)
  tries = tf.reshape(tf.stack([left, top, left + w, top + h], -1), [-1, 4])   # (R * T, 4)
  shape = [-1, rounds, tries_per_round]
  ok = ((w / h >= 0.5) & (w / h <= 2.0) &
        tf.reduce_all(tf.reshape(iou(boxes, tries), shape) > tf.gather(min_iou, mode)[:, None],
                      0) &
        tf.reduce_any(tf.reshape(_centres_inside(boxes, tries), shape), 0))   # (R, T)
  keep = tf.equal(mode, 0)
  ends = keep | tf.reduce_any(ok, 1)                                         # (R,)
  first = lambda flags: tf.argmax(tf.cast(flags, tf.int32), output_type=tf.int32)
  r = first(ends)                    # the first round that ends; none: 0, and not cropped
  cropped = ends[r] & ~keep[r]
  window = tf.where(cropped, tries[r * tries_per_round + first(ok[r])],
                    tf.constant([0.0, 0.0, 1.0, 1.0]))
  return window, cropped


def apply_crop(image, boxes, labels, window):
  """Crops the image to the window (pixels from int(left * W) to int(right * W), as the
  reference), keeps the boxes whose centres are inside, clips them to the window and makes
  them relative to it."""
  height, width = tf.unstack(tf.cast(tf.shape(image)[:2], tf.float32))
  left, top, right, bottom = tf.unstack(window)
  to_int = lambda v: tf.cast(tf.floor(v), tf.int32)
  image = image[to_int(top * height):to_int(bottom * height),
                to_int(left * width):to_int(right * width)]
  keep = _centres_inside(boxes, window[None])[:, 0]
  boxes, labels = tf.boolean_mask(boxes, keep), tf.boolean_mask(labels, keep)
  boxes = tf.clip_by_value(boxes, tf.stack([left, top, left, top]),
                           tf.stack([right, bottom, right, bottom]))
  size = tf.stack([right - left, bottom - top] * 2)
  return image, (boxes - tf.stack([left, top, left, top])) / size, labels


def ssd_crop(image, boxes, labels, seed, num_iterations=1):
  window, cropped = sample_crop(boxes, seed, num_iterations)
  return tf.cond(cropped, lambda: apply_crop(image, boxes, labels, window),
                 lambda: (image, boxes, labels))


def flip(image, boxes):
  """Mirrors the image left-right and the boxes with it: x -> 1 - x (left and right swap)."""
  return (tf.image.flip_left_right(image),
          tf.stack([1.0 - boxes[:, 2], boxes[:, 1], 1.0 - boxes[:, 0], boxes[:, 3]], 1))


def random_flip(image, boxes, seed):
  return tf.cond(_uniform(seed) < 0.5, lambda: flip(image, boxes), lambda: (image, boxes))


def _gray(image):
  """PIL's L conversion (ITU-R 601-2 luma), which torchvision's colour ops blend with."""
  return tf.reduce_sum(image * tf.constant([0.299, 0.587, 0.114]), -1, keepdims=True)


def color_jitter(image, seed):
  """torchvision ColorJitter(0.125, 0.5, 0.5, 0.05) on [0,1] pixels: brightness (blend with
  black), contrast (blend with the mean gray level), saturation (blend with the gray image),
  each by a factor ~ U(1 - x, 1 + x), and a hue shift ~ U(-0.05, 0.05) of the colour circle,
  in a random order."""
  keys = tf.random.experimental.stateless_split(seed, 5)
  factor = lambda key, x: _uniform(key, (), 1.0 - x, 1.0 + x)
  b, c, s = factor(keys[0], BRIGHTNESS), factor(keys[1], CONTRAST), factor(keys[2], SATURATION)
  hue = _uniform(keys[3], (), -HUE, HUE)
  blend = lambda x, other, f: tf.clip_by_value(other + f * (x - other), 0.0, 1.0)
  ops = [lambda x: blend(x, 0.0, b),
         lambda x: blend(x, tf.reduce_mean(_gray(x)), c),
         lambda x: blend(x, _gray(x), s),
         lambda x: tf.image.adjust_hue(x, hue)]
  order = tf.argsort(_uniform(keys[4], [len(ops)]))
  for i in range(len(ops)):
    image = tf.switch_case(order[i], [functools.partial(op, image) for op in ops])
  return image


def resize(image, size):
  """To size x size float pixels, on the image's own scale (0..255 stays 0..255)."""
  image = tf.image.resize(tf.cast(image, tf.float32), [size, size], "bilinear", antialias=True)
  image.set_shape([size, size, 3])
  return image


def normalize(image01):
  return (image01 - tf.constant(MEAN)) / tf.constant(STD)


def train_preprocess(image, boxes, labels, size, seed, num_iterations=1, augment=True):
  """(image float32 (size,size,3) normalised, boxes, labels) of a uint8 image and its ltrb
  boxes. augment=False: only resize and normalise (tests compare targets exactly)."""
  if augment:
    keys = tf.random.experimental.stateless_split(seed, 3)
    image, boxes, labels = ssd_crop(image, boxes, labels, keys[0], num_iterations)
    image, boxes = random_flip(image, boxes, keys[1])
    image = color_jitter(tf.clip_by_value(resize(image, size) / 255.0, 0.0, 1.0), keys[2])
  else:
    image = resize(image, size) / 255.0
  return normalize(image), boxes, labels


def eval_preprocess(image, size):
  return normalize(resize(image, size) / 255.0)
