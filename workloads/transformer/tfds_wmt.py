"""WMT En-De through tensorflow-datasets (`data.source=tfds`), converted once into the
reference's files so that training and eval read them as they read data_download.py's output.

The reference trains on three WMT17 subsets (news-commentary v12, europarl v7, commoncrawl)
and translates newstest2014; the stock `wmt17_translate/de-en` config adds rapid_2016 and
evaluates on newstest2017, so this is tfds' documented custom WMT config (`WmtConfig` with
explicit subsets) over the same download code. Prepare it once where there is internet:

    builder = tfds_wmt.builder(cfg.data, data_dir); builder.download_and_prepare()

The first run then encodes every pair with the reference's vocabulary (`vocab.ende.32768` in
--data-dir, subwords.py; where there is none, tfds' SubwordTextEncoder learns subwords from
the training text, `learn_vocabulary`), each side ending in EOS, into `wmt32k-train-000NN-of-000MM`
TFRecords, and writes newstest2014 as `newstest2014.en` / `.de` lines, under
<data-dir>/transformer_tfds/<hash of the settings>, once (untimed, as the reference's
offline data_download.py).
"""
import os
import shutil

from workloads.common.host_tf import tf

from workloads.common import mini_cache
from workloads.transformer import subwords
from workloads.transformer.spec import tfds_config_name

FORMAT_VERSION = 1
SOURCE, TARGET = "en", "de"            # translation direction: English to German


def builder(data_cfg, data_dir):
  """The tfds builder of the run's WMT subsets (wmt_translate/de-en.<config_name>)."""
  import tensorflow_datasets as tfds
  from tensorflow_datasets.translate import wmt
  config = wmt.WmtConfig(
      name=tfds_config_name(data_cfg), language_pair=("de", "en"), version="1.0.0",
      description="WMT En-De as the MLPerf Transformer reference trains and evaluates it",
      subsets={tfds.Split.TRAIN: data_cfg.tfds_train_subsets.split(","),
               tfds.Split.TEST: [data_cfg.tfds_eval_subset]})
  return wmt.WmtTranslate(config=config, data_dir=data_dir)


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _example(source_ids, target_ids):
  ints = lambda ids: tf.train.Feature(int64_list=tf.train.Int64List(value=ids))
  return tf.train.Example(features=tf.train.Features(feature={
      "inputs": ints(source_ids), "targets": ints(target_ids)})).SerializeToString()


def learn_vocabulary(wmt, data_cfg) -> subwords.SubwordEncoder:
  """Subwords learned by tfds' SubwordTextEncoder from both sides of the training pairs (up to
  data.tfds_vocab_corpus_chars characters), as a reference-format vocabulary."""
  import tensorflow_datasets as tfds

  def corpus():
    for pair in wmt.as_dataset(split="train").as_numpy_iterator():
      yield _text(pair[SOURCE])
      yield _text(pair[TARGET])
  learned = tfds.deprecated.text.SubwordTextEncoder.build_from_corpus(
      corpus(), target_vocab_size=data_cfg.tfds_vocab_size,
      max_corpus_chars=data_cfg.tfds_vocab_corpus_chars)
  return subwords.from_learned_pieces(learned.subwords)


def prepare(data_cfg, data_dir) -> dict:
  """Writes the reference-format files once; -> {'dir', 'train_examples', 'vocab_size', ...}."""
  vocab_path = os.path.join(data_dir, data_cfg.vocab_file)
  given = os.path.exists(vocab_path)
  fields = {"train": data_cfg.tfds_train_subsets, "eval": data_cfg.tfds_eval_subset,
            "shards": data_cfg.tfds_train_shards, "version": FORMAT_VERSION,
            "vocab": (os.path.getsize(vocab_path) if given else
                      ["learned", data_cfg.tfds_vocab_size, data_cfg.tfds_vocab_corpus_chars])}

  def write(staging):
    wmt = builder(data_cfg, data_dir)
    if given:
      encoder = subwords.SubwordEncoder.from_file(vocab_path)
      shutil.copyfile(vocab_path, os.path.join(staging, data_cfg.vocab_file))
    else:
      encoder = learn_vocabulary(wmt, data_cfg)
      encoder.save(os.path.join(staging, data_cfg.vocab_file))
    shards = data_cfg.tfds_train_shards
    writers = [tf.io.TFRecordWriter(os.path.join(
        staging, f"wmt32k-train-{i + 1:05d}-of-{shards:05d}")) for i in range(shards)]
    count = 0
    for pair in wmt.as_dataset(split="train").as_numpy_iterator():
      source = encoder.encode(_text(pair[SOURCE])) + [subwords.EOS_ID]
      target = encoder.encode(_text(pair[TARGET])) + [subwords.EOS_ID]
      writers[count % shards].write(_example(source, target))
      count += 1
    for w in writers:
      w.close()
    lines = {SOURCE: [], TARGET: []}
    for pair in wmt.as_dataset(split="test").as_numpy_iterator():
      for lang in lines:                # one sentence a line, as the raw newstest files
        lines[lang].append(" ".join(_text(pair[lang]).splitlines()))
    for lang, name in ((SOURCE, data_cfg.eval_source), (TARGET, data_cfg.eval_reference)):
      with open(os.path.join(staging, name), "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines[lang])
    return {"train_examples": count, "eval_examples": len(lines[SOURCE]),
            "vocab_size": encoder.vocab_size, "vocab_learned": not given}

  folder, info = mini_cache.prepare(os.path.join(data_dir, "transformer_tfds"), fields, write)
  return {"dir": folder, **info}
