"""The reference's sample order: Megatron's GPTDataset (megatron/core/datasets/gpt_dataset.py
and helpers.cpp, core_r0.11.0 as the reference's Dockerfile pins) over Megatron indexed
datasets, and its BlendedDataset when several prefixes are blended. Written from the algorithm
those files describe; what each step follows is cited where it happens.

A GPTDataset sees its sequences (one a document in the reference's C4) as one token stream:

  document index  the sequence ids repeated once per epoch and shuffled with
                  numpy.random.RandomState(seed) (_build_document_index); when the last epoch
                  is needed for fewer than 80% of an epoch's samples, the earlier epochs and the
                  last one are shuffled separately (separate_final_epoch), the same RandomState
                  drawing on.
  sample index    sample i is the stream's tokens [i*L, i*L + L + 1) of the documents in that
                  order (helpers.cpp build_sample_idx, add_extra_token_to_sequence): samples run
                  across document boundaries and overlap by one token (the last token of one is
                  the first of the next). Stored as Megatron stores it, (position in the
                  document index, offset in that document) of each sample's first token, one
                  row more than there are samples. Samples: (epochs x tokens - 1) // L, the
                  last partial one dropped.
  shuffle index   a permutation of the samples by the same RandomState (_build_shuffle_index;
                  with a separate final epoch the two ranges are permuted apart).

The epochs are the fewest whose tokens cover num_samples x L + 1 (_get_num_epochs): the order
depends on the number of samples the dataset was built for (the reference: trainer max_steps
1,200,000 x the global batch, NeMo PreTrainingDataModule.build), not only on the seed.

With reset_position_ids, reset_attention_mask and eod_mask_loss all False (the reference's
get_data) a sample is one causal sequence: positions 0..L-1, every label counted; tokens are
sample[:-1] and labels sample[1:] (GPTDataset.__getitem__).

The eval order here is the README's ("We use the first 1024 sequences in the validation
dataset ... We do not shuffle"): the eval prefix's first N sequences in file order
(`shuffle=False`: document order as stored, one epoch, no shuffle index; sequence i is tokens
[i L, i L + L + 1) of the file). The reference code does otherwise: NeMo builds the validation
split as one more GPTDataset, shuffled by the run's seed like the training one and sized
(max_steps // val_check_interval + 1) x limit_val_batches x global batch, and every eval reads
its first ceil(1024 / B) x B samples. `build_indices(..., shuffle=True)` gives that order too
when it is wanted.

Checked against Megatron core_r0.11.0 itself (helpers.cpp compiled, _build_document_index and
_build_shuffle_index run): document, sample and shuffle indices and the blending indices equal
on 300 random cases (empty documents, 1 to 6 epochs, separate final epochs), dtypes included.
"""
import hashlib
import json
import math
import os
import tempfile

import numpy as np

# helpers.py: the sample index is int32 when the document index and every length fit
_INT32_MAX = np.iinfo(np.int32).max
CHUNK = 1 << 22                   # document-index entries a sample-index pass holds at once


def num_epochs_for(tokens_per_epoch: int, num_samples, seq_length: int) -> int:
  """GPTDataset._get_num_epochs: the fewest epochs with at least num_samples x L + 1 tokens
  (1 when num_samples is None)."""
  if num_samples is None:
    return 1
  if tokens_per_epoch <= 0:
    raise ValueError("the dataset has no tokens")
  return max(1, math.ceil((num_samples * seq_length + 1) / tokens_per_epoch))


def split_final_epoch(num_epochs, tokens_per_epoch, num_samples, seq_length):
  """(separate_final_epoch, samples before the final epoch), as _build_document_sample_
  shuffle_indices decides it: the final epoch is shuffled apart when fewer than
  int(0.8 x an epoch's samples) of the requested samples come from it."""
  if num_epochs == 1:
    return False, None
  before = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length
  from_final = num_samples - before
  per_epoch = (tokens_per_epoch - 1) // seq_length
  if not 0 <= from_final <= per_epoch + 1:
    raise ValueError(f"{from_final} samples from the final epoch, outside 0..{per_epoch + 1}")
  return from_final < int(0.80 * per_epoch), before


