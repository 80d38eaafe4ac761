"""data.source=tfds: WMT through tensorflow-datasets' WMT builder with the reference's three
WMT17 subsets and newstest2014 (tfds.testing.mock_data stands in for the prepared dataset:
random text through the real builder's features and splits), converted once into the
reference's files and read back by the same pipeline as data_download.py's output."""
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from harness.workload import RunContext
from workloads.transformer import input_pipeline, spec, subwords, tfds_wmt

WORDS = "the cat sat on a mat die Katze saß auf einer Matte".split()


@pytest.fixture
def tfds_cfg():
  cfg = spec.reference()
  cfg.data.source, cfg.data.tfds_train_shards, cfg.data.eval_examples = "tfds", 3, 5
  cfg.data.packing = False
  return cfg


def test_builder_has_the_reference_subsets_not_the_stock_config(tmp_path, tfds_cfg):
  wmt = tfds_wmt.builder(tfds_cfg.data, str(tmp_path))
  assert wmt.name == "wmt_translate" and wmt.builder_config.name == "de-en.mlperf"
  assert {str(k): v for k, v in wmt.subsets.items()} == {
      "train": ["newscommentary_v12", "europarl_v7", "commoncrawl"], "test": ["newstest2014"]}
  assert set(wmt.info.features.keys()) == {"de", "en"}
  from tensorflow_datasets.translate import wmt17
  stock = wmt17.Wmt17Translate(config="de-en", data_dir=str(tmp_path))
  assert "rapid_2016" in stock.subsets[tfds.Split.TRAIN]      # why the stock config is not used
  other = spec.reference().data
  other.tfds_train_subsets = "europarl_v7"
  assert spec.tfds_config_name(other).startswith("subsets_")


def _records(folder):
  pairs = []
  for path in sorted(tf.io.gfile.glob(os.path.join(folder, "wmt32k-train-*"))):
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
      ex = tf.train.Example.FromString(record).features.feature
      pairs.append((list(ex["inputs"].int64_list.value), list(ex["targets"].int64_list.value)))
  return pairs


def test_pairs_are_encoded_once_into_reference_files_and_read_by_the_pipeline(tmp_path,
                                                                             tfds_cfg):
  """Every train pair encoded with the reference vocabulary (English in, German out, each
  ending in EOS) into 3 TFRecord shards; newstest lines written as text; the second call
  reuses the folder; the pipeline's data_source, train and eval read it."""
  encoder = subwords.build_word_level(WORDS)
  encoder.save(str(tmp_path / "vocab.ende.32768"))
  tfds_cfg.model.vocab_size = encoder.vocab_size
  assert spec.missing_data(tfds_cfg, str(tmp_path)) == [
      os.path.join("wmt_translate", "de-en.mlperf", "1.0.0")]
  with tfds.testing.mock_data(num_examples=12):
    expected = list(tfds_wmt.builder(tfds_cfg.data, str(tmp_path)).as_dataset(
        split="train").as_numpy_iterator())
    evals = list(tfds_wmt.builder(tfds_cfg.data, str(tmp_path)).as_dataset(
        split="test").as_numpy_iterator())
    info = tfds_wmt.prepare(tfds_cfg.data, str(tmp_path))
    folder, train_samples = input_pipeline.data_source(
        tfds_cfg, RunContext(seed=0, preset="reference", data_dir=str(tmp_path)))
  assert folder == info["dir"] and train_samples == info["train_examples"] == 12
  text = lambda b: b.decode("utf-8")
  written = _records(folder)
  assert len(tf.io.gfile.glob(os.path.join(folder, "wmt32k-train-*-of-00003"))) == 3
  assert sorted(written) == sorted(
      (encoder.encode(text(p["en"])) + [subwords.EOS_ID],
       encoder.encode(text(p["de"])) + [subwords.EOS_ID]) for p in expected)
  for source, target in written:          # and they decode back to the tfds text
    assert encoder.decode(source[:-1]) in {text(p["en"]) for p in expected}
    assert encoder.decode(target[:-1]) in {text(p["de"]) for p in expected}
  lines = open(os.path.join(folder, "newstest2014.en"), encoding="utf-8").read().splitlines()
  assert lines == [" ".join(text(p["en"]).splitlines()) for p in evals]
  reference = input_pipeline.eval_text(tfds_cfg, folder)[1]
  assert reference == [" ".join(text(p["de"]).splitlines()) for p in evals][:5]
  # written once: a second prepare (no tfds data now) returns the same folder untouched
  stamp = os.path.getmtime(os.path.join(folder, "info.json"))
  assert tfds_wmt.prepare(tfds_cfg.data, str(tmp_path))["dir"] == folder
  assert os.path.getmtime(os.path.join(folder, "info.json")) == stamp
  # the training pipeline reads the shards: 12 pairs a pass, padded rows
  batch = next(input_pipeline.train_dataset(tfds_cfg, 4, 0, folder).as_numpy_iterator())
  assert batch["inputs"].shape == (4, tfds_cfg.data.max_length)
  assert all(row[np.flatnonzero(row)[-1]] == subwords.EOS_ID for row in batch["targets"])


