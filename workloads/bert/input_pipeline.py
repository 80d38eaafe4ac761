"""tf.data input for BERT pre-training, shared by the JAX and TF trainers.

The on-disk format is the MLPerf reference's (create_pretraining_data.py): TFRecords of
tf.train.Example with int64 features input_ids, input_mask, segment_ids [max_seq_length],
masked_lm_positions, masked_lm_ids [max_predictions_per_seq], next_sentence_labels [1] and
float masked_lm_weights [max_predictions_per_seq]. Training reads <data-dir>/part-* (the
reference's part-00XXX-of-00500), eval reads <data-dir>/eval_10k (10,000 examples).

The mini preset generates a corpus (documents of sentences from seeded per-topic Markov
chains), builds NSP pairs and masks 15% of tokens 80/10/10 as create_pretraining_data.py does,
WRITES it as TFRecords in the same format (cached under ~/.cache keyed by a hash of the mini
config), and reads it back through the same reader.
Batches: int32 ids, float32 masked_lm_weights; eval batches add 'mask' (1 real, 0 padding).
"""
import dataclasses
import os

import numpy as np
from workloads.common.host_tf import tf

from workloads.bert import packing, spec
from workloads.common import mini_cache
from workloads.common.batching import (host_batch_size, host_slice, padded_eval, sharded_records,
                                       tfrecord_files)

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4         # the mini vocabulary's special tokens
FIRST_WORD = 5
MINI_FORMAT_VERSION = 1                          # bump when the generator changes


def feature_spec(data_cfg):
  seq, preds = data_cfg.max_seq_length, data_cfg.max_predictions_per_seq
  ints = lambda n: tf.io.FixedLenFeature([n], tf.int64)
  return {"input_ids": ints(seq), "input_mask": ints(seq), "segment_ids": ints(seq),
          "masked_lm_positions": ints(preds), "masked_lm_ids": ints(preds),
          "masked_lm_weights": tf.io.FixedLenFeature([preds], tf.float32),
          "next_sentence_labels": ints(1)}


def parse(serialized, data_cfg):
  """One serialized example -> int32 ids (int64 on disk, as the reference casts) and a scalar
  next_sentence_label."""
  example = tf.io.parse_single_example(serialized, feature_spec(data_cfg))
  out = {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in example.items()}
  out["next_sentence_labels"] = tf.reshape(out["next_sentence_labels"], [])
  return out


def _files(data_dir, pattern):
  return tfrecord_files(data_dir, pattern, "BERT TFRecords")


def tfrecord_train(data_cfg, global_batch_size, seed, data_dir, process_index=0,
                   process_count=1):
  """This host's shuffled, repeated batches (global_batch_size / process_count each). Files are
  split over hosts when there are enough of them, records otherwise: each example on one host."""
  ds = tfrecord_examples(data_cfg, seed, data_dir, process_index, process_count)
  return ds.batch(host_batch_size(global_batch_size, process_count), drop_remainder=True).prefetch(
      tf.data.AUTOTUNE)


def tfrecord_examples(data_cfg, seed, data_dir, process_index=0, process_count=1):
  """This host's shuffled, repeated, parsed examples, unbatched."""
  ds = sharded_records(_files(data_dir, data_cfg.train_pattern), seed, process_index,
                       process_count)
  ds = ds.shuffle(data_cfg.shuffle_buffer, seed=seed)
  return ds.map(lambda s: parse(s, data_cfg), num_parallel_calls=tf.data.AUTOTUNE)


def tfrecord_eval(data_cfg, global_batch_size, data_dir, process_index=0, process_count=1):
  """This host's share of the eval set, in full batches padded with mask=0 examples so every
  example counts once; with several hosts all yield the same number of batches."""
  ds = tf.data.TFRecordDataset(_files(data_dir, data_cfg.eval_pattern))
  ds = ds.take(data_cfg.eval_examples).shard(process_count, process_index)
  ds = ds.map(lambda s: parse(s, data_cfg), num_parallel_calls=tf.data.AUTOTUNE)
  return padded_eval(ds, data_cfg.eval_examples, global_batch_size, process_count).cache(
      ).prefetch(tf.data.AUTOTUNE)


