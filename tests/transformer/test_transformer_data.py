"""The Transformer's input pipeline on files the test writes in the MLPerf reference's format
(mlcommons/training, retired transformer, data_download.py): TFRecord shards
wmt32k-train-0000N-of-0000M of tf.train.Example with int64 lists 'inputs' and 'targets'
(subtoken ids ending in EOS=1), a vocabulary file in the reference format and the raw
newstest2014.en / newstest2014.de lines; and the generated mini set, checked against a
re-derivation of its translations from the lexicon."""
import collections
import os
import types

import numpy as np
import pytest
import tensorflow as tf

from harness.errors import UsageError
from workloads.transformer import input_pipeline, mini_corpus, spec, subwords
from workloads.transformer.subwords import EOS_ID

MAX_LENGTH = 10          # training pairs: at most 10 ids, EOS included
EVAL_MAX_LENGTH = 12     # eval inputs: at most 12 ids, EOS included
PACKED_LENGTH = 20       # packed rows: 20 ids a side (pairs have 4..12: every pair is kept)
WORDS = ("the cat dog sat ran on under a mat big small red fast slowly today "
         "die Katze Hund saß lief auf unter eine Matte groß klein rot schnell langsam heute "
         "über Äpfel").split()


def _encoder():
  return subwords.build_word_level(WORDS, extra_chars=".,")


def _example(source_ids, target_ids):
  ints = lambda ids: tf.train.Feature(int64_list=tf.train.Int64List(value=ids))
  return tf.train.Example(features=tf.train.Features(feature={
      "inputs": ints(source_ids), "targets": ints(target_ids)})).SerializeToString()


def _sentence(rng, low, high, language):
  words = WORDS[:15] if language == "en" else WORDS[15:]
  return " ".join(rng.choice(words, size=rng.integers(low, high + 1))) + "."


def _pairs(encoder):
  """Distinct (source ids, target ids) pairs, both ending in EOS; some too long on either side
  and the boundary cases written out: exactly MAX_LENGTH ids kept, MAX_LENGTH + 1 discarded."""
  rng = np.random.default_rng(7)
  ids = lambda text: tuple(encoder.encode(text) + [EOS_ID])
  pairs = {}
  while len(pairs) < 46:
    # 1..9 words + "." (2 ids: "." and the word-end "_") + EOS: 4..12 ids per side
    pairs.setdefault((ids(_sentence(rng, 1, 9, "en")), ids(_sentence(rng, 1, 9, "de"))), None)
  pairs = list(pairs)
  # "w w ... w." with k words is k + 3 ids
  exact = lambda k, lang: ids(" ".join([("cat" if lang == "en" else "Katze")] * k) + ".")
  assert len(exact(7, "en")) == MAX_LENGTH and len(exact(8, "de")) == MAX_LENGTH + 1
  pairs += [(exact(7, "en"), exact(7, "de")),           # both exactly max_length: kept
            (exact(8, "en"), exact(2, "de")),           # source one too long
            (exact(2, "en"), exact(8, "de")),           # target one too long
            (exact(1, "en"), exact(1, "de"))]
  assert len(set(pairs)) == len(pairs)
  return pairs


def _kept(pairs, max_length=MAX_LENGTH):
  return [p for p in pairs if len(p[0]) <= max_length and len(p[1]) <= max_length]


def _write_shards(folder, pairs, shards):
  """Round-robin over `shards` files named as data_download.py names them (1-based)."""
  os.makedirs(folder, exist_ok=True)
  for shard in range(shards):
    path = os.path.join(folder, f"wmt32k-train-{shard + 1:05d}-of-{shards:05d}")
    with tf.io.TFRecordWriter(path) as w:
      for source, target in pairs[shard::shards]:
        w.write(_example(source, target))


