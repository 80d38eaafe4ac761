"""EfficientNet's ImageNet preprocessing (workloads/common/imagenet.EFFICIENTNET) against the
tensorflow/tpu recipe written out here: eval = the central int(size/(size+32) x shorter side)
square of the decoded JPEG (offset (d+1)//2), bicubic resize, torchvision mean/std x 255;
train = a crop resized bicubically to the size and maybe flipped."""
import numpy as np
import tensorflow as tf

from workloads.common import imagenet


def _jpeg(height, width, seed=0):
  rng = np.random.default_rng(seed)
  image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
  # no chroma subsampling: decoding a crop then equals cropping the decoded image exactly
  return tf.io.encode_jpeg(image, quality=100, chroma_downsampling=False)


def test_eval_is_the_central_224_of_256_crop_resized_bicubically():
  jpeg = _jpeg(120, 90)
  decoded = tf.io.decode_jpeg(jpeg, channels=3).numpy().astype(np.float32)
  size = 56                                            # crop int(56/88 * 90) = 57
  crop = int(size / (size + 32) * 90)
  top, left = (120 - crop + 1) // 2, (90 - crop + 1) // 2
  expected = tf.image.resize(decoded[top:top + crop, left:left + crop], [size, size],
                             method="bicubic").numpy()
  mean = np.array([0.485, 0.456, 0.406]) * 255
  std = np.array([0.229, 0.224, 0.225]) * 255
  got = imagenet.preprocess_eval(jpeg, size, imagenet.EFFICIENTNET).numpy()
  assert got.shape == (size, size, 3)
  np.testing.assert_allclose(got, (expected - mean) / std, rtol=1e-5, atol=1e-4)
  # the MLPerf (ResNet) path is unchanged: resize-then-crop, bilinear, MLPerf statistics
  assert not np.allclose(imagenet.preprocess_eval(jpeg, size).numpy(), got, atol=1e-2)


def test_train_crop_has_the_size_and_differs_from_mlperf_only_by_resize_and_statistics():
  jpeg = _jpeg(64, 80, seed=1)
  outputs = {}
  for name, prep in (("efficientnet", imagenet.EFFICIENTNET), ("mlperf", imagenet.MLPERF)):
    tf.random.set_seed(0)                  # the same crop window and flip for both
    out = imagenet.preprocess_train(jpeg, 32, prep).numpy()
    outputs[name] = out * np.array(prep.stddev_rgb) + np.array(prep.mean_rgb)   # pixels
  assert outputs["efficientnet"].shape == (32, 32, 3)
  # same window: the bicubic and bilinear resizes of it have the same mean (to a few levels)
  diff = outputs["efficientnet"].mean((0, 1)) - outputs["mlperf"].mean((0, 1))
  assert np.all(np.abs(diff) < 3.0) and not np.allclose(outputs["efficientnet"],
                                                        outputs["mlperf"], atol=1.0)
