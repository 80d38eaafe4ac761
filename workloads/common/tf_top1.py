"""Top-1 image classification in TensorFlow, shared by ResNet-50 and EfficientNet: the
label-smoothed cross entropy they train on (summed: callers divide by the global batch, so
the sum over replicas is the global mean) and the eval step's [correct, counted]."""
import tensorflow as tf


def cross_entropy_sum(logits, labels, num_classes, label_smoothing):
  """Summed (not averaged) label-smoothed cross entropy: callers divide by the global batch."""
  targets = tf.one_hot(labels, num_classes, dtype=logits.dtype)
  targets = targets * (1.0 - label_smoothing) + label_smoothing / num_classes
  return tf.reduce_sum(tf.nn.softmax_cross_entropy_with_logits(targets, logits))


def counts(logits, labels, mask):
  """[correct, counted] of a padded eval batch (padding rows have mask 0)."""
  correct = tf.cast(tf.argmax(logits, -1, output_type=tf.int32) == labels, tf.float32)
  return tf.stack([tf.reduce_sum(correct * mask), tf.reduce_sum(mask)])
