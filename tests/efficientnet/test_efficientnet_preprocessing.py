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


def test_train_crop_resizes_to_the_size_and_normalizes_with_the_recipe_statistics():
  """A one-colour image stays that colour under any crop window, flip and interpolating resize
  (bicubic and bilinear weights sum to 1: float32 rounding, far below 1e-2 of a level), so the
  de-normalized output is the decoded colour for either recipe, whichever window was drawn;
  the normalized outputs differ because the statistics do."""
  colour = np.array([200, 120, 40], np.uint8)
  jpeg = tf.io.encode_jpeg(np.broadcast_to(colour, (64, 80, 3)).copy(), quality=100,
                           chroma_downsampling=False)
  decoded = tf.io.decode_jpeg(jpeg, channels=3).numpy().astype(np.float64)[0, 0]
  normalized = {}
  for name, prep in (("efficientnet", imagenet.EFFICIENTNET), ("mlperf", imagenet.MLPERF)):
    out = imagenet.preprocess_train(jpeg, 32, prep).numpy().astype(np.float64)
    assert out.shape == (32, 32, 3)
    pixels = out * np.array(prep.stddev_rgb) + np.array(prep.mean_rgb)
    np.testing.assert_allclose(pixels, np.broadcast_to(decoded, pixels.shape), atol=1e-2)
    normalized[name] = out
  # torchvision's statistics x 255 against MLPerf's: green differs by 0.5 levels (0.009 here)
  assert np.abs(normalized["efficientnet"] - normalized["mlperf"]).max() > 1e-3
