"""tf.data input for Llama 3.1 8B pre-training, shared by the JAX and TF trainers.

Reads the reference's files as they are: Megatron indexed datasets (<prefix>.bin/.idx,
indexed_dataset.py, memory-mapped) under --data-dir, in Megatron GPTDataset's sample order
(gpt_sampler.py). A batch is {"tokens": int32 [B, L], "labels": int32 [B, L]}: each sample's
L + 1 tokens split as GPTDataset.__getitem__ does (tokens = sample[:-1], labels = sample[1:]);
one causal sequence a row, positions 0..L-1, every label counted (the reference's
reset_position_ids, reset_attention_mask and eod_mask_loss are False). Eval batches add 'mask'
float32 [B] (1 real, 0 padding).

Train: the global stream is the GPTDataset (or the BlendedDataset of several prefixes) built
for data.index_samples samples (0: the reference's 1,200,000 steps x the global batch, NeMo's
num_train_samples) ordered by the run's seed (the reference sets its data seed to each run's
seed); global batch b is stream samples [b x B, (b + 1) x B) and each host takes its
contiguous rows of it, so the order never depends on the host count. Past the built samples
the stream starts over.

Eval: the eval prefix's first data.eval_examples sequences in file order, not shuffled
(README "Test data order"), split over hosts and padded to whole batches.

Mini: mini_corpus.py's generated corpus written with the same writer and read by the same
reader (cached like every mini set, workloads/common/mini_cache.py).
"""
import dataclasses
import functools
import os

import numpy as np

from workloads.common import mini_cache
from workloads.common.batching import host_batch_size, padded_eval
from workloads.common.host_tf import tf
from workloads.llama31_8b import gpt_sampler, indexed_dataset, mini_corpus, spec

REFERENCE_MAX_STEPS = 1_200_000     # closed_llama31_8b.yaml max_steps; NeMo builds max_steps x B


# ----------------------------------------------------------------------------- sample sources

def train_prefixes(cfg):
  if cfg.data.source == "mini":
    return [mini_corpus.TRAIN_PREFIX]
  return [p.strip() for p in cfg.data.train_prefixes.split(",") if p.strip()]


def eval_prefix(cfg):
  return mini_corpus.EVAL_PREFIX if cfg.data.source == "mini" else cfg.data.eval_prefix


def train_weights(cfg, count):
  """The blend's weights (data.train_weights, comma-separated; empty: equal, the reference's
  12.5 each over en_0..en_7 with --use_full_dataset)."""
  text = getattr(cfg.data, "train_weights", "") or ""
  weights = [float(w) for w in text.split(",") if w.strip()]
  if not weights:
    return [1.0] * count
  if len(weights) != count:
    raise ValueError(f"data.train_weights has {len(weights)} weights for {count} prefixes")
  return weights


def index_samples(cfg, global_batch_size):
  """The samples the train GPTDataset is built for (its epochs, hence its order)."""
  n = getattr(cfg.data, "index_samples", 0)
  if n:
    return n
  if cfg.data.source == "mini":
    return max(cfg.train.max_samples, global_batch_size)
  return REFERENCE_MAX_STEPS * global_batch_size


def index_cache_root():
  """Where built sample orders are kept (Megatron's path_to_cache): the reference's hold
  gigabytes for the real shards, built once a (shard, seed, global batch)."""
  return os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                      "mlperf-tf-jax", "llama31_8b_index")


@functools.lru_cache(maxsize=8)
def _open(path):
  return indexed_dataset.IndexedDataset(path)


def open_prefix(data_dir, prefix):
  path = os.path.join(data_dir, prefix)
  missing = [p for p in indexed_dataset.paths(path) if not os.path.exists(p)]
  if missing:
    raise FileNotFoundError(f"no Megatron indexed dataset at {path} (missing "
                            f"{', '.join(missing)})")
  return _open(os.path.abspath(path))


def train_stream(cfg, global_batch_size, seed, data_dir, cache_dir=None):
  """The global training stream (gpt_sampler.BlendedSamples)."""
  prefixes = train_prefixes(cfg)
  datasets = [open_prefix(data_dir, p) for p in prefixes]
  return gpt_sampler.BlendedSamples(
      datasets, train_weights(cfg, len(prefixes)), index_samples(cfg, global_batch_size),
      cfg.data.max_seq_length, seed,
      cache_dir=cache_dir if cache_dir is not None else _cache_for(cfg))


def _cache_for(cfg):
  return None if cfg.data.source == "mini" else index_cache_root()   # mini: milliseconds


def eval_samples(cfg, data_dir):
  """The eval prefix's samples in file order (gpt_sampler.GPTSamples, shuffle=False)."""
  ds = open_prefix(data_dir, eval_prefix(cfg))
  samples = gpt_sampler.GPTSamples(ds, cfg.data.max_seq_length, shuffle=False)
  if len(samples) < cfg.data.eval_examples:
    raise ValueError(f"{ds.prefix} holds {len(samples)} sequences of "
                     f"{cfg.data.max_seq_length} + 1 tokens < data.eval_examples="
                     f"{cfg.data.eval_examples}")
  return samples


