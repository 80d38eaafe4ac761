"""tf.data input for the Transformer, shared by the JAX and TF trainers.

Training reads the reference's format (data_download.py of the MLPerf `transformer`): TFRecord
shards of tf.train.Example with int64 lists 'inputs' and 'targets', subtoken ids ending in EOS
(1). Pairs where either side is longer than data.max_length are discarded (the reference's
filter, and the rules' `max_sequence_length` method 'discard'); the rest are padded with 0 to
max_length, shuffled and batched in rows of sentence pairs, each host reading its own files.
With data.packing, each file's pairs are packed in file order into rows of max_length
(workloads/common/packing.py) before the rows are shuffled: the row count of an epoch is then
the same on every pass and for any host split, and is what the log counts as train_samples.

Eval follows the reference's translate-and-score loop: the raw source sentences
(newstest2014.en) are encoded with the run's vocabulary once (host Python, cached), padded to
data.eval_max_length, and carry their line 'index'; the trainer decodes the beam-search output
back to text and scores it against the raw reference line (newstest2014.de) with bleu.py.

The mini preset generates a parallel corpus (mini_corpus.py), writes its vocabulary in the
reference's vocab-file format, its training pairs as TFRecords in the reference format, and its
eval set as two text files (cached under ~/.cache keyed by a hash of the mini config), then
reads them back through the same readers.
"""
import dataclasses
import os

import numpy as np
from workloads.common.host_tf import tf

from workloads.common import mini_cache, packing
from workloads.common.batching import (host_batch_size, host_slice, padded_eval, sharded_records,
                                       tfrecord_files)
from workloads.transformer import mini_corpus, spec, subwords

MINI_FORMAT_VERSION = 2                       # bump when the generator changes


def parse(serialized, max_length):
  """One reference example -> {'inputs', 'targets'}: int32, padded with 0 to max_length."""
  features = tf.io.parse_single_example(serialized, {
      "inputs": tf.io.VarLenFeature(tf.int64), "targets": tf.io.VarLenFeature(tf.int64)})
  return {k: tf.cast(tf.sparse.to_dense(v), tf.int32) for k, v in features.items()}


def fits(example, max_length):
  return tf.logical_and(tf.size(example["inputs"]) <= max_length,
                        tf.size(example["targets"]) <= max_length)


def pad_to(example, max_length):
  return {k: tf.reshape(tf.pad(v, [[0, max_length - tf.size(v)]]), [max_length])
          for k, v in example.items()}


def _kept(records, max_length):
  """Parsed pairs no longer than max_length (unpadded)."""
  ds = records.map(lambda s: parse(s, max_length), num_parallel_calls=tf.data.AUTOTUNE)
  return ds.filter(lambda ex: fits(ex, max_length))


def _rows(records, data_cfg):
  """Training rows of one stream of records: pairs padded to max_length, or packed."""
  ds = _kept(records, data_cfg.max_length)
  if data_cfg.packing:
    return packing.pack(ds, data_cfg.max_length)
  return ds.map(lambda ex: pad_to(ex, data_cfg.max_length), num_parallel_calls=tf.data.AUTOTUNE)


def _file_rows(data_cfg):
  """A file name -> its rows (packing never spans two files)."""
  return lambda path: _rows(tf.data.TFRecordDataset(path), data_cfg)


def count_rows(files, data_cfg) -> int:
  """The rows one pass over `files` yields (packed: fewer than pairs)."""
  ds = tf.data.Dataset.from_tensor_slices(files).flat_map(_file_rows(data_cfg))
  return packing.count_rows(ds)


def tfrecord_train(data_cfg, global_batch_size, seed, data_dir, process_index=0,
                   process_count=1):
  """This host's shuffled, repeated batches of global_batch_size / process_count rows."""
  files = tfrecord_files(data_dir, data_cfg.train_pattern, "WMT TFRecords")
  ds = sharded_records(files, seed, process_index, process_count, reader=_file_rows(data_cfg))
  ds = ds.shuffle(data_cfg.shuffle_buffer, seed=seed)
  return ds.batch(host_batch_size(global_batch_size, process_count), drop_remainder=True).prefetch(
      tf.data.AUTOTUNE)


