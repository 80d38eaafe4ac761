"""Llama 3.1 8B data: Megatron's indexed-dataset files read and written as their documented byte
layout says (header, lengths, pointers, document indices; tokens in .bin), memory-mapped;
GPTDataset's order (documents over epochs shuffled by RandomState(seed), samples of L + 1
tokens running across documents and overlapping by one token, the sample shuffle) against a
hand-worked example and the flat token stream; the eval order (first N, file order); the input
pipeline's host split (2 hosts' rows = 1 host's batch); the mini corpus's entropies against a
direct computation."""
import struct

import numpy as np
import pytest

from workloads.llama31_8b import gpt_sampler, indexed_dataset, input_pipeline, mini_corpus, spec


def write_docs(tmp_path, docs, name="ds", dtype=np.int32):
  prefix = str(tmp_path / name)
  indexed_dataset.write(prefix, docs, dtype)
  return indexed_dataset.IndexedDataset(prefix)


# ----------------------------------------------------------------------------- file format

def test_writer_matches_the_documented_layout(tmp_path):
  docs = [[5, 6, 7], [], [70000, 1], [9]]
  ds = write_docs(tmp_path, docs, dtype=np.int32)
  raw = (tmp_path / "ds.idx").read_bytes()
  magic, version, code, seqs, entries = struct.unpack("<9sQBQQ", raw[:34])
  assert (magic, version, code, seqs, entries) == (b"MMIDIDX\x00\x00", 1, 4, 4, 5)
  lengths = struct.unpack("<4i", raw[34:50])
  pointers = struct.unpack("<4q", raw[50:82])
  doc_idx = struct.unpack("<5q", raw[82:122])
  assert len(raw) == 122
  assert lengths == (3, 0, 2, 1)
  assert pointers == (0, 12, 12, 20)             # byte offsets: 4-byte tokens
  assert doc_idx == (0, 1, 2, 3, 4)
  assert struct.unpack("<6i", (tmp_path / "ds.bin").read_bytes()) == (5, 6, 7, 70000, 1, 9)
  for i, doc in enumerate(docs):
    assert ds.sequence(i).tolist() == doc
  assert ds.sequence(0, 1, 2).tolist() == [6, 7]
  assert ds.num_tokens == 6 and len(ds) == 4 and ds.document_count == 5


def test_reader_reads_hand_packed_bytes_as_uint16_memory_maps(tmp_path):
  """A file built with struct.pack (not the writer): two documents, the first of two
  sequences, uint16 tokens (code 8: Megatron's choice below 65,500 tokens)."""
  tokens = [1, 2, 3, 65000, 4, 5]
  (tmp_path / "h.bin").write_bytes(struct.pack("<6H", *tokens))
  header = struct.pack("<9sQBQQ", b"MMIDIDX\x00\x00", 1, 8, 3, 3)
  body = struct.pack("<3i", 2, 2, 2) + struct.pack("<3q", 0, 4, 8) + struct.pack("<3q", 0, 2, 3)
  (tmp_path / "h.idx").write_bytes(header + body)
  ds = indexed_dataset.IndexedDataset(str(tmp_path / "h"))
  assert ds.dtype == np.uint16
  assert [ds.sequence(i).tolist() for i in range(3)] == [[1, 2], [3, 65000], [4, 5]]
  assert ds.document(0).tolist() == [1, 2, 3, 65000] and ds.document(1).tolist() == [4, 5]
  # no copy: the tokens and the index arrays are views of the memory maps
  assert isinstance(ds.tokens, np.memmap)
  assert np.shares_memory(ds.sequence(1), ds.tokens)
  assert np.shares_memory(ds.sequence_lengths, ds._idx)
  assert np.shares_memory(ds.document_indices, ds._idx)
  assert not ds.sequence_lengths.flags.writeable


