"""DLRM-DCNv2's input pipeline (the InputPipeline protocol, both frameworks): the MLPerf
reference's multi-hot Criteo days, read as the reference's MultiHotCriteoIterDataPipe reads
them, and a generated mini set written in the same files.

A day d is three files in --data-dir (TorchRec's tsv_to_npys, then the reference's
materialize_synthetic_multihot_dataset.py):
  day_<d>_dense.npy              float32 [N, 13]: log(count + 3) of the 13 integer features
  day_<d>_labels.npy             int32 [N, 1]: the click
  day_<d>_sparse_multi_hot.npz   uncompressed, member "<f>.npy" for feature f = 0..25: int32
                                 [N, multi_hot_sizes[f]], the bag of ids into table f
Every array is memory-mapped (the npz's members at their offsets inside the zip, as the
reference does), so a day of 180M rows is never read whole. Train is days 0..train_days-1 in
order (the reference does not shuffle), global batches of consecutive rows, each host taking
its slice; eval is the first half of day `train_days` (the reference's 'val' stage), padded to
whole batches with mask 0.
"""
import math
import os
import struct
import zipfile

import numpy as np

from workloads.common import mini_cache

LABEL, DENSE, SPARSE = "labels", "dense", "sparse_multi_hot"


def day_files(data_dir, day) -> dict:
  return {DENSE: os.path.join(data_dir, f"day_{day}_dense.npy"),
          LABEL: os.path.join(data_dir, f"day_{day}_labels.npy"),
          SPARSE: os.path.join(data_dir, f"day_{day}_sparse_multi_hot.npz")}


def npz_member(path, name):
  """A member of an uncompressed .npz (np.savez) memory-mapped at its offset in the zip."""
  with zipfile.ZipFile(path) as archive:
    info = archive.getinfo(name)
  if info.compress_type != zipfile.ZIP_STORED:
    raise ValueError(f"{path}: member {name} is compressed; the reference's files are "
                     "np.savez (stored), which can be memory-mapped")
  with open(path, "rb") as f:
    f.seek(info.header_offset)
    local = f.read(30)                     # the zip local file header
    name_length, extra_length = struct.unpack("<HH", local[26:30])
    f.seek(info.header_offset + 30 + name_length + extra_length)
    version = np.lib.format.read_magic(f)
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0) else
                   np.lib.format.read_array_header_2_0)
    shape, fortran, dtype = read_header(f)
    offset = f.tell()
  return np.memmap(path, dtype, "r", offset, shape, order="F" if fortran else "C")


class Day:
  """One day's arrays, memory-mapped."""

  def __init__(self, data_dir, day, num_features):
    files = day_files(data_dir, day)
    self.dense = np.load(files[DENSE], mmap_mode="r")
    self.labels = np.load(files[LABEL], mmap_mode="r")
    self.sparse = [npz_member(files[SPARSE], f"{f}.npy") for f in range(num_features)]
    self.rows = self.dense.shape[0]

  def read(self, start, stop) -> dict:
    return {"dense": np.asarray(self.dense[start:stop], np.float32),
            "sparse": np.concatenate([np.asarray(s[start:stop], np.int32)
                                      for s in self.sparse], axis=1),
            "label": np.asarray(self.labels[start:stop], np.float32).reshape(-1)}


class Rows:
  """Rows [start, stop) of consecutive days, read across day boundaries."""

  def __init__(self, days, starts, stops):
    self.parts = list(zip(days, starts, stops))
    self.count = sum(stop - start for _, start, stop in self.parts)

  def read(self, first, count) -> dict:
    pieces, done = [], 0
    for day, start, stop in self.parts:
      n = stop - start
      lo, hi = max(first - done, 0), min(first + count - done, n)
      if lo < hi:
        pieces.append(day.read(start + lo, start + hi))
      done += n
    return {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]}


def train_rows(cfg, data_dir) -> Rows:
  days = [Day(data_dir, d, cfg.model.num_features) for d in range(cfg.data.train_days)]
  return Rows(days, [0] * len(days), [d.rows for d in days])


def eval_rows(cfg, data_dir) -> Rows:
  """The first half of the eval day (rows [0, ceil(N / 2)): the reference's 'val' split)."""
  day = Day(data_dir, cfg.data.train_days, cfg.model.num_features)
  return Rows([day], [0], [math.ceil(day.rows / 2)])


def _tf_dataset(generator, cfg, batch_size, with_mask):
  import tensorflow as tf                     # only pipelines that read files import TF
  from workloads.dlrm import spec
  layout = spec.batch_layout(cfg, batch_size, with_mask)
  signature = {k: tf.TensorSpec(shape, dtype) for k, (shape, dtype, _) in layout.items()}
  return tf.data.Dataset.from_generator(generator, output_signature=signature).prefetch(2)


def data_source(cfg, ctx):
  """(folder, train examples in an epoch): --data-dir, or the mini set (generated once)."""
  if cfg.data.source == "mini":
    folder = prepare_mini(cfg)
    return folder, cfg.data.train_examples
  return ctx.data_dir, cfg.data.train_examples