def mini_train(data_cfg, data_dir, global_batch_size, seed, process_index=0, process_count=1):
  """Every host slices the same seeded global batch, so batches do not depend on the host
  count (as the other mini pipelines)."""
  files = tfrecord_files(data_dir, "train-*")
  ds = tf.data.Dataset.from_tensor_slices(files).flat_map(_file_rows(data_cfg)).cache()
  ds = ds.repeat().shuffle(data_cfg.shuffle_buffer, seed=seed)
  ds = ds.batch(global_batch_size, drop_remainder=True)
  return host_slice(ds, global_batch_size, process_index, process_count).prefetch(
      tf.data.AUTOTUNE)


# ----------------------------------------------------------------------------- eval

def eval_paths(cfg, data_dir) -> tuple[str, str, str]:
  """(vocab file, eval source, eval reference) of the run."""
  d = cfg.data
  if d.source == "mini":
    return (os.path.join(data_dir, "vocab.mini"), os.path.join(data_dir, "eval.src"),
            os.path.join(data_dir, "eval.ref"))
  return tuple(os.path.join(data_dir, f) for f in (d.vocab_file, d.eval_source, d.eval_reference))


def read_lines(path, count):
  """The first `count` lines (newline stripped, as the reference reads them)."""
  with open(path, encoding="utf-8") as f:
    lines = [line.rstrip("\n") for line in f]
  if len(lines) < count:
    raise ValueError(f"{path} has {len(lines)} lines; data.eval_examples={count} needs as many")
  return lines[:count]


def encode_eval_inputs(encoder, sentences, eval_max_length) -> np.ndarray:
  """[N, eval_max_length] int32: each sentence's ids and EOS, padded with 0. A sentence longer
  than eval_max_length is cut and still ends in EOS (it keeps its place in the BLEU corpus)."""
  out = np.zeros((len(sentences), eval_max_length), np.int32)
  for n, sentence in enumerate(sentences):
    ids = encoder.encode(sentence)[:eval_max_length - 1] + [subwords.EOS_ID]
    out[n, :len(ids)] = ids
  return out


def eval_dataset(cfg, global_batch_size, data_dir, process_index=0, process_count=1):
  """This host's share of the eval sentences in padded batches ('mask' 0 on padding), every
  host the same number of batches."""
  vocab, source, _ = eval_paths(cfg, data_dir)
  n = cfg.data.eval_examples
  inputs = encode_eval_inputs(subwords.SubwordEncoder.from_file(vocab), read_lines(source, n),
                              cfg.data.eval_max_length)
  ds = tf.data.Dataset.from_tensor_slices({"inputs": inputs,
                                           "index": np.arange(n, dtype=np.int32)})
  ds = ds.shard(process_count, process_index)
  return padded_eval(ds, n, global_batch_size, process_count).cache().prefetch(tf.data.AUTOTUNE)


def eval_text(cfg, data_dir) -> tuple[subwords.SubwordEncoder, list[str]]:
  """(the vocabulary, the reference translations) for the host-side BLEU."""
  vocab, _, reference = eval_paths(cfg, data_dir)
  return (subwords.SubwordEncoder.from_file(vocab),
          read_lines(reference, cfg.data.eval_examples))


# ----------------------------------------------------------------------------- mini corpus

def _example(encoder, source, target):
  ints = lambda ids: tf.train.Feature(int64_list=tf.train.Int64List(value=ids))
  return tf.train.Example(features=tf.train.Features(feature={
      "inputs": ints(encoder.encode(source) + [subwords.EOS_ID]),
      "targets": ints(encoder.encode(target) + [subwords.EOS_ID])})).SerializeToString()


def mini_fields(data_cfg) -> dict:
  fields = {k: v for k, v in dataclasses.asdict(data_cfg).items() if k.startswith("mini_")}
  fields.update(eval_examples=data_cfg.eval_examples, version=MINI_FORMAT_VERSION)
  return fields