def host_rows(stream, global_batch_size, process_index, process_count):
  """step -> this host's rows [B / hosts, L + 1] of global batch `step`."""
  host = host_batch_size(global_batch_size, process_count)
  size = len(stream)

  def rows(step):
    first = int(step) * global_batch_size + process_index * host
    return np.stack([stream.sample((first + r) % size) for r in range(host)])
  return rows


def _split(rows):
  return {"tokens": rows[..., :-1], "labels": rows[..., 1:]}


# ----------------------------------------------------------------------------- entry points

def train_dataset(cfg, global_batch_size, seed, data_dir, process_index=0, process_count=1):
  """This host's batches, repeated: step b's rows read by a numpy function over the memory
  maps, several steps in flight (AUTOTUNE), in order."""
  stream = train_stream(cfg, global_batch_size, seed, data_dir)
  rows = host_rows(stream, global_batch_size, process_index, process_count)
  shape = [host_batch_size(global_batch_size, process_count), cfg.data.max_seq_length + 1]

  def read(step):
    out = tf.numpy_function(lambda s: rows(s).astype(np.int32), [step], tf.int32,
                            stateful=False)
    out.set_shape(shape)
    return _split(out)

  ds = tf.data.Dataset.counter()
  ds = ds.map(read, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return ds.prefetch(tf.data.AUTOTUNE)


def eval_dataset(cfg, global_batch_size, data_dir, process_index=0, process_count=1):
  """This host's share of the first eval_examples sequences (every process_count-th), in
  batches of global / process_count padded with mask=0 rows; every host yields as many
  batches."""
  samples = eval_samples(cfg, data_dir)
  n, length = cfg.data.eval_examples, cfg.data.max_seq_length

  def read(i):
    out = tf.numpy_function(lambda j: samples.sample(int(j)), [i], tf.int32, stateful=False)
    out.set_shape([length + 1])
    return _split(out)

  ds = tf.data.Dataset.range(n).shard(process_count, process_index)
  ds = ds.map(read, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return padded_eval(ds, n, global_batch_size, process_count).cache().prefetch(
      tf.data.AUTOTUNE)


def synthetic_batch(cfg, batch_size, seed):
  """One random batch of the real shapes (numpy): uniform tokens, labels the next token."""
  rng = np.random.default_rng(seed)
  rows = rng.integers(0, cfg.model.vocab_size, (batch_size, cfg.data.max_seq_length + 1),
                      dtype=np.int32)
  return _split(rows)


# ----------------------------------------------------------------------------- mini corpus

def mini_fields(data_cfg) -> dict:
  """What the mini corpus depends on (its cache key): the mini_* fields, not the sequence
  length (samples are cut when read)."""
  fields = {k: v for k, v in dataclasses.asdict(data_cfg).items() if k.startswith("mini_")}
  fields.update(version=mini_corpus.MINI_FORMAT_VERSION, successors=mini_corpus.SUCCESSORS,
                probs=list(mini_corpus.SUCCESSOR_PROBS))
  return fields


def mini_chains(data_cfg):
  return mini_corpus.Chains(data_cfg.mini_vocab_size, data_cfg.mini_topics,
                            data_cfg.mini_mean_document_length, data_cfg.mini_seed)


def prepare_mini(data_cfg, cache_root=None) -> dict:
  """Writes the mini corpus (mini_corpus.TRAIN_PREFIX / EVAL_PREFIX .bin/.idx) under
  cache_root/<hash of the mini config>, once; returns {'dir', 'train_tokens',
  'eval_tokens'}."""
  def write(staging):
    _, counts = mini_corpus.write_corpus(
        staging, data_cfg.mini_vocab_size, data_cfg.mini_topics,
        data_cfg.mini_mean_document_length, data_cfg.mini_documents,
        data_cfg.mini_eval_documents, data_cfg.mini_seed)
    return counts
  folder, info = mini_cache.prepare(cache_root or mini_cache.default_root(spec.SPEC_NAME),
                                    mini_fields(data_cfg), write)
  return {"dir": folder, **info}


def mini_entropies(cfg, data_dir) -> dict:
  """The mini eval set's best achievable log-perplexity ('true'), the best from the previous
  token alone ('bigram'), the unigram predictor's ('unigram') and the unigram entropy, nats a
  token, on the exact eval samples a run scores (mini_corpus.entropies)."""
  samples = eval_samples(cfg, data_dir)
  windows = np.stack([samples.sample(i) for i in range(cfg.data.eval_examples)])
  return mini_corpus.entropies(mini_chains(cfg.data), windows)


# ----------------------------------------------------------------------------- per run

def data_source(cfg, ctx):
  """(the folder of .bin/.idx files, train_samples to log). Mini: generates its files once
  (untimed preparation, as the reference's offline tokenization) under --data-dir or ~/.cache;
  the run reads them only after run_start. Its train samples: one epoch's at the run's
  sequence length."""
  if cfg.data.source == "mini":
    root = os.path.join(ctx.data_dir, f"{spec.SPEC_NAME}_mini") if ctx.data_dir else None
    info = prepare_mini(cfg.data, root)
    epoch = (info["train_tokens"] - 1) // cfg.data.max_seq_length
    return info["dir"], cfg.data.train_examples or epoch
  return ctx.data_dir, spec.train_samples(cfg)
