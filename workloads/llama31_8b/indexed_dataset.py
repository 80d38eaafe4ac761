"""Megatron's indexed dataset, the format of the reference's tokenized C4: <prefix>.bin holds
every sequence's tokens back to back; <prefix>.idx describes them ("MMIDIDX" mmap format,
Megatron-LM megatron/core/datasets/indexed_dataset.py _IndexWriter/_IndexReader, core_r0.11.0
as the reference's Dockerfile pins; NeMo's preprocess_data_for_megatron --dataset-impl mmap
writes the same layout). All integers little-endian:

  offset 0   9 bytes   magic b"MMIDIDX\\x00\\x00"
  offset 9   uint64    version (1)
  offset 17  uint8     dtype code of the tokens in .bin (DTYPE_CODES)
  offset 18  uint64    sequence count S
  offset 26  uint64    document count D (entries of the document index: documents + 1)
  offset 34  int32[S]  sequence lengths (tokens)
             int64[S]  sequence pointers (byte offsets into .bin)
             int64[D]  document indices: 0, then the sequence index one past each document's
                       last sequence (C4 as preprocessed: one sequence a document)

The reader memory-maps both files (np.memmap: nothing is read until a token is touched, no
copy), so a 20 GB shard opens in milliseconds. The writer builds the mini corpus and the tests'
files. Megatron's GPTDataset samples sequences (its numel_low_level_dataset is the sequence
count), so `sequence(i)` is what the sampler reads.
"""
import os
import struct

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")          # magic, version, dtype code, sequences, documents
# megatron.core.datasets.indexed_dataset.DType
DTYPE_CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
               7: np.float32, 8: np.uint16}
CODE_OF = {np.dtype(t): c for c, t in DTYPE_CODES.items()}


def optimal_dtype(vocab_size):
  """Megatron's DType.optimal_dtype: uint16 below 65,500 tokens, else int32 (Llama 3's 128,256:
  int32, 4 bytes a token)."""
  return np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32


def paths(prefix):
  return prefix + ".bin", prefix + ".idx"


class IndexedDataset:
  """A read-only view of <prefix>.bin/.idx. `sequence_lengths`, `sequence_pointers` and
  `document_indices` are views into the memory-mapped .idx; `tokens` is the memory-mapped .bin
  as a flat array of the header's dtype."""

  def __init__(self, prefix):
    self.prefix = prefix
    bin_path, idx_path = paths(prefix)
    with open(idx_path, "rb") as f:
      head = f.read(HEADER.size)
    if len(head) < HEADER.size:
      raise ValueError(f"{idx_path}: {len(head)} bytes, shorter than the {HEADER.size}-byte "
                       "header of a Megatron indexed dataset")
    magic, version, code, sequences, documents = HEADER.unpack(head)
    if magic != MAGIC:
      raise ValueError(f"{idx_path}: magic {magic!r} is not {MAGIC!r}: not a Megatron mmap "
                       "indexed dataset (.idx)")
    if version != VERSION:
      raise ValueError(f"{idx_path}: version {version}, only {VERSION} is known")
    if code not in DTYPE_CODES:
      raise ValueError(f"{idx_path}: dtype code {code} is none of {sorted(DTYPE_CODES)}")
    self.dtype = np.dtype(DTYPE_CODES[code])
    self.sequence_count, self.document_count = sequences, documents
    need = HEADER.size + sequences * 4 + sequences * 8 + documents * 8
    if os.path.getsize(idx_path) < need:
      raise ValueError(f"{idx_path}: {os.path.getsize(idx_path)} bytes < the {need} its header "
                       f"announces ({sequences} sequences, {documents} document entries)")
    self._idx = np.memmap(idx_path, dtype=np.uint8, mode="r")
    at = HEADER.size
    self.sequence_lengths = np.frombuffer(self._idx, np.int32, sequences, at)
    at += 4 * sequences
    self.sequence_pointers = np.frombuffer(self._idx, np.int64, sequences, at)
    at += 8 * sequences
    self.document_indices = np.frombuffer(self._idx, np.int64, documents, at)
    size = os.path.getsize(bin_path)
    if size % self.dtype.itemsize:
      raise ValueError(f"{bin_path}: {size} bytes is not a whole number of "
                       f"{self.dtype.name} tokens")
    # np.memmap refuses an empty file; an empty dataset has no tokens to map
    self.tokens = (np.memmap(bin_path, dtype=self.dtype, mode="r") if size
                   else np.zeros(0, self.dtype))
    if sequences:
      end = int(self.sequence_pointers[-1]) + int(self.sequence_lengths[-1]) * self.dtype.itemsize
      if end > size:
        raise ValueError(f"{bin_path}: {size} bytes, but its last sequence ends at byte {end}")

  def __len__(self):
    return self.sequence_count

  @property
  def num_tokens(self) -> int:
    return int(self.sequence_lengths.sum(dtype=np.int64))

  def sequence(self, i, offset=0, length=None):
    """Sequence i's tokens [offset, offset + length) (to its end without length): a view of
    the memory map, no copy (IndexedDataset.get)."""
    start = int(self.sequence_pointers[i]) // self.dtype.itemsize + offset
    stop = start - offset + int(self.sequence_lengths[i]) if length is None else start + length
    return self.tokens[start:stop]

  def document(self, d):
    """Document d's sequences' tokens, joined (one sequence a document: a view)."""
    lo, hi = int(self.document_indices[d]), int(self.document_indices[d + 1])
    if hi - lo == 1:
      return self.sequence(lo)
    return np.concatenate([self.sequence(i) for i in range(lo, hi)])


def write(prefix, documents, dtype=np.int32):
  """Writes <prefix>.bin/.idx: each document (an iterable of token ids) as one sequence, as
  NeMo's preprocess_data_for_megatron does for C4 (a document is one json line). Returns the
  total token count."""
  dtype = np.dtype(dtype)
  if dtype not in CODE_OF:
    raise ValueError(f"dtype {dtype} has no Megatron code; allowed: "
                     f"{', '.join(np.dtype(t).name for t in DTYPE_CODES.values())}")
  bin_path, idx_path = paths(prefix)
  lengths = []
  with open(bin_path, "wb") as out:
    for doc in documents:
      arr = np.asarray(doc)
      if arr.size and (arr.min() < np.iinfo(dtype).min or arr.max() > np.iinfo(dtype).max):
        raise ValueError(f"token ids {arr.min()}..{arr.max()} do not fit {dtype.name}")
      out.write(arr.astype(dtype).tobytes())
      lengths.append(arr.size)
  lengths = np.asarray(lengths, np.int32)
  pointers = np.zeros(len(lengths), np.int64)
  np.cumsum(lengths[:-1].astype(np.int64) * dtype.itemsize, out=pointers[1:])
  doc_index = np.arange(len(lengths) + 1, dtype=np.int64)
  with open(idx_path, "wb") as out:
    out.write(HEADER.pack(MAGIC, VERSION, CODE_OF[dtype], len(lengths), len(doc_index)))
    out.write(lengths.tobytes())
    out.write(pointers.tobytes())
    out.write(doc_index.tobytes())
  return int(lengths.sum(dtype=np.int64))