def prepare_mini(data_cfg, cache_root=None) -> dict:
  """Writes the mini set once under cache_root/<hash>: vocab.mini, train-0000N-of-00002
  (reference TFRecords), eval.src / eval.ref (one sentence per line); -> {'dir', ...}."""
  def write(staging):
    encoder = mini_corpus.vocabulary(data_cfg.mini_seed, data_cfg.mini_words)
    encoder.save(os.path.join(staging, "vocab.mini"))
    train = mini_corpus.pairs(data_cfg.mini_seed, data_cfg.mini_words,
                              data_cfg.mini_train_pairs, stream=0)
    half = len(train) // 2
    for shard, part in enumerate((train[:half], train[half:])):
      with tf.io.TFRecordWriter(os.path.join(staging, f"train-0000{shard}-of-00002")) as w:
        for source, target in part:
          w.write(_example(encoder, source, target))
    evals = mini_corpus.pairs(data_cfg.mini_seed, data_cfg.mini_words,
                              data_cfg.eval_examples, stream=1)
    for name, column in (("eval.src", 0), ("eval.ref", 1)):
      with open(os.path.join(staging, name), "w", encoding="utf-8") as f:
        f.writelines(pair[column] + "\n" for pair in evals)
    return {"train_examples": len(train), "vocab_size": encoder.vocab_size}
  folder, info = mini_cache.prepare(cache_root or mini_cache.default_root("transformer"),
                                    mini_fields(data_cfg), write)
  return {"dir": folder, **info}


# ----------------------------------------------------------------------------- entry points

def train_dataset(cfg, global_batch_size, seed, data_dir, process_index=0, process_count=1):
  """`data_dir`: data_source's folder (the mini or tfds set's reference-format copy)."""
  if cfg.data.source == "mini":
    return mini_train(cfg.data, data_dir, global_batch_size, seed, process_index, process_count)
  return tfrecord_train(cfg.data, global_batch_size, seed, data_dir, process_index,
                        process_count)


def data_source(cfg, ctx):
  """(data folder, train_samples to log). Mini: generates its files once (untimed, like the
  reference's offline data_download.py) under --data-dir or ~/.cache. Packed: the rows one
  pass over the training files packs into, counted here (before init) unless
  data.train_examples gives it."""
  d = cfg.data
  if d.source == "mini":
    root = os.path.join(ctx.data_dir, "transformer_mini") if ctx.data_dir else None
    info = prepare_mini(d, root)
    if info["vocab_size"] != cfg.model.vocab_size:
      raise ValueError(f"model.vocab_size={cfg.model.vocab_size} does not match the mini "
                       f"vocabulary ({info['vocab_size']}); allowed: 0 (its size)")
    folder, pattern, pairs = info["dir"], "train-*", info["train_examples"]
  elif not ctx.data_dir:          # describe: reads no data (packed rows need the files)
    return None, d.train_examples or spec.train_samples(cfg)
  elif d.source == "tfds":
    from workloads.transformer import tfds_wmt
    info = tfds_wmt.prepare(d, ctx.data_dir)
    if info["vocab_size"] != cfg.model.vocab_size:
      raise ValueError(f"model.vocab_size={cfg.model.vocab_size} does not match the vocabulary "
                       f"of {info['dir']} ({info['vocab_size']} entries); allowed: "
                       f"{info['vocab_size']}")
    folder, pattern, pairs = info["dir"], d.train_pattern, info["train_examples"]
  else:
    folder, pattern, pairs = ctx.data_dir, d.train_pattern, None
  if d.train_examples or not (d.packing and d.source != "synthetic"):
    return folder, d.train_examples or pairs or spec.train_samples(cfg)
  return folder, count_rows(tfrecord_files(folder, pattern, "WMT TFRecords"), d)


def synthetic_batch(cfg, batch_size, seed):
  """One random batch of the real shapes (numpy): random ids, EOS, then padding; packed, rows
  of several examples of random lengths."""
  rng = np.random.default_rng(seed)
  length = cfg.data.max_length
  positions = np.arange(length)[None]
  if cfg.data.packing:
    return mini_corpus.synthetic_packed(rng, cfg.model.vocab_size, batch_size, length)
  def rows():
    ids = rng.integers(2, cfg.model.vocab_size, (batch_size, length)).astype(np.int32)
    ends = rng.integers(length // 2, length, batch_size)
    ids = np.where(positions == ends[:, None], subwords.EOS_ID, ids)
    return np.where(positions > ends[:, None], 0, ids).astype(np.int32)
  return {"inputs": rows(), "targets": rows()}