def build_document_index(documents, num_epochs, rng, separate_final_epoch=False):
  """_build_document_index: `documents` once per epoch, int32, shuffled in place by `rng`
  (epochs 1..E-1 then the final one apart when separate_final_epoch)."""
  documents = np.asarray(documents)
  if separate_final_epoch and num_epochs > 1:
    first = build_document_index(documents, num_epochs - 1, rng, False)
    last = build_document_index(documents, 1, rng, False)
    return np.concatenate([first, last])
  index = np.tile(documents.astype(np.int32), num_epochs)
  rng.shuffle(index)
  return index


def build_sample_index(lengths, document_index, seq_length, num_epochs, tokens_per_epoch):
  """helpers.cpp build_sample_idx (drop_last_partial_sequence, one extra token): rows
  (position in document_index, offset) of each sample's first token, samples + 1 rows. Sample
  i starts at stream token i x L; a start that falls on a document's end belongs to the next
  non-empty document, as the C++ walk moves on past a finished (or empty) document."""
  lengths = np.asarray(lengths)
  document_index = np.asarray(document_index)
  if seq_length < 2:
    raise ValueError(f"seq_length={seq_length}; allowed: at least 2")
  total = num_epochs * tokens_per_epoch
  num_samples = (total - 1) // seq_length
  if num_samples < 1:
    raise ValueError(f"{total} tokens make no sample of {seq_length} + 1 tokens")
  big = max(len(document_index), int(lengths.max()) if len(lengths) else 0)
  out = np.empty((num_samples + 1, 2), np.int32 if big <= _INT32_MAX else np.int64)
  base = 0                          # stream tokens before this chunk
  row = 0                           # next row to fill
  for c0 in range(0, len(document_index), CHUNK):
    lens = lengths[document_index[c0:c0 + CHUNK]].astype(np.int64)
    ends = base + np.cumsum(lens)
    if row <= num_samples and len(ends):
      last = min(num_samples, (int(ends[-1]) - 1) // seq_length)   # last start inside the chunk
      if last >= row:
        starts = np.arange(row, last + 1, dtype=np.int64) * seq_length
        k = np.searchsorted(ends, starts, side="right")
        out[row:last + 1, 0] = c0 + k
        out[row:last + 1, 1] = starts - (ends[k] - lens[k])
        row = last + 1
    base = int(ends[-1]) if len(ends) else base
  if row != num_samples + 1:
    raise AssertionError(f"sample index filled {row} of {num_samples + 1} rows")
  out[0] = 0                        # the C++ walk starts at (0, 0) whatever document 0 holds
  return out


def build_shuffle_index(num_samples, total_size, rng):
  """_build_shuffle_index: [0, num_samples) permuted, then [num_samples, total_size) permuted
  apart when larger; uint32 unless the size needs int64."""
  dtype = np.uint32 if total_size < np.iinfo(np.uint32).max - 1 else np.int64
  first = np.arange(num_samples, dtype=dtype)
  rng.shuffle(first)
  if num_samples == total_size:
    return first
  last = np.arange(num_samples, total_size, dtype=dtype)
  rng.shuffle(last)
  return np.concatenate([first, last])


def build_indices(lengths, seq_length, num_samples, seed, documents=None, shuffle=True):
  """(document index, sample index, shuffle index or None) of one GPTDataset: `lengths` the
  sequence lengths, `documents` the sequence ids it exposes (default all; the reference's
  blend_per_split gives each prefix whole, split (0, 1)). shuffle=False: the eval order here,
  documents as stored, one epoch, no shuffle."""
  lengths = np.asarray(lengths)
  documents = np.arange(len(lengths), dtype=np.int32) if documents is None else documents
  tokens_per_epoch = int(lengths[documents].sum(dtype=np.int64))
  if not shuffle:
    doc_index = np.asarray(documents, np.int32)
    return doc_index, build_sample_index(lengths, doc_index, seq_length, 1,
                                         tokens_per_epoch), None
  epochs = num_epochs_for(tokens_per_epoch, num_samples, seq_length)
  separate, before = split_final_epoch(epochs, tokens_per_epoch, num_samples, seq_length)
  rng = np.random.RandomState(seed)
  doc_index = build_document_index(documents, epochs, rng, separate)
  sample_index = build_sample_index(lengths, doc_index, seq_length, epochs, tokens_per_epoch)
  total = len(sample_index) - 1
  shuffle_index = build_shuffle_index(before if separate else total, total, rng)
  return doc_index, sample_index, shuffle_index


class GPTSamples:
  """One indexed dataset's samples in GPTDataset order: `sample(i)` is the i-th sample the
  reference's data loader would draw from it (L + 1 tokens, int32)."""

  def __init__(self, dataset, seq_length, num_samples=None, seed=1234, shuffle=True,
               cache_dir=None):
    self.dataset, self.seq_length = dataset, seq_length
    self.num_samples, self.seed, self.shuffle = num_samples, seed, shuffle
    build = lambda: build_indices(dataset.sequence_lengths, seq_length, num_samples, seed,
                                  shuffle=shuffle)
    if cache_dir:
      arrays = _cached(cache_dir, self._key(), build)
    else:
      arrays = build()
    self.document_index, self.sample_index, self.shuffle_index = arrays

  def _key(self):
    d = self.dataset
    fields = {"prefix": os.path.basename(d.prefix), "sequences": int(d.sequence_count),
              "bin_bytes": os.path.getsize(d.prefix + ".bin"),
              "lengths": hashlib.sha256(np.ascontiguousarray(d.sequence_lengths)).hexdigest(),
              "seq_length": self.seq_length, "num_samples": self.num_samples,
              "seed": self.seed, "shuffle": self.shuffle, "version": 1}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:20]

  def __len__(self):
    """Every sample the indices hold (Megatron's len: all epochs' samples, at least
    num_samples)."""
    return len(self.sample_index) - 1

  def position(self, i):
    """The sample-index row of the i-th sample drawn."""
    return int(self.shuffle_index[i]) if self.shuffle_index is not None else int(i)

  def sample(self, i) -> np.ndarray:
    """The i-th sample: L + 1 tokens (GPTDataset._query_document_sample_shuffle_indices)."""
    j = self.position(i)
    (k0, o0), (k1, o1) = self.sample_index[j], self.sample_index[j + 1]
    k0, o0, k1, o1 = int(k0), int(o0), int(k1), int(o1)
    get = self.dataset.sequence
    if k0 == k1:
      parts = [get(int(self.document_index[k0]), o0, o1 - o0 + 1)]
    else:
      parts = [get(int(self.document_index[k0]), o0)]
      parts += [get(int(self.document_index[k])) for k in range(k0 + 1, k1)]
      parts.append(get(int(self.document_index[k1]), 0, o1 + 1))
    out = np.concatenate(parts).astype(np.int32)
    if len(out) != self.seq_length + 1:
      raise AssertionError(f"sample {i} has {len(out)} tokens, not {self.seq_length + 1}")
    return out

  def documents_of(self, i):
    """The sequence ids sample i spans, in order."""
    j = self.position(i)
    k0, k1 = int(self.sample_index[j][0]), int(self.sample_index[j + 1][0])
    return [int(d) for d in self.document_index[k0:k1 + 1]]