EVAL_SOURCE = [
    "the cat sat on the mat.",
    "a big red dog ran under a small mat today slowly.",   # 11 words, ".", "_", EOS: cut
    "the dog, the cat.",
    "Äpfel 5€.",             # "€" is outside the alphabet: escaped, 8 ids; 12 in all
    "the cat ran fast.",
    "a dog sat.",
    "the mat.",
    "the red cat.",
    "a small dog ran.",
    "today.",
    "the big cat sat.",                                    # lines past eval_examples=9
    "slowly.",
]
EVAL_REFERENCE = [f"Referenz Satz {i} über Äpfel ." for i in range(len(EVAL_SOURCE))]
EVAL_REFERENCE[2] = "  mit Leerzeichen am Rand  "        # kept as is (only "\n" is stripped)


@pytest.fixture(scope="module")
def wmt(tmp_path_factory):
  """The reference's data dir: 2 train shards, vocab.ende.32768, newstest2014.{en,de}."""
  root = tmp_path_factory.mktemp("wmt")
  encoder = _encoder()
  pairs = _pairs(encoder)
  _write_shards(str(root), pairs, 2)
  encoder.save(str(root / "vocab.ende.32768"))
  (root / "newstest2014.en").write_text("".join(s + "\n" for s in EVAL_SOURCE), encoding="utf-8")
  (root / "newstest2014.de").write_text("".join(s + "\n" for s in EVAL_REFERENCE),
                                        encoding="utf-8")
  return types.SimpleNamespace(dir=str(root), pairs=pairs, encoder=encoder)


def _cfg(shuffle_buffer=1, eval_examples=9, packing=False):
  """Packed: in rows of PACKED_LENGTH (rows of MAX_LENGTH would rarely take two pairs)."""
  cfg = spec.reference()
  assert cfg.data.source == "tfrecord" and cfg.data.packing
  cfg.data.packing = packing
  cfg.data.max_length = PACKED_LENGTH if packing else MAX_LENGTH
  cfg.data.eval_max_length = EVAL_MAX_LENGTH
  cfg.data.shuffle_buffer, cfg.data.eval_examples = shuffle_buffer, eval_examples
  return cfg


def _unpad(row):
  ids = tuple(int(i) for i in row)
  end = ids.index(EOS_ID) + 1
  assert all(i == 0 for i in ids[end:]), ids           # padded with 0 after EOS
  assert 0 not in ids[:end]
  return ids[:end]


def _rows(ds, num_batches, cfg, host_batch):
  """The pairs of the first num_batches batches, checking every batch against batch_layout."""
  layout = spec.batch_layout(cfg, host_batch)
  rows = []
  for batch in ds.take(num_batches).as_numpy_iterator():
    assert set(batch) == set(layout)
    for name, (shape, dtype, _) in layout.items():
      assert batch[name].shape == shape and batch[name].dtype == np.dtype(dtype), name
    rows += [(_unpad(s), _unpad(t)) for s, t in zip(batch["inputs"], batch["targets"])]
  assert len(rows) == num_batches * host_batch
  return rows


def _first_epoch(rows):
  """With no shuffling and one file per reader, the rows up to the first repeated pair (every
  written pair is distinct) are one epoch."""
  seen = set()
  for n, row in enumerate(rows):
    if row in seen:
      return rows[:n]
    seen.add(row)
  raise AssertionError("no pair repeated: collect more batches")


# ----------------------------------------------------------------------------- training