# ----------------------------------------------------------------------------- mini corpus

def _topic_chains(rng, vocab_size, topics):
  """Per topic: each word's 3 possible successors (probabilities 0.7/0.2/0.1) and 8 words a
  sentence may start with. Low-entropy but not deterministic, so masked-LM accuracy saturates
  below 1.0 and the random 10% replacements add more noise."""
  words = np.arange(FIRST_WORD, vocab_size)
  successors = rng.choice(words, size=(topics, vocab_size, 3))
  starts = rng.choice(words, size=(topics, 8))
  return successors, starts


def _documents(rng, num_documents, successors, starts):
  docs = []
  for _ in range(num_documents):
    topic = rng.integers(len(starts))
    sentences = []
    for _ in range(rng.integers(4, 10)):
      word = rng.choice(starts[topic])
      sentence = [word]
      for _ in range(rng.integers(2, 8)):          # 3 to 8 words
        word = successors[topic, word, rng.choice(3, p=(0.7, 0.2, 0.1))]
        sentence.append(word)
      sentences.append(sentence)
    docs.append(sentences)
  return docs


def _mask(rng, tokens, data_cfg, vocab_size):
  """create_masked_lm_predictions: 15% of non-special positions (at most max_predictions),
  each replaced by [MASK] 80%, kept 10%, a random word 10%."""
  candidates = [i for i, t in enumerate(tokens) if t not in (CLS, SEP)]
  rng.shuffle(candidates)
  count = min(data_cfg.max_predictions_per_seq, max(1, int(round(len(tokens) * 0.15))))
  picked = sorted(candidates[:count])
  output = list(tokens)
  for i in picked:
    draw = rng.random()
    output[i] = MASK if draw < 0.8 else tokens[i] if draw < 0.9 else rng.integers(
        FIRST_WORD, vocab_size)
  return output, picked, [tokens[i] for i in picked]


def _instances(rng, docs, data_cfg, vocab_size, dupe_factor):
  """create_instances_from_document, simplified: segment A = 1-2 sentences; B = the next
  sentences of the same document (label 0) or, half the time, sentences of another document
  (label 1, 'random next'); the pair is truncated to max_seq_length - 3 tokens."""
  limit = data_cfg.max_seq_length - 3
  out = []
  for _ in range(dupe_factor):
    for d, doc in enumerate(docs):
      for start in range(0, len(doc) - 1, 2):
        a = [w for s in doc[start:start + 1 + rng.integers(2)] for w in s]
        random_next = rng.random() < 0.5 or start + 2 >= len(doc)
        if random_next:
          other = docs[(d + rng.integers(1, len(docs))) % len(docs)]
          first = rng.integers(len(other))
          b = [w for s in other[first:first + 2] for w in s]
        else:
          b = [w for s in doc[start + 1:start + 3] for w in s]
        while len(a) + len(b) > limit:
          (a if len(a) > len(b) else b).pop()
        tokens = [CLS, *a, SEP, *b, SEP]
        segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        masked, positions, labels = _mask(rng, tokens, data_cfg, vocab_size)
        out.append((masked, segments, positions, labels, int(random_next)))
  return out


def _example(instance, data_cfg):
  tokens, segments, positions, labels, next_label = instance
  seq, preds = data_cfg.max_seq_length, data_cfg.max_predictions_per_seq
  pad = lambda values, n: list(values) + [0] * (n - len(values))
  ints = lambda values: tf.train.Feature(int64_list=tf.train.Int64List(value=values))
  features = {
      "input_ids": ints(pad(tokens, seq)), "input_mask": ints(pad([1] * len(tokens), seq)),
      "segment_ids": ints(pad(segments, seq)), "masked_lm_positions": ints(pad(positions, preds)),
      "masked_lm_ids": ints(pad(labels, preds)),
      "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(
          value=pad([1.0] * len(labels), preds))),
      "next_sentence_labels": ints([next_label])}
  return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def _write(path, instances, data_cfg):
  with tf.io.TFRecordWriter(path) as writer:
    for instance in instances:
      writer.write(_example(instance, data_cfg))