def train_dataset(cfg, global_batch_size, seed, data_dir, process_index=0, process_count=1):
  """This host's slice of each global batch of consecutive training rows, repeated. A last
  partial global batch is dropped so that every step has the global batch (the reference's
  MLPerf command trains it: at the reference size 764 of 4.2 billion rows)."""
  del seed                                    # the reference reads the days in order
  rows = train_rows(cfg, data_dir)
  host = global_batch_size // process_count
  batches = rows.count // global_batch_size
  if not batches:
    raise ValueError(f"{data_dir}: {rows.count} training rows, fewer than one global batch "
                     f"({global_batch_size})")

  def generate():
    while True:
      for b in range(batches):
        yield rows.read(b * global_batch_size + process_index * host, host)
  return _tf_dataset(generate, cfg, host, False)


def eval_dataset(cfg, global_batch_size, data_dir, process_index=0, process_count=1):
  """This host's slice of each global eval batch, the last padded (mask 0): every host runs the
  same number of batches, every eval row is in exactly one host's slice once."""
  rows = eval_rows(cfg, data_dir)
  count = min(rows.count, cfg.data.eval_examples)
  host = global_batch_size // process_count

  def generate():
    for b in range(math.ceil(count / global_batch_size)):
      first = b * global_batch_size + process_index * host
      real = max(0, min(host, count - first))
      batch = rows.read(first, real) if real else None
      out = {}
      for k, (shape, dtype, _) in spec_layout(cfg, host).items():
        value = np.zeros(shape, dtype)
        if batch is not None and k in batch:
          value[:real] = batch[k]
        out[k] = value
      out["mask"][:real] = 1.0
      yield out
  return _tf_dataset(generate, cfg, host, True)


def spec_layout(cfg, batch_size):
  from workloads.dlrm import spec
  return spec.batch_layout(cfg, batch_size, True)


def synthetic_batch(cfg, batch_size, seed) -> dict:
  """Generated features of the real shapes (numpy, no TensorFlow): every id inside its table."""
  rng = np.random.default_rng(seed)
  m = cfg.model
  ids = [rng.integers(0, rows, (batch_size, hot), dtype=np.int32)
         for rows, hot in zip(m.num_embeddings_per_feature, m.multi_hot_sizes)]
  return {"dense": rng.random((batch_size, m.dense_features), np.float32) * 5,
          "sparse": np.concatenate(ids, axis=1),
          "label": (rng.random(batch_size) < 0.25).astype(np.float32)}


# ----------------------------------------------------------------------------- the mini set

def planted_model(cfg):
  """The generated days' click model (fixed by data.mini_seed): a logistic model of the
  standardised dense features and of every feature's bag (the mean of its ids' effects)."""
  rng = np.random.default_rng(cfg.data.mini_seed)
  m = cfg.model
  return {"bias": -1.2, "dense": rng.normal(0.0, 0.4, m.dense_features),
          "effects": [rng.normal(0.0, 0.8, rows) for rows in m.num_embeddings_per_feature]}


def generate_day(cfg, model, rows, rng) -> dict:
  """{'dense', 'labels', 'sparse': [per feature]} of `rows` examples in the files' dtypes;
  ids are Zipf-distributed over each table (frequent ids first, as Criteo's)."""
  m = cfg.model
  counts = np.floor(rng.lognormal(1.0, 1.2, (rows, m.dense_features)))
  dense = np.log(counts + 3).astype(np.float32)
  logit = model["bias"] + ((dense - 1.9) / 0.8) @ model["dense"]
  sparse = []
  for table, hot, effects in zip(m.num_embeddings_per_feature, m.multi_hot_sizes,
                                 model["effects"]):
    p = np.arange(1, table + 1, dtype=np.float64) ** -cfg.data.mini_zipf
    ids = rng.choice(table, size=(rows, hot), p=p / p.sum()).astype(np.int32)
    logit = logit + effects[ids].mean(axis=1)
    sparse.append(ids)
  labels = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int32)[:, None]
  return {"dense": dense, "labels": labels, "sparse": sparse, "logit": logit}


def write_day(folder, day, arrays):
  files = day_files(folder, day)
  np.save(files[DENSE], arrays["dense"])
  np.save(files[LABEL], arrays["labels"])
  np.savez(files[SPARSE], **{str(f): ids for f, ids in enumerate(arrays["sparse"])})


def mini_fields(cfg) -> dict:
  m, d = cfg.model, cfg.data
  return {"rows": list(m.num_embeddings_per_feature), "hot": list(m.multi_hot_sizes),
          "dense": m.dense_features, "train_days": d.train_days,
          "train_examples": d.train_examples, "eval_examples": d.eval_examples,
          "seed": d.mini_seed, "zipf": d.mini_zipf, "format": 1}


def prepare_mini(cfg, cache_root=None) -> str:
  """The mini days in the reference's files (generated on first use, cached): train_days days
  of train_examples / train_days rows, then an eval day twice eval_examples long (its first
  half is the eval split). info.json records the planted model's own AUC on the eval split."""
  def write(staging):
    from workloads.dlrm import auc
    model = planted_model(cfg)
    rng = np.random.default_rng(cfg.data.mini_seed + 1)
    per_day = math.ceil(cfg.data.train_examples / cfg.data.train_days)
    for day in range(cfg.data.train_days):
      write_day(staging, day, generate_day(cfg, model, per_day, rng))
    arrays = generate_day(cfg, model, 2 * cfg.data.eval_examples, rng)
    write_day(staging, cfg.data.train_days, arrays)
    half = cfg.data.eval_examples
    return {"planted_auc": auc.roc_auc(arrays["logit"][:half], arrays["labels"][:half, 0])}
  folder, _ = mini_cache.prepare(cache_root or mini_cache.default_root("dlrm"),
                                 mini_fields(cfg), write)
  return folder