def normalize(weights):
  w = np.asarray(weights, np.float64)
  if (w <= 0).any():
    raise ValueError(f"blend weights {list(weights)}; allowed: all positive")
  return w / w.sum()


def blend_sizes(weights, size, margin=0.5):
  """_get_size_per_split_per_dataset: samples to build of each dataset (target x (1 + margin
  percent), rounded up twice, as Megatron's 0.5% buffer)."""
  return [int(math.ceil(math.ceil(size * w) * (1 + margin / 100))) for w in normalize(weights)]


def blending_indices(weights, size):
  """helpers.cpp build_blending_indices: (dataset of each blended sample, its sample number in
  that dataset). Each step takes the dataset furthest behind its share, weight x max(i, 1) -
  drawn, the lowest index on ties: equal weights draw round-robin."""
  w = normalize(weights)
  n = len(w)
  if np.all(w == w[0]):
    i = np.arange(size, dtype=np.int64)
    return (i % n).astype(np.int16), i // n
  dataset_index = np.empty(size, np.int16)
  sample_index = np.empty(size, np.int64)
  drawn = [0] * n
  wl = [float(x) for x in w]
  for i in range(size):
    scale = float(max(i, 1))
    best, best_err = 0, wl[0] * scale - drawn[0]
    for d in range(1, n):
      err = wl[d] * scale - drawn[d]
      if err > best_err:
        best, best_err = d, err
    dataset_index[i], sample_index[i] = best, drawn[best]
    drawn[best] += 1
  return dataset_index, sample_index