def mini_fields(data_cfg, vocab_size) -> dict:
  """What the mini corpus depends on (its cache key)."""
  fields = {k: v for k, v in dataclasses.asdict(data_cfg).items()
            if k.startswith("mini_") or k in ("max_seq_length", "max_predictions_per_seq",
                                              "eval_examples")}
  fields.update(vocab_size=vocab_size, version=MINI_FORMAT_VERSION)
  return fields


def prepare_mini(data_cfg, vocab_size, cache_root=None) -> dict:
  """Writes the mini corpus as TFRecords (2 train shards part-0000N-of-00002 and `eval`) under
  cache_root/<hash of the mini config>, once; returns {'dir', 'train_examples'}."""
  def write(staging):
    rng = np.random.default_rng(data_cfg.mini_seed)
    successors, starts = _topic_chains(rng, vocab_size, data_cfg.mini_topics)
    train = _instances(rng, _documents(rng, data_cfg.mini_documents, successors, starts),
                       data_cfg, vocab_size, data_cfg.mini_dupe_factor)
    rng.shuffle(train)
    evals = _instances(rng, _documents(rng, data_cfg.mini_eval_documents, successors, starts),
                       data_cfg, vocab_size, 1)
    if len(evals) < data_cfg.eval_examples:
      raise ValueError(f"the mini eval corpus has {len(evals)} examples < data.eval_examples="
                       f"{data_cfg.eval_examples}; raise data.mini_eval_documents")
    half = len(train) // 2
    _write(os.path.join(staging, "part-00000-of-00002"), train[:half], data_cfg)
    _write(os.path.join(staging, "part-00001-of-00002"), train[half:], data_cfg)
    _write(os.path.join(staging, "eval"), evals[:data_cfg.eval_examples], data_cfg)
    return {"train_examples": len(train)}
  folder, info = mini_cache.prepare(cache_root or mini_cache.default_root("bert"),
                                    mini_fields(data_cfg, vocab_size), write)
  return {"dir": folder, **info}


def mini_data_cfg(data_cfg):
  """The reader's view of the mini files: the patterns prepare_mini writes."""
  return dataclasses.replace(data_cfg, train_pattern="part-*", eval_pattern="eval")


def mini_train(data_cfg, data_dir, global_batch_size, seed, process_index=0, process_count=1):
  """Each host takes its slice of the same seeded global batch, so the global batches do not
  depend on the number of hosts (as the resnet mini pipeline does)."""
  ds = mini_examples(data_cfg, data_dir, seed).batch(global_batch_size, drop_remainder=True)
  return host_slice(ds, global_batch_size, process_index, process_count).prefetch(
      tf.data.AUTOTUNE)


def mini_examples(data_cfg, data_dir, seed):
  """The mini training examples, shuffled and repeated, parsed, unbatched."""
  ds = tf.data.TFRecordDataset(_files(data_dir, "part-*")).cache()
  ds = ds.repeat().shuffle(data_cfg.shuffle_buffer, seed=seed)
  return ds.map(lambda s: parse(s, data_cfg), num_parallel_calls=tf.data.AUTOTUNE)


def packed_train(examples, cfg, global_batch_size):
  """Packed training batches (packing.py, spec.packed_layout's rows) of a dataset of unpacked
  examples: packed on the host inside tf.data (from_generator, prefetched), so the packing of
  the next batches overlaps the device's steps. One host (spec.check_framework)."""
  d = cfg.data
  layout = spec.packed_layout(cfg, global_batch_size)

  def generate():
    packer = packing.Packer(examples.as_numpy_iterator(), d.max_seq_length,
                            d.max_samples_per_row, d.max_predictions_per_seq, d.packing_window)
    yield from packer.batches(layout["input_ids"][0][0])

  signature = {k: tf.TensorSpec(shape, dtype) for k, (shape, dtype, _) in layout.items()}
  return tf.data.Dataset.from_generator(generate, output_signature=signature).prefetch(
      tf.data.AUTOTUNE)


# ----------------------------------------------------------------------------- entry points

