"""Packed BERT rows: several pre-training samples in one max_seq_length row, as NVIDIA's and
Graphcore's MLPerf BERT submissions train (the rules allow it: the samples are unchanged, and
each counts as one sample).

A packed row of length L holding samples 1..S (S <= data.max_samples_per_row):
  input_ids, segment_ids  [L]   the samples' tokens one after another, then padding (0)
  input_mask              [L]   the sample each token belongs to, 1..S (0 padding): attention
                                stays within a sample (jax_model.packed_attention_mask)
  positions               [L]   each token's position in its own sample (position embedding)
  masked_lm_positions/_ids/_weights [P]   every sample's predictions, positions in the row
  cls_positions, next_sentence_labels, next_sentence_weights [S]   one NSP slot a sample
P = max_predictions_per_seq + max_samples_per_row: create_pretraining_data predicts
round(0.15 x length) tokens a sample (at most max_predictions_per_seq), so S samples sharing L
tokens predict at most 0.15 L + S; a sample that would not fit its row's slots waits for
another row.

The packer is greedy over a window of the stream (Graphcore's packing is a histogram one,
offline): each row starts with the window's longest sample and takes the longest that still
fits, until S samples or none fits. The model and the loss with such rows equal the unpacked
samples' (tests/bert/test_bert_packing.py, float64): the attention masks, positions and NSP
weights make a row's samples independent, the MLM loss is a weighted mean over all predictions
and the NSP loss a mean over real samples.
"""
import numpy as np

ROW_KEYS = ("input_ids", "input_mask", "segment_ids", "positions", "masked_lm_positions",
            "masked_lm_ids", "masked_lm_weights", "cls_positions", "next_sentence_labels",
            "next_sentence_weights")


def predictions_per_row(max_predictions_per_seq, max_samples_per_row):
  return max_predictions_per_seq + max_samples_per_row


def sample_length(example):
  return int(np.count_nonzero(example["input_mask"]))


def sample_predictions(example):
  return int(np.count_nonzero(example["masked_lm_weights"]))


def pack_row(examples, seq_length, max_samples, predictions):
  """One packed row (a dict of numpy arrays, ROW_KEYS) of unpacked reference examples (dicts
  with the TFRecord features, next_sentence_labels a scalar) that fit it."""
  row = {k: np.zeros(seq_length, np.int32) for k in
         ("input_ids", "input_mask", "segment_ids", "positions")}
  row.update({"masked_lm_positions": np.zeros(predictions, np.int32),
              "masked_lm_ids": np.zeros(predictions, np.int32),
              "masked_lm_weights": np.zeros(predictions, np.float32),
              "cls_positions": np.zeros(max_samples, np.int32),
              "next_sentence_labels": np.zeros(max_samples, np.int32),
              "next_sentence_weights": np.zeros(max_samples, np.float32)})
  start, slot = 0, 0
  if len(examples) > max_samples:
    raise ValueError(f"{len(examples)} samples for a row of at most {max_samples}")
  for s, ex in enumerate(examples):
    n, k = sample_length(ex), sample_predictions(ex)
    if start + n > seq_length or slot + k > predictions:
      raise ValueError("the samples do not fit one row")
    end = start + n
    row["input_ids"][start:end] = ex["input_ids"][:n]
    row["segment_ids"][start:end] = ex["segment_ids"][:n]
    row["input_mask"][start:end] = s + 1
    row["positions"][start:end] = np.arange(n)
    real = np.flatnonzero(ex["masked_lm_weights"])
    row["masked_lm_positions"][slot:slot + k] = ex["masked_lm_positions"][real] + start
    row["masked_lm_ids"][slot:slot + k] = ex["masked_lm_ids"][real]
    row["masked_lm_weights"][slot:slot + k] = ex["masked_lm_weights"][real]
    row["cls_positions"][s] = start
    row["next_sentence_labels"][s] = int(np.reshape(ex["next_sentence_labels"], -1)[0])
    row["next_sentence_weights"][s] = 1.0
    start, slot = end, slot + k
  return row


class Packer:
  """Packs a stream of unpacked examples into rows: `rows(n)` -> the next n packed rows, as one
  batch (dict of [n, ...] arrays), greedily from a window of `window` examples."""

  def __init__(self, examples, seq_length, max_samples, max_predictions_per_seq, window=64):
    self.examples = iter(examples)
    self.seq_length, self.max_samples, self.window = seq_length, max_samples, window
    self.predictions = predictions_per_row(max_predictions_per_seq, max_samples)
    self.pool = []          # (length, predictions, example), longest first

  def _fill(self):
    while len(self.pool) < self.window:
      try:
        ex = next(self.examples)
      except StopIteration:
        break
      self.pool.append((sample_length(ex), sample_predictions(ex), ex))
    self.pool.sort(key=lambda item: -item[0])

  def next_row(self):
    self._fill()
    if not self.pool:
      raise StopIteration
    length, preds, first = self.pool.pop(0)
    chosen = [first]
    while len(chosen) < self.max_samples:
      fit = next((i for i, (n, k, _) in enumerate(self.pool)
                  if length + n <= self.seq_length and preds + k <= self.predictions), None)
      if fit is None:
        break
      n, k, ex = self.pool.pop(fit)
      length, preds = length + n, preds + k
      chosen.append(ex)
    return pack_row(chosen, self.seq_length, self.max_samples, self.predictions)

  def rows(self, n):
    rows = [self.next_row() for _ in range(n)]
    return {k: np.stack([r[k] for r in rows]) for k in ROW_KEYS}

  def batches(self, rows_per_batch):
    """Batches of `rows_per_batch` rows while the stream lasts (a last partial one dropped)."""
    while True:
      try:
        yield self.rows(rows_per_batch)
      except StopIteration:
        return


def samples_in(batch):
  """The samples a packed batch holds (its real NSP slots); counted on the host."""
  return int(np.count_nonzero(batch["next_sentence_weights"]))