class BlendedSamples:
  """The training stream over one or more prefixes. One prefix: its GPTDataset alone (NeMo
  passes paths per split, blend_per_split, and Megatron builds a single prefix's dataset
  directly, its weight unused). Several: each GPTDataset built for its share plus 0.5% and
  drawn in build_blending_indices' order (BlendedDataset), `size` samples in all (the targets'
  sum)."""

  def __init__(self, datasets, weights, size, seq_length, seed, cache_dir=None):
    if len(datasets) == 1:
      self.parts = [GPTSamples(datasets[0], seq_length, size, seed, cache_dir=cache_dir)]
      self.dataset_index = None
      self.size = len(self.parts[0])
      return
    w = normalize(weights)
    targets = [int(math.ceil(size * x)) for x in w]
    self.parts = [GPTSamples(d, seq_length, n, seed, cache_dir=cache_dir)
                  for d, n in zip(datasets, blend_sizes(w, size))]
    self.size = sum(targets)
    self.dataset_index, self.dataset_sample_index = blending_indices(w, self.size)

  def __len__(self):
    return self.size

  def locate(self, i):
    """(dataset, its sample number) of blended sample i."""
    if self.dataset_index is None:
      return 0, int(i)
    return int(self.dataset_index[i]), int(self.dataset_sample_index[i])

  def sample(self, i):
    d, j = self.locate(i)
    return self.parts[d].sample(j)


def _cached(cache_dir, key, build):
  """The three index arrays, built once and kept as .npy under cache_dir/key (Megatron keeps
  them under its path_to_cache the same way); later opens memory-map them."""
  folder = os.path.join(cache_dir, key)
  names = ("document_index", "sample_index", "shuffle_index")
  done = os.path.join(folder, "done")
  if not os.path.exists(done):
    arrays = build()
    os.makedirs(cache_dir, exist_ok=True)
    staging = tempfile.mkdtemp(dir=cache_dir)
    for name, arr in zip(names, arrays):
      if arr is not None:
        np.save(os.path.join(staging, name + ".npy"), arr)
    open(os.path.join(staging, "done"), "w").close()
    try:
      os.rename(staging, folder)
    except OSError:                      # another process renamed its copy first
      import shutil
      shutil.rmtree(staging, ignore_errors=True)
    if not os.path.exists(done):
      return arrays
  out = []
  for name in names:
    path = os.path.join(folder, name + ".npy")
    out.append(np.load(path, mmap_mode="r") if os.path.exists(path) else None)
  return tuple(out)