def train_dataset(cfg, global_batch_size, seed, data_dir, process_index=0, process_count=1):
  """data_dir: the TFRecord folder (for mini: prepare_mini's folder)."""
  if cfg.data.packing:
    examples = (mini_examples(cfg.data, data_dir, seed) if cfg.data.source == "mini" else
                tfrecord_examples(cfg.data, seed, data_dir, process_index, process_count))
    return packed_train(examples, cfg, global_batch_size)
  if cfg.data.source == "mini":
    return mini_train(cfg.data, data_dir, global_batch_size, seed, process_index, process_count)
  return tfrecord_train(cfg.data, global_batch_size, seed, data_dir, process_index,
                        process_count)


def eval_dataset(cfg, global_batch_size, data_dir, process_index=0, process_count=1):
  data_cfg = mini_data_cfg(cfg.data) if cfg.data.source == "mini" else cfg.data
  return tfrecord_eval(data_cfg, global_batch_size, data_dir, process_index, process_count)


# ----------------------------------------------------------------------------- per run (both trainers)

def data_source(cfg, ctx):
  """(TFRecord folder, train_samples to log). Mini: generates its TFRecords once (untimed
  preparation, like the reference's offline create_pretraining_data) under --data-dir or
  ~/.cache; the run reads them only after run_start."""
  if cfg.data.source == "mini":
    root = os.path.join(ctx.data_dir, "bert_mini") if ctx.data_dir else None
    info = prepare_mini(cfg.data, cfg.model.vocab_size, root)
    return info["dir"], cfg.data.train_examples or info["train_examples"]
  return ctx.data_dir, spec.train_samples(cfg)


def checkpoint_path(cfg, ctx):
  path = cfg.data.init_checkpoint
  return path if os.path.isabs(path) else os.path.join(ctx.data_dir or "", path)


def synthetic_batch(cfg, batch_size, seed):
  """One random batch of the real shapes (numpy), every position unpadded; with packing, rows
  packed from samples of lengths uniform in [seq/16, seq] (a mean of about seq/2, as the
  Wikipedia set's, which packs about 2 a row) with 15% of their tokens predicted."""
  rng = np.random.default_rng(seed)
  seq, preds = cfg.data.max_seq_length, cfg.data.max_predictions_per_seq
  if cfg.data.packing:
    return _synthetic_packed(cfg, batch_size, rng)
  return {"input_ids": rng.integers(0, cfg.model.vocab_size, (batch_size, seq), np.int32),
          "input_mask": np.ones((batch_size, seq), np.int32),
          "segment_ids": (np.arange(seq) >= seq // 2).astype(np.int32)[None].repeat(batch_size, 0),
          "masked_lm_positions": np.sort(rng.integers(1, seq, (batch_size, preds)), 1).astype(np.int32),
          "masked_lm_ids": rng.integers(0, cfg.model.vocab_size, (batch_size, preds), np.int32),
          "masked_lm_weights": np.ones((batch_size, preds), np.float32),
          "next_sentence_labels": rng.integers(0, 2, (batch_size,), np.int32)}


def _synthetic_packed(cfg, batch_size, rng):
  d, vocab = cfg.data, cfg.model.vocab_size
  seq, preds = d.max_seq_length, d.max_predictions_per_seq

  def samples():
    while True:
      n = int(rng.integers(max(2, seq // 16), seq + 1))
      k = min(preds, max(1, round(0.15 * n)))
      mask = np.zeros(seq, np.int32)
      mask[:n] = 1
      slots = np.zeros(preds, np.int32)
      slots[:k] = np.sort(rng.choice(np.arange(1, n), k, replace=False))
      yield {"input_ids": rng.integers(0, vocab, seq, np.int32) * mask, "input_mask": mask,
             "segment_ids": ((np.arange(seq) >= n // 2) * mask).astype(np.int32),
             "masked_lm_positions": slots,
             "masked_lm_ids": np.where(np.arange(preds) < k, rng.integers(0, vocab, preds),
                                       0).astype(np.int32),
             "masked_lm_weights": (np.arange(preds) < k).astype(np.float32),
             "next_sentence_labels": np.int32(rng.integers(0, 2))}

  packer = packing.Packer(samples(), seq, d.max_samples_per_row, preds, d.packing_window)
  return packer.rows(spec.packed_rows(cfg, batch_size))