def test_reader_rejects_a_foreign_file(tmp_path):
  (tmp_path / "x.idx").write_bytes(b"TNTIDX\x00\x00" + bytes(40))
  (tmp_path / "x.bin").write_bytes(b"")
  with pytest.raises(ValueError, match="magic"):
    indexed_dataset.IndexedDataset(str(tmp_path / "x"))


def test_optimal_dtype_follows_megatron():
  assert indexed_dataset.optimal_dtype(128) == np.uint16
  assert indexed_dataset.optimal_dtype(128_256) == np.int32      # Llama 3's vocabulary


# ----------------------------------------------------------------------------- sampler

HAND_DOCS = [[10, 11, 12], [20, 21, 22, 23, 24], [30, 31], [40, 41, 42, 43]]


def test_samples_cross_documents_and_overlap_by_one_token(tmp_path):
  """Hand-worked: the stream 10 11 12 | 20 .. 24 | 30 31 | 40 .. 43 (14 tokens), L = 4:
  (14 - 1) // 4 = 3 samples of 5 tokens starting every 4, the partial tail dropped."""
  ds = write_docs(tmp_path, HAND_DOCS)
  s = gpt_sampler.GPTSamples(ds, 4, shuffle=False)
  assert len(s) == 3
  assert s.sample(0).tolist() == [10, 11, 12, 20, 21]
  assert s.sample(1).tolist() == [21, 22, 23, 24, 30]
  assert s.sample(2).tolist() == [30, 31, 40, 41, 42]
  assert [s.documents_of(i) for i in range(3)] == [[0, 1], [1, 2], [2, 3]]
  # Megatron's rows: (position in the document index, offset) of each sample's first token
  assert s.sample_index.tolist() == [[0, 0], [1, 1], [2, 0], [3, 2]]
  assert s.sample(0).dtype == np.int32


def test_sample_boundaries_at_document_ends_and_empty_documents(tmp_path):
  # a sample ending on a document's last token: the next starts on that token (offset 4)
  s = gpt_sampler.GPTSamples(write_docs(tmp_path, [[1, 2, 3, 4, 5], [6, 7, 8, 9]], "a"), 4,
                             shuffle=False)
  assert s.sample_index.tolist() == [[0, 0], [0, 4], [1, 3]]
  assert [s.sample(i).tolist() for i in range(2)] == [[1, 2, 3, 4, 5], [5, 6, 7, 8, 9]]
  # an empty document is passed over
  s = gpt_sampler.GPTSamples(write_docs(tmp_path, [[1, 2, 3, 4], [], [5, 6, 7]], "b"), 3,
                             shuffle=False)
  assert s.sample_index.tolist() == [[0, 0], [0, 3], [2, 2]]
  assert [s.sample(i).tolist() for i in range(2)] == [[1, 2, 3, 4], [4, 5, 6, 7]]


def random_docs(rng, n, vocab=1000):
  lengths = rng.integers(0, 40, n)
  lengths[rng.random(n) < 0.1] = 0
  return [rng.integers(1, vocab, k).tolist() for k in lengths]


def stream_of(docs, document_index):
  return np.concatenate([np.asarray(docs[d], np.int64) for d in document_index])