def test_without_a_vocabulary_tfds_learns_one_that_the_reference_tokenizer_uses(tmp_path,
                                                                               tfds_cfg):
  """No vocab.ende.32768 in --data-dir: tfds' SubwordTextEncoder learns subwords from the
  training text, written in the reference's format; every text round-trips through it, the
  learned pieces shorten the encoding, and a model.vocab_size that differs is refused naming
  the learned size."""
  tfds_cfg.data.tfds_vocab_size = 300
  ctx = RunContext(seed=0, preset="reference", data_dir=str(tmp_path))
  with tfds.testing.mock_data(num_examples=40):
    texts = [p[lang].decode("utf-8") for p in tfds_wmt.builder(
        tfds_cfg.data, str(tmp_path)).as_dataset(split="train").as_numpy_iterator()
             for lang in ("en", "de")]
    info = tfds_wmt.prepare(tfds_cfg.data, str(tmp_path))
    with pytest.raises(ValueError, match=f"allowed: {info['vocab_size']}$"):
      input_pipeline.data_source(tfds_cfg, ctx)
  assert info["vocab_learned"]
  encoder = subwords.SubwordEncoder.from_file(os.path.join(info["dir"], "vocab.ende.32768"))
  assert encoder.vocab_size == info["vocab_size"] > 100
  for text in texts:
    assert encoder.decode(encoder.encode(text)) == text
  characters_only = subwords.from_learned_pieces([])   # the same alphabet, no pieces
  ids = sum(len(encoder.encode(t)) for t in texts)
  baseline = sum(len(characters_only.encode(t)) for t in texts)
  assert ids < 0.8 * baseline                            # learned pieces in use


def test_learned_pieces_keep_their_word_ends_and_escape_underscores():
  """tfds' '_' ends a word's last piece as the reference's does; its '\\&undsc' is a literal
  '_' (the reference escapes it as '\\u')."""
  encoder = subwords.from_learned_pieces(["the_", "ca", "t_", "\\&undsc", "a\\&undscb_", "ing"])
  ids = {s: i for i, s in enumerate(encoder.subtokens)}
  assert encoder.subtokens[:2] == subwords.RESERVED
  assert [encoder.subtokens[i] for i in range(2, 8)] == ["the_", "ca", "t_", "\\u", "a\\ub_",
                                                         "ing"]
  assert encoder.encode("the cat") == [ids["the_"], ids["ca"], ids["t_"]]
  assert encoder.encode("_") == [ids["\\u"], ids["_"]]   # "_" is a token of its own
  assert encoder.decode(encoder.encode("singing a_b the")) == "singing a_b the"
  assert all(c in ids for c in "abcdefghijklmnopqrstuvwxyz\\_u;0123456789 ")
