"""ROC AUC over the whole eval set with TensorFlow ops: the count jax_auc.py computes (its
docstring has the argument), on TF's device (not yet the TF eval's: its base gathers every
batch to the host, where auc.AucEvaluator ranks them): the scores sorted
(tf.argsort), the examples grouped by distinct score (tf.unique of the sorted scores: groups
in ascending order), each group's positives and negatives summed, and twice the Mann-Whitney
statistic, sum over groups of positives x (2 x negatives below + negatives in the group), in
int64; the AUC is that over 2 x positives x negatives in float64. The padding ('mask' 0)
counts as neither class."""
import tensorflow as tf


@tf.function(reduce_retracing=True)
def _counts(scores, labels, masks):
  kept = masks > 0
  clicked = labels > 0.5
  positive = tf.cast(kept & clicked, tf.int64)
  negative = tf.cast(kept & ~clicked, tf.int64)
  order = tf.argsort(scores, stable=True)
  sorted_scores = tf.gather(scores, order)
  _, group = tf.unique(sorted_scores)
  pos = tf.math.segment_sum(tf.gather(positive, order), group)
  neg = tf.math.segment_sum(tf.gather(negative, order), group)
  below = tf.cumsum(neg, exclusive=True)
  twice = tf.reduce_sum(pos * (2 * below + neg))
  return twice, tf.reduce_sum(pos), tf.reduce_sum(neg)


def roc_auc_counts(scores, labels, masks):
  """(twice the numerator, positives, negatives) as Python ints; the arguments are lists of
  per-batch tensors or arrays (concatenated on TF's device)."""
  cat = lambda xs, dtype=None: tf.concat(
      [tf.reshape(tf.cast(x, dtype) if dtype else tf.convert_to_tensor(x), [-1]) for x in xs], 0)
  twice, positives, negatives = _counts(cat(scores), cat(labels, tf.float32),
                                        cat(masks, tf.float32))
  return int(twice), int(positives), int(negatives)


def roc_auc(scores, labels, masks=None) -> float:
  as_list = lambda x: list(x) if isinstance(x, (list, tuple)) else [x]
  scores, labels = as_list(scores), as_list(labels)
  masks = [tf.ones(tf.shape(tf.reshape(s, [-1]))) for s in scores] if masks is None else \
      as_list(masks)
  twice, positives, negatives = roc_auc_counts(scores, labels, masks)
  if not positives or not negatives:
    raise ValueError(f"AUC needs both classes in the eval set; got {positives} positive and "
                     f"{negatives} negative examples")
  return float(twice) / float(2 * positives * negatives)