@pytest.mark.parametrize("num_samples", [50, 130, 260])
def test_shuffled_order_is_the_seeded_stream(tmp_path, num_samples):
  """Every epoch holds each document once; the order is RandomState(seed)'s; sample i is the
  stream's tokens [j L, j L + L + 1), j = shuffle_index[i]; same seed same order."""
  rng = np.random.default_rng(0)
  docs = random_docs(rng, 60)
  ds = write_docs(tmp_path, docs)
  L, seed = 16, 1234
  s = gpt_sampler.GPTSamples(ds, L, num_samples, seed)
  tokens = sum(map(len, docs))
  epochs = -(-(num_samples * L + 1) // tokens)
  assert len(s.document_index) == epochs * len(docs)
  assert len(s) == (epochs * tokens - 1) // L >= num_samples
  counts = np.bincount(s.document_index, minlength=len(docs))
  assert (counts == epochs).all()
  stream = stream_of(docs, s.document_index)
  for i in range(len(s)):
    j = int(s.shuffle_index[i])
    assert s.sample(i).tolist() == stream[j * L:j * L + L + 1].tolist()
  assert sorted(np.asarray(s.shuffle_index).tolist()) == list(range(len(s)))
  again = gpt_sampler.GPTSamples(ds, L, num_samples, seed)
  assert np.array_equal(again.shuffle_index, s.shuffle_index)
  assert np.array_equal(again.document_index, s.document_index)
  other = gpt_sampler.GPTSamples(ds, L, num_samples, seed + 1)
  assert not np.array_equal(other.document_index, s.document_index)


def test_document_and_shuffle_index_are_randomstate_permutations(tmp_path):
  """One epoch's worth of samples (no separate final epoch): the document index is
  RandomState(seed).shuffle of the documents tiled over the epochs, and the shuffle index the
  same RandomState's next shuffle of range(samples)."""
  rng = np.random.default_rng(1)
  docs = random_docs(rng, 30)
  ds = write_docs(tmp_path, docs)
  L = 8
  per_epoch = (sum(map(len, docs)) - 1) // L
  s = gpt_sampler.GPTSamples(ds, L, per_epoch * 2 - 1, seed=7)   # 2 epochs, most of the 2nd
  state = np.random.RandomState(7)
  expect = np.tile(np.arange(len(docs), dtype=np.int32), 2)
  state.shuffle(expect)
  assert np.array_equal(s.document_index, expect)
  shuffle = np.arange(len(s), dtype=np.uint32)
  state.shuffle(shuffle)
  assert np.array_equal(s.shuffle_index, shuffle)


def test_a_short_final_epoch_is_shuffled_apart(tmp_path):
  """A few samples into the 3rd epoch (< 80% of one): epochs 1-2 and 3 are permuted apart,
  and so are the samples before the 3rd epoch and those after."""
  rng = np.random.default_rng(2)
  docs = random_docs(rng, 40)
  ds = write_docs(tmp_path, docs)
  L, tokens = 8, sum(map(len, docs))
  before = (2 * tokens - 1) // L
  s = gpt_sampler.GPTSamples(ds, L, before + 3, seed=3)
  first, last = s.document_index[:2 * len(docs)], s.document_index[2 * len(docs):]
  assert sorted(last.tolist()) == list(range(len(docs)))
  assert (np.bincount(first, minlength=len(docs)) == 2).all()
  assert sorted(np.asarray(s.shuffle_index[:before]).tolist()) == list(range(before))
  assert sorted(np.asarray(s.shuffle_index[before:]).tolist()) == list(range(before, len(s)))


def test_sample_index_rows_point_at_each_start(tmp_path):
  rng = np.random.default_rng(4)
  docs = random_docs(rng, 80)
  ds = write_docs(tmp_path, docs)
  L = 12
  old = gpt_sampler.CHUNK
  gpt_sampler.CHUNK = 7                   # many chunks: the chunk seams are exercised
  try:
    s = gpt_sampler.GPTSamples(ds, L, 400, seed=5)
  finally:
    gpt_sampler.CHUNK = old
  whole = gpt_sampler.GPTSamples(ds, L, 400, seed=5)
  assert np.array_equal(s.sample_index, whole.sample_index)
  lengths = np.array([len(docs[d]) for d in s.document_index])
  starts = np.concatenate([[0], np.cumsum(lengths)])
  for j, (k, off) in enumerate(s.sample_index[1:], start=1):
    assert starts[k] + off == j * L and 0 <= off < lengths[k]


def test_cached_indices_equal_fresh_ones(tmp_path):
  ds = write_docs(tmp_path, random_docs(np.random.default_rng(5), 50))
  fresh = gpt_sampler.GPTSamples(ds, 8, 100, 11)
  for _ in range(2):                      # built, then memory-mapped from the cache
    cached = gpt_sampler.GPTSamples(ds, 8, 100, 11, cache_dir=str(tmp_path / "cache"))
    for name in ("document_index", "sample_index", "shuffle_index"):
      assert np.array_equal(getattr(cached, name), getattr(fresh, name))
  assert isinstance(cached.shuffle_index, np.memmap)


def test_blending_indices():
  d, i = gpt_sampler.blending_indices([3, 1], 8)        # worked by hand: furthest behind first
  assert d.tolist() == [0, 1, 0, 0, 0, 1, 0, 0]
  assert i.tolist() == [0, 0, 1, 2, 3, 1, 4, 5]
  d, i = gpt_sampler.blending_indices([12.5] * 8, 20)   # the reference's full-dataset blend
  assert d.tolist() == [k % 8 for k in range(20)] and i.tolist() == [k // 8 for k in range(20)]
  assert gpt_sampler.blend_sizes([1, 1], 1000) == [503, 503]    # + 0.5%, rounded up


# ----------------------------------------------------------------------------- pipeline

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  cfg = spec.tiny()
  info = input_pipeline.prepare_mini(cfg.data, str(tmp_path_factory.mktemp("mini")))
  return cfg, info["dir"]


def test_two_hosts_rows_are_one_hosts_batch(tiny):
  cfg, folder = tiny
  gbs = cfg.train.global_batch_size
  one = input_pipeline.train_dataset(cfg, gbs, 5, folder).take(3)
  halves = [input_pipeline.train_dataset(cfg, gbs, 5, folder, i, 2).take(3) for i in range(2)]
  for whole, a, b in zip(one.as_numpy_iterator(), *[h.as_numpy_iterator() for h in halves]):
    for key in ("tokens", "labels"):
      assert whole[key].dtype == np.int32 and whole[key].shape == (gbs, cfg.data.max_seq_length)
      assert np.array_equal(np.concatenate([a[key], b[key]]), whole[key])
    assert np.array_equal(whole["tokens"][:, 1:], whole["labels"][:, :-1])


def test_train_batches_follow_the_sampler(tiny):
  cfg, folder = tiny
  gbs = cfg.train.global_batch_size
  stream = input_pipeline.train_stream(cfg, gbs, 5, folder)
  batches = list(input_pipeline.train_dataset(cfg, gbs, 5, folder).take(2).as_numpy_iterator())
  for step, batch in enumerate(batches):
    rows = np.stack([stream.sample(step * gbs + r) for r in range(gbs)])
    assert np.array_equal(batch["tokens"], rows[:, :-1])
    assert np.array_equal(batch["labels"], rows[:, 1:])
  other = next(input_pipeline.train_dataset(cfg, gbs, 6, folder).as_numpy_iterator())
  assert not np.array_equal(other["tokens"], batches[0]["tokens"])


def test_eval_is_the_first_sequences_in_file_order_padded(tiny):
  cfg, folder = tiny
  L, n = cfg.data.max_seq_length, cfg.data.eval_examples
  flat = input_pipeline.open_prefix(folder, mini_corpus.EVAL_PREFIX).tokens
  one = list(input_pipeline.eval_dataset(cfg, 256, folder).as_numpy_iterator())
  rows = np.concatenate([b["tokens"] for b in one])
  mask = np.concatenate([b["mask"] for b in one])
  assert mask.dtype == np.float32 and mask.sum() == n and all(len(b["mask"]) == 256 for b in one)
  real = rows[mask == 1]
  expect = np.stack([flat[i * L:i * L + L] for i in range(n)]).astype(np.int32)
  assert np.array_equal(real, expect)
  hosts = [list(input_pipeline.eval_dataset(cfg, 256, folder, i, 2).as_numpy_iterator())
           for i in range(2)]
  assert len(hosts[0]) == len(hosts[1])
  got = np.concatenate([b["tokens"][b["mask"] == 1] for h in hosts for b in h])
  assert sorted(map(bytes, got)) == sorted(map(bytes, expect))


def test_synthetic_batch_shapes():
  cfg = spec.tiny()
  batch = input_pipeline.synthetic_batch(cfg, 4, 0)
  assert batch["tokens"].shape == batch["labels"].shape == (4, cfg.data.max_seq_length)
  assert batch["tokens"].dtype == np.int32
  assert np.array_equal(batch["tokens"][:, 1:], batch["labels"][:, :-1])


# ----------------------------------------------------------------------------- mini corpus

def direct_probabilities(chains, window):
  """p(x_{t+1} | x_0..x_t) as a ratio of joint probabilities, each the product over the
  window's documents (split at EOD) of a sum over that document's topic; the occupancy by
  its power series, the chains from the successor table."""
  v, k_count, q = chains.vocab_size, chains.topics, chains.q
  trans = np.zeros((k_count, v, v))
  for k in range(k_count):
    for w in range(1, v):
      for j, nxt in enumerate(chains.successors[k, w]):
        trans[k, w, nxt] += chains.probs[j]
  start = np.full(v, 1 / (v - 1))
  start[0] = 0
  mu = np.zeros((k_count, v))
  for k in range(k_count):
    term = start.copy()
    for t in range(3000):
      mu[k] += q * (1 - q) ** t * term
      term = term @ trans[k]

  def joint(x):
    total, t = 1.0, 0
    first_doc = True
    while t < len(x):
      end = t
      while end < len(x) and x[end] != 0:
        end += 1
      seg = x[t:end]                           # the words of one document in the window
      closed = end < len(x)                    # followed by its EOD
      if len(seg):
        p = 0.0
        for k in range(k_count):
          pk = (mu[k, seg[0]] if first_doc and t == 0 else start[seg[0]]) / k_count
          for a, b in zip(seg[:-1], seg[1:]):
            pk *= (1 - q) * trans[k, a, b]
          p += pk
        total *= p * (q if closed else 1.0)
      elif closed and t == 0:
        total *= 1.0                           # the window starts on an EOD
      first_doc = False
      t = end + 1
    return total

  return [joint(window[:t + 2]) / joint(window[:t + 1]) for t in range(len(window) - 1)]


def test_mini_entropy_against_a_direct_computation():
  chains = mini_corpus.Chains(vocab_size=7, topics=2, mean_document_length=5, seed=3)
  docs, _ = chains.documents(60)
  flat = np.concatenate(docs)
  L = 10
  windows = np.stack([flat[i * L:i * L + L + 1] for i in range(20)])
  got = mini_corpus.predictive(chains, windows)["true"]
  for w, row in zip(windows, got):
    assert np.allclose(row, direct_probabilities(chains, w), rtol=1e-9)
  ent = mini_corpus.entropies(chains, windows)
  assert ent["true"] == pytest.approx(-np.log(got).mean())
  assert ent["true"] < ent["bigram"] < ent["unigram"]
  uni = mini_corpus.unigram(chains)
  assert uni.sum() == pytest.approx(1.0)
  # the stationary distribution is the generated corpus's token frequency
  big, _ = chains.documents(20000)
  freq = np.bincount(np.concatenate(big), minlength=7) / sum(map(len, big))
  assert np.allclose(freq, uni, atol=0.01)
  assert ent["unigram_entropy"] == pytest.approx(-(uni * np.log(uni)).sum())


def test_default_mini_corpus_entropies(tiny):
  """The preset's corpus: a target between the best achievable and the bigram-only loss."""
  cfg, folder = tiny
  ent = input_pipeline.mini_entropies(cfg, folder)
  assert 0.5 < ent["true"] < 0.9 < ent["bigram"] < ent["unigram"]