def test_train_discards_long_pairs_pads_the_rest_and_reads_every_kept_pair(wmt, tmp_path):
  """One shard, no shuffling: an epoch's worth of rows is exactly the kept pairs (multiset)."""
  _write_shards(str(tmp_path), wmt.pairs, 1)
  cfg = _cfg(shuffle_buffer=1)
  kept = _kept(wmt.pairs)
  assert 20 < len(kept) < len(wmt.pairs) - 10          # both cases well represented
  ds = input_pipeline.train_dataset(cfg, 8, seed=0, data_dir=str(tmp_path))
  rows = _rows(ds, -(-2 * len(kept) // 8), cfg, 8)      # two epochs' worth (it repeats)
  assert collections.Counter(rows[:len(kept)]) == collections.Counter(kept)
  assert rows[len(kept):2 * len(kept)] == rows[:len(kept)]     # then the file again


def test_train_shuffles_over_two_shards_and_never_yields_a_long_pair(wmt):
  """The reference's two-shard folder with a shuffle buffer: the shuffled stream of several
  epochs holds every kept pair and nothing else, in another order than the files'."""
  cfg = _cfg(shuffle_buffer=4)
  kept = _kept(wmt.pairs)
  ds = input_pipeline.train_dataset(cfg, 16, seed=3, data_dir=wmt.dir)
  rows = _rows(ds, -(-5 * len(kept) // 16), cfg, 16)
  # An element waits in a 4-slot buffer with probability 3/4 per draw: after the > 4 epochs
  # (> 150 draws) since it entered, every kept pair has been drawn (miss chance < 1e-18).
  assert set(rows) == set(kept)
  unshuffled = _rows(input_pipeline.train_dataset(_cfg(shuffle_buffer=1), 16, seed=3,
                                                   data_dir=wmt.dir), 2, cfg, 16)
  assert rows[:32] != unshuffled                         # equal with chance < 4^-28


def test_two_hosts_read_every_pair_exactly_once_per_epoch(wmt):
  """Two hosts over two shards: sharded_records gives each host its own file, so the hosts'
  epochs are disjoint and together exactly the kept pairs."""
  cfg = _cfg(shuffle_buffer=1)
  kept = _kept(wmt.pairs)
  epochs = []
  for host in range(2):
    ds = input_pipeline.train_dataset(cfg, 8, seed=0, data_dir=wmt.dir, process_index=host,
                                      process_count=2)
    rows = _rows(ds, len(kept), cfg, 4)                 # per-host batch: 8 / 2
    epochs.append(_first_epoch(rows))
  assert all(epochs)
  assert not set(epochs[0]) & set(epochs[1])
  assert collections.Counter(epochs[0] + epochs[1]) == collections.Counter(kept)
  # ... and with shuffling, the hosts still never share a pair over several epochs.
  cfg = _cfg(shuffle_buffer=4)
  seen = []
  for host in range(2):
    ds = input_pipeline.train_dataset(cfg, 8, seed=5, data_dir=wmt.dir, process_index=host,
                                      process_count=2)
    seen.append(set(_rows(ds, len(kept), cfg, 4)))      # ~8 epochs of a host's half
  assert not seen[0] & seen[1] and seen[0] | seen[1] == set(kept)


def _unpack(batch):
  """The (source, target) pairs of a packed batch's rows, checking each row's layout: segments
  1..n on both sides in order, positions restarting at 0, zeros where the segment is 0."""
  pairs = []
  for r in range(batch["inputs"].shape[0]):
    sides = []
    for name in ("inputs", "targets"):
      ids, seg, pos = (batch[name][r], batch[f"{name}_segmentation"][r],
                       batch[f"{name}_position"][r])
      used = int(np.sum(seg > 0))
      assert np.all(seg[used:] == 0) and np.all(ids[used:] == 0) and np.all(pos[used:] == 0)
      assert np.all(np.diff(seg[:used]) >= 0) and seg[0] == 1
      examples = []
      for s in range(1, int(seg.max()) + 1):
        where = seg == s
        assert np.array_equal(pos[where], np.arange(where.sum()))
        examples.append(tuple(int(i) for i in ids[where]))
      sides.append(examples)
    assert len(sides[0]) == len(sides[1])                # a segment per pair on both sides
    pairs += [(a, b) for a, b in zip(*sides)]
  return pairs


def test_packed_rows_hold_every_kept_pair_once_per_epoch(wmt, tmp_path):
  """Packing (one shard, no shuffling): an epoch is count_rows rows whose examples are exactly
  the kept pairs in file order, packed greedily (the next pair never fits in a row's space)."""
  _write_shards(str(tmp_path), wmt.pairs, 1)
  cfg = _cfg(packing=True)
  kept = _kept(wmt.pairs, PACKED_LENGTH)
  rows = input_pipeline.count_rows(input_pipeline.tfrecord_files(str(tmp_path), "*train*"),
                                   cfg.data)
  assert len(kept) / 5 < rows < len(kept) * 0.8           # 4..12 ids a side in rows of 20
  ds = input_pipeline.train_dataset(cfg, 1, seed=0, data_dir=str(tmp_path))
  layout = spec.batch_layout(cfg, 1)
  assert set(layout) == {"inputs", "targets", *spec.PACKED_FEATURES}
  batches = list(ds.take(rows + 1).as_numpy_iterator())
  for batch in batches:
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
        k: (shape, np.dtype(dtype)) for k, (shape, dtype, _) in layout.items()}
  per_row = [_unpack(b) for b in batches]
  assert [p for row in per_row[:rows] for p in row] == kept
  assert per_row[rows] == per_row[0]                     # then the next epoch, the same rows
  for row, following in zip(per_row[:rows - 1], per_row[1:rows]):
    source, target = following[0]                        # greedy: it did not fit
    assert (sum(map(len, (p[0] for p in row))) + len(source) > PACKED_LENGTH or
            sum(map(len, (p[1] for p in row))) + len(target) > PACKED_LENGTH)
  ctx = types.SimpleNamespace(data_dir=str(tmp_path))
  assert input_pipeline.data_source(cfg, ctx) == (str(tmp_path), rows)   # train_samples
  assert spec.sample_unit(cfg) == "packed rows"


def test_packed_rows_over_two_shards_and_two_hosts_count_the_same(wmt):
  """Rows never span two files, so the epoch's row count is the same for one host or two, and
  the two hosts' rows together hold every kept pair once."""
  cfg = _cfg(packing=True)
  kept = _kept(wmt.pairs, PACKED_LENGTH)
  files = input_pipeline.tfrecord_files(wmt.dir, "*train*")
  total = input_pipeline.count_rows(files, cfg.data)
  per_host = [input_pipeline.count_rows(files[h::2], cfg.data) for h in range(2)]
  assert sum(per_host) == total
  pairs = []
  for host in range(2):
    ds = input_pipeline.train_dataset(cfg, 2, seed=0, data_dir=wmt.dir, process_index=host,
                                      process_count=2)
    for batch in ds.take(per_host[host]).as_numpy_iterator():
      pairs += _unpack(batch)
  assert collections.Counter(pairs) == collections.Counter(kept)


def test_synthetic_packed_batch_is_laid_out_as_packed_rows():
  cfg = spec.synthetic()
  assert cfg.data.packing
  batch = input_pipeline.synthetic_batch(cfg, 3, seed=0)
  assert set(batch) == set(spec.batch_layout(cfg, 3))
  pairs = _unpack(batch)
  assert len(pairs) > 3 * 4                             # rows of 256, examples of <= 64
  for source, target in pairs:
    assert source[-1] == target[-1] == EOS_ID and len(source) == len(target) >= 2
    assert all(2 <= i < cfg.model.vocab_size for i in source[:-1] + target[:-1])


# ----------------------------------------------------------------------------- eval

def _expected_eval_row(encoder, line):
  ids = encoder.encode(line)[:EVAL_MAX_LENGTH - 1] + [EOS_ID]
  return ids + [0] * (EVAL_MAX_LENGTH - len(ids))


def test_eval_inputs_are_the_encoded_lines_with_eos_cut_and_padded(wmt):
  cfg = _cfg()
  batches = list(input_pipeline.eval_dataset(cfg, 4, data_dir=wmt.dir).as_numpy_iterator())
  layout = spec.batch_layout(cfg, 4, with_mask=True)
  for batch in batches:
    assert set(batch) == set(layout)
    for name, (shape, dtype, _) in layout.items():
      assert batch[name].shape == shape and batch[name].dtype == np.dtype(dtype), name
  inputs = np.concatenate([b["inputs"] for b in batches])
  index = np.concatenate([b["index"] for b in batches])
  mask = np.concatenate([b["mask"] for b in batches])
  assert len(batches) == 3 and mask.tolist() == [1] * 9 + [0] * 3    # 9 lines, batches of 4
  assert index[:9].tolist() == list(range(9))
  for n in range(9):
    assert inputs[n].tolist() == _expected_eval_row(wmt.encoder, EVAL_SOURCE[n]), n
  long_ids = wmt.encoder.encode(EVAL_SOURCE[1])
  assert len(long_ids) + 1 > EVAL_MAX_LENGTH                          # it was cut ...
  assert inputs[1].tolist() == long_ids[:EVAL_MAX_LENGTH - 1] + [EOS_ID]   # ... and ends in EOS
  assert (inputs[9:] == 0).all()                                       # padding rows


def test_eval_over_two_hosts_counts_every_line_once_with_equal_batch_counts(wmt):
  """9 lines, global batch 4 over 2 hosts (2 a host): shares of 5 and 4 lines, 3 batches each
  (ceil(ceil(9 / 2) / 2)); 1 and 2 padding rows."""
  cfg = _cfg()
  real, counts = [], []
  for host in range(2):
    batches = list(input_pipeline.eval_dataset(cfg, 4, data_dir=wmt.dir, process_index=host,
                                               process_count=2).as_numpy_iterator())
    counts.append(len(batches))
    layout = spec.batch_layout(cfg, 2, with_mask=True)
    for batch in batches:
      for name, (shape, dtype, _) in layout.items():
        assert batch[name].shape == shape and batch[name].dtype == np.dtype(dtype), name
      for ids, index, mask in zip(batch["inputs"], batch["index"], batch["mask"]):
        assert mask in (0.0, 1.0)
        if mask:
          real.append(int(index))
          assert ids.tolist() == _expected_eval_row(wmt.encoder, EVAL_SOURCE[index])
        else:
          assert not ids.any()
    assert sum(int(b["mask"].sum()) for b in batches) == (5, 4)[host]
  assert counts == [3, 3]
  assert sorted(real) == list(range(9))


def test_eval_text_gives_the_vocabulary_and_the_raw_reference_lines(wmt):
  cfg = _cfg()
  encoder, references = input_pipeline.eval_text(cfg, wmt.dir)
  assert references == EVAL_REFERENCE[:9]
  assert encoder.subtokens == wmt.encoder.subtokens
  batch = next(input_pipeline.eval_dataset(cfg, 16, data_dir=wmt.dir).as_numpy_iterator())
  lengths = [len(encoder.encode(line)) + 1 for line in EVAL_SOURCE[:9]]
  assert lengths[3] == EVAL_MAX_LENGTH                      # exactly fits: not cut
  assert [n for n in range(9) if lengths[n] > EVAL_MAX_LENGTH] == [1]
  for n in range(9):
    if n != 1:                                             # line 1 was cut
      assert encoder.decode_until_eos(batch["inputs"][n]) == EVAL_SOURCE[n], n
  with pytest.raises(ValueError, match="eval_examples=20"):
    input_pipeline.eval_text(_cfg(eval_examples=20), wmt.dir)       # only 12 lines


# ----------------------------------------------------------------------------- missing files

def test_missing_data_names_exactly_the_absent_files(wmt, tmp_path):
  import shutil
  folder = tmp_path / "data"
  shutil.copytree(wmt.dir, folder)
  cfg = _cfg()
  assert spec.missing_data(cfg, str(folder)) == []
  os.remove(folder / "wmt32k-train-00001-of-00002")
  assert spec.missing_data(cfg, str(folder)) == []          # one shard still matches
  expected = []
  for name, reported in (("wmt32k-train-00002-of-00002", "*train*"),
                         ("newstest2014.de", "newstest2014.de"),
                         ("vocab.ende.32768", "vocab.ende.32768"),
                         ("newstest2014.en", "newstest2014.en")):
    os.remove(folder / name)
    expected.append(reported)
    assert sorted(spec.missing_data(cfg, str(folder))) == sorted(expected)
  cfg.data.source = "mini"
  assert spec.missing_data(cfg, str(folder)) == []
  cfg.data.source = "synthetic"
  assert spec.missing_data(cfg, str(folder)) == []


# ----------------------------------------------------------------------------- mini set

def _translations(source, lex):
  """The mini grammar's translations, re-derived: DET [ADJ] NOUN VERB DET [ADJ] NOUN [ADV] .
  -> DET NOUN [ADJ] DET NOUN [ADJ] VERB [ADV] . with every word mapped through the lexicon
  (an adverb has two translations: the set of both sentences)."""
  assert source.endswith(".")
  where = {w: (c, i) for c, (src, _) in lex.items() for i, w in enumerate(src)}
  target = lambda w: lex[where[w][0]][1][where[w][1]]
  words = source[:-1].split(" ")
  kinds = [where[w][0] for w in words]

  def noun_phrase(k):
    assert kinds[k] == "det"
    if kinds[k + 1] == "adj":
      assert kinds[k + 2] == "noun"
      return [target(words[k]), target(words[k + 2]), target(words[k + 1])], k + 3
    assert kinds[k + 1] == "noun"
    return [target(words[k]), target(words[k + 1])], k + 2

  subject, k = noun_phrase(0)
  assert kinds[k] == "verb"
  verb = target(words[k])
  obj, k = noun_phrase(k + 1)
  endings = [[]]
  if k < len(words):
    assert kinds[k] == "adverb" and k == len(words) - 1
    i, n = where[words[k]][1], len(lex["adverb"][0])
    endings = [[lex["adverb"][1][i]], [lex["adverb"][1][i + n]]]
  return {" ".join(subject + obj + [verb] + rest) + "." for rest in endings}


def _read_pairs(path, encoder):
  out = []
  for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
    example = tf.train.Example.FromString(record)
    ids = {k: list(example.features.feature[k].int64_list.value) for k in ("inputs", "targets")}
    assert ids["inputs"][-1] == EOS_ID and ids["targets"][-1] == EOS_ID
    assert EOS_ID not in ids["inputs"][:-1] + ids["targets"][:-1]
    out.append((encoder.decode(ids["inputs"][:-1]), encoder.decode(ids["targets"][:-1])))
  return out


def test_mini_set_is_written_once_in_the_reference_format_and_translates_exactly(tmp_path):
  cfg = spec.SPEC.configure("tiny")
  d = cfg.data
  info = input_pipeline.prepare_mini(d, str(tmp_path))
  folder = info["dir"]
  assert os.path.dirname(folder) == str(tmp_path)
  names = sorted(os.listdir(folder))
  assert names == ["eval.ref", "eval.src", "info.json", "train-00000-of-00002",
                   "train-00001-of-00002", "vocab.mini"]
  mtimes = {n: os.stat(os.path.join(folder, n)).st_mtime_ns for n in names}
  again = input_pipeline.prepare_mini(d, str(tmp_path))            # cached: nothing rewritten
  assert again == info
  assert sorted(os.listdir(folder)) == names and len(os.listdir(tmp_path)) == 1
  assert {n: os.stat(os.path.join(folder, n)).st_mtime_ns for n in names} == mtimes

  encoder = subwords.SubwordEncoder.from_file(os.path.join(folder, "vocab.mini"))
  assert encoder.vocab_size == info["vocab_size"] == cfg.model.vocab_size    # spec.derive
  assert info["train_examples"] == d.mini_train_pairs == 256
  lex = mini_corpus.lexicon(d.mini_seed, d.mini_words)
  train = [p for shard in ("train-00000-of-00002", "train-00001-of-00002")
           for p in _read_pairs(os.path.join(folder, shard), encoder)]
  assert len(train) == 256
  assert len(set(train)) > 100                                 # not one sentence repeated
  with open(os.path.join(folder, "eval.src"), encoding="utf-8") as f:
    sources = f.read().splitlines()
  with open(os.path.join(folder, "eval.ref"), encoding="utf-8") as f:
    references = f.read().splitlines()
  assert len(sources) == len(references) == d.eval_examples
  for source, target in train + list(zip(sources, references)):
    assert target in _translations(source, lex), source
  synonyms = {t.split(" ")[-1][:-1] for s, t in train if len(_translations(s, lex)) == 2}
  assert len(synonyms) > len(lex["adverb"][0])              # both translations are used
  assert any(c in "äöüß" for _, t in train for c in t)      # the non-ASCII target side
  # The run's entry point reports the count and reads the set back in batch_layout shapes
  # (a pair a row here; packed rows have their own tests above).
  cfg.data.packing = False
  folder2, examples = input_pipeline.data_source(cfg, types.SimpleNamespace(
      data_dir=str(tmp_path / "runs")))
  assert examples == 256 and os.path.dirname(folder2) == str(tmp_path / "runs" /
                                                              "transformer_mini")
  batch = next(input_pipeline.train_dataset(cfg, 32, 0, folder2).as_numpy_iterator())
  for name, (shape, dtype, _) in spec.batch_layout(cfg, 32).items():
    assert batch[name].shape == shape and batch[name].dtype == np.dtype(dtype)
  for s, t in zip(batch["inputs"], batch["targets"]):
    assert encoder.decode(_unpad(t)[:-1]) in _translations(encoder.decode(_unpad(s)[:-1]), lex)


def test_derive_sets_the_mini_vocabulary_size_and_refuses_zero_elsewhere():
  for preset in ("tiny", "mini"):
    cfg = spec.SPEC.configure(preset)
    vocab = mini_corpus.vocabulary(cfg.data.mini_seed, cfg.data.mini_words)
    assert cfg.model.vocab_size == vocab.vocab_size > 3
  assert spec.SPEC.configure("tiny", ["data.mini_words=6"]).model.vocab_size > \
      spec.SPEC.configure("tiny").model.vocab_size
  with pytest.raises(UsageError, match="model.vocab_size=0 needs data.source=mini"):
    spec.SPEC.configure("tiny", ["data.source=tfrecord"])


# ----------------------------------------------------------------------------- synthetic

def test_synthetic_batch_has_the_real_shapes_ids_then_eos_then_zeros():
  cfg = spec.SPEC.configure("synthetic", ["data.packing=false"])
  batch = input_pipeline.synthetic_batch(cfg, 16, seed=0)
  layout = spec.batch_layout(cfg, 16)
  assert set(batch) == set(layout)
  for name, (shape, dtype, _) in layout.items():
    rows = batch[name]
    assert rows.shape == shape == (16, 256) and rows.dtype == np.dtype(dtype), name
    for row in rows:
      end = int(np.flatnonzero(row == EOS_ID)[0])
      assert 128 <= end < 256                                # EOS in the second half
      assert (row[end + 1:] == 0).all()
      assert (row[:end] >= 2).all() and (row[:end] < cfg.model.vocab_size).all()
  assert not np.array_equal(batch["inputs"], batch["targets"])
  again = input_pipeline.synthetic_batch(cfg, 16, seed=0)
  assert all(np.array_equal(batch[k], again[k]) for k in batch)        # seeded


def test_describe_without_a_data_dir_reads_no_data():
  """`describe --preset reference` has no --data-dir: data_source must not look for files to
  count packed rows in (it used to fail on the missing folder)."""
  cfg = spec.SPEC.configure("reference")
  assert cfg.data.packing
  assert input_pipeline.data_source(cfg, types.SimpleNamespace(data_dir=None)) == (
      None, spec.train_samples(cfg))
