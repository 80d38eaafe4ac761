"""same_padding (the plain-Python geometry the EfficientNet spec and the TF layers share)
against TensorFlow's own 'SAME' convolution."""
import numpy as np
import pytest

from workloads.common.conv_geometry import same_padding


@pytest.mark.parametrize("kernel, stride", [(1, 1), (3, 1), (3, 2), (5, 2), (7, 2), (4, 3)])
def test_padding_then_valid_equals_tf_same(kernel, stride):
  import tensorflow as tf
  rng = np.random.default_rng(kernel * 10 + stride)
  for size in range(kernel, kernel + 6):
    x = tf.constant(rng.normal(size=(1, size, size + 1, 2)), tf.float64)
    w = tf.constant(rng.normal(size=(kernel, kernel, 2, 3)), tf.float64)
    rows, cols = same_padding(size, kernel, stride), same_padding(size + 1, kernel, stride)
    padded = tf.pad(x, [[0, 0], list(rows), list(cols), [0, 0]])
    ours = tf.nn.conv2d(padded, w, stride, "VALID")
    np.testing.assert_allclose(ours, tf.nn.conv2d(x, w, stride, "SAME"), rtol=1e-12, atol=1e-12)
