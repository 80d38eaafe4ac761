"""Llama 3.1 8B pre-training on C4 (MLPerf Training 5.1 `llama31_8b`): configs and presets,
framework-neutral.

The MLPerf task (mlcommons/training small_language_model_pretraining, NeMo/Megatron) trains
Llama 3.1 8B from random weights on the reference's tokenized C4 (Megatron indexed-dataset
files, sequences of 8,192 tokens) with AdamW, and evaluates the log-perplexity (the mean token
cross-entropy) of 1,024 fixed validation sequences every 12,288 training samples until it is at
most 3.3 (rules/llama31_8b.yaml).
"""
import dataclasses
import glob
import math
import os

from harness import rules
from harness.config import TrainConfig, as_synthetic, in_range, key_of, one_of, positive
from harness.config_root import workload_config
from harness.errors import UsageError
from harness.workload import Metric, WorkloadSpec, by_name, from_module
from workloads.optim import schedules
from workloads.optim.configs import AdamWConfig


@dataclasses.dataclass
class ModelConfig:
  """Llama 3.1 8B (the reference's Llama31Config8B, as the Llama 3 paper's table 3 and the
  HuggingFace config.json of meta-llama/Llama-3.1-8B): pre-RMSNorm decoder, grouped-query
  attention, SwiGLU feed-forward, RoPE with Llama 3.1's frequency scaling, no biases, an output
  layer not tied to the embedding."""
  vocab_size: int = 128_256
  hidden_size: int = 4096
  num_layers: int = 32
  num_heads: int = 32                 # query heads
  num_kv_heads: int = 8               # key/value heads (GQA: 4 query heads share one)
  intermediate_size: int = 14_336     # SwiGLU's hidden width
  rms_norm_epsilon: float = 1e-5
  rope_theta: float = 500_000.0
  # Llama 3.1's RoPE frequency scaling (HF rope_scaling {"rope_type": "llama3", ...}):
  # wavelengths above original_max_position / low_freq_factor divided by `factor`, below
  # original_max_position / high_freq_factor kept, smoothly blended between.
  rope_scaling_factor: float = 8.0    # 1.0: plain RoPE
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_position: int = 8192
  # Megatron's init (NeMo's Llama: init_method_std 0.02): normal(0, 0.02) for every weight
  # matrix and the embedding; the attention output and the FFN's down projection scaled by
  # 1 / sqrt(2 x num_layers) (scaled_init_method_normal); RMSNorm scales at 1.
  initializer_range: float = 0.02

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  def validate(self):
    positive(self, "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
             "intermediate_size", "rms_norm_epsilon", "rope_theta", "rope_scaling_factor",
             "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_position",
             "initializer_range")
    if self.hidden_size % self.num_heads:
      raise UsageError(f"{key_of(self, 'hidden_size')}={self.hidden_size} is not divisible by "
                       f"{key_of(self, 'num_heads')}={self.num_heads}; allowed: a multiple of "
                       "num_heads")
    if self.num_heads % self.num_kv_heads:
      raise UsageError(f"{key_of(self, 'num_kv_heads')}={self.num_kv_heads} does not divide "
                       f"{key_of(self, 'num_heads')}={self.num_heads}; allowed: a divisor of "
                       "num_heads (grouped-query attention)")
    if self.rope_high_freq_factor <= self.rope_low_freq_factor:
      raise UsageError(f"{key_of(self, 'rope_high_freq_factor')}={self.rope_high_freq_factor} is "
                       f"not above {key_of(self, 'rope_low_freq_factor')}="
                       f"{self.rope_low_freq_factor}; allowed: high > low")


@dataclasses.dataclass
class DataConfig:
  """Where sequences come from. `indexed` reads the reference's preprocessed C4 as it is: the
  Megatron indexed-dataset pairs <prefix>.bin / <prefix>.idx under --data-dir, in Megatron
  GPTDataset's order (gpt_sampler.py). The reference (mlcommons/training
  small_llm_pretraining/nemo pretrain_llama31.py get_data; NeMo v2.1.0, megatron-core
  core_r0.11.0) trains on c4-train.en_6_text_document alone (C4 files 768-895; its
  --use_full_dataset blends en_0..en_7 at 12.5 each): one prefix is one GPTDataset, its weight
  unused; several are blended as Megatron's BlendedDataset (weights `train_weights`). The
  order is the run seed's (the reference sets the data seed to each run's seed) and depends on
  the samples the index is built for (`index_samples`). Eval: `eval_prefix`, its first
  eval_examples sequences of max_seq_length + 1 tokens in file order, not shuffled (README
  "Test data order"; the reference code's validation GPTDataset is shuffled by its seed: see
  gpt_sampler.py). `mini` generates a small corpus in the same file format (mini_corpus.py)."""
  source: str = "indexed"             # indexed | mini (generated, written as .bin/.idx) | synthetic
  max_seq_length: int = 8192          # tokens a sample (the reference's seq_length)
  train_prefixes: str = "c4-train.en_6_text_document"
  train_weights: str = ""             # comma-separated, one a prefix; empty: equal weights
  eval_prefix: str = "c4-validation-91205-samples.en_text_document"
  eval_examples: int = 1024           # closed_llama31_8b.yaml: eval_samples == 1024
  eval_batch_size: int = 16
  seed: int = 1234                    # the reference's default data seed; runs use their own
  train_examples: int = 0             # logged as train_samples; 0: the run's sample budget
  # Samples the train GPTDataset is built for: its epochs and so its order. 0: the reference's,
  # max_steps 1,200,000 (fixed by the closed rules) x the global batch; mini: train.max_samples.
  index_samples: int = 0
  # The mini corpus (mini_corpus.py): documents of `mini_topics` topics, each a sparse Markov
  # chain over the words, ended by an EOD token; geometric lengths of mean
  # mini_mean_document_length. Default: best eval log-perplexity 0.68 (bigram-only 1.55,
  # unigram 4.64) at 64 tokens a sample.
  mini_seed: int = 1234               # the mini corpus is fixed; the run seed only shuffles it
  mini_vocab_size: int = 128
  mini_topics: int = 4
  mini_mean_document_length: int = 200
  mini_documents: int = 4000
  mini_eval_documents: int = 400

  def validate(self):
    one_of(self, "source", ("indexed", "mini", "synthetic"))
    positive(self, "max_seq_length", "eval_examples", "eval_batch_size", "mini_vocab_size",
             "mini_topics", "mini_mean_document_length", "mini_documents",
             "mini_eval_documents")
    in_range(self, "train_examples", 0, None)
    in_range(self, "index_samples", 0, None)
    prefixes = [p for p in self.train_prefixes.split(",") if p.strip()]
    if not prefixes:
      raise UsageError(f"{key_of(self, 'train_prefixes')}={self.train_prefixes!r} names no "
                       "dataset; allowed: comma-separated indexed-dataset prefixes")
    weights = [w for w in self.train_weights.split(",") if w.strip()]
    if weights and len(weights) != len(prefixes):
      raise UsageError(f"{key_of(self, 'train_weights')}={self.train_weights!r} has "
                       f"{len(weights)} weights for {len(prefixes)} prefixes; allowed: one "
                       "positive number a prefix, or empty (equal)")
    try:
      bad = [w for w in weights if float(w) <= 0]
    except ValueError:
      bad = weights
    if bad:
      raise UsageError(f"{key_of(self, 'train_weights')}={self.train_weights!r}; allowed: "
                       "comma-separated positive numbers")
    if self.mini_vocab_size < 5:
      raise UsageError(f"{key_of(self, 'mini_vocab_size')}={self.mini_vocab_size}; allowed: "
                       "at least 5 (EOD and a word's 3 distinct successors)")


@workload_config
class LlamaConfig:
  model: ModelConfig
  data: DataConfig
  optimizer: AdamWConfig


EVAL_EVERY_SAMPLES = 12_288           # rules/llama31_8b.yaml (the reference's EVAL_EVERY)
REFERENCE_BATCH = 16                  # the smallest RCP point


def rcp_points() -> dict:
  """{global batch: (opt_base_learning_rate, opt_learning_rate_warmup_samples, mean samples to
  converge)} from the pinned mlperf_logging's RCP file: the hyperparameters a closed run at that
  batch is checked against, read where the RCP checker reads them."""
  import importlib.resources
  import json
  import statistics
  ruleset = rules.load(SPEC_NAME).ruleset
  path = (importlib.resources.files("mlperf_logging") / "rcp_checker" / f"training_{ruleset}"
          / f"rcps_{SPEC_NAME}.json")
  points = {}
  for record in json.loads(path.read_text()).values():
    hyper = record["Hyperparams"]
    points[record["BS"]] = (hyper["opt_base_learning_rate"],
                            hyper["opt_learning_rate_warmup_samples"],
                            statistics.mean(record["Epochs to converge"]))
  return points


def reference() -> LlamaConfig:
  """The RCP point at global batch 16 (rules/llama31_8b.yaml): lr 4e-4 after 256 warmup
  samples, cosine to 0.1 x lr over 1,200,000 steps, target log-perplexity 3.3, evals every
  12,288 samples. The learning rate and warmup left 0 are the RCP's at the run's batch
  (`derive`), so `--set train.global_batch_size=32` runs the 32 point. Budget: 1.5 x the RCP
  mean at 16 (161,587 samples), rounded up to whole evals."""
  mlperf = rules.load(SPEC_NAME)
  return LlamaConfig(
      optimizer=AdamWConfig(base_learning_rate=0.0, warmup_samples=0),
      train=TrainConfig(global_batch_size=REFERENCE_BATCH, target=mlperf.target,
                        precision="bfloat16", eval_every_samples=EVAL_EVERY_SAMPLES,
                        max_samples=20 * EVAL_EVERY_SAMPLES))


def derive(cfg: LlamaConfig):
  """The RCP's learning rate and warmup (in samples) at the run's global batch where the
  config leaves them 0; a batch without an RCP then needs both set."""
  opt, gbs = cfg.optimizer, cfg.train.global_batch_size
  if opt.base_learning_rate and opt.warmup_samples:
    return
  points = rcp_points()
  if gbs not in points:
    raise UsageError(f"train.global_batch_size={gbs} has no RCP for {SPEC_NAME} (batches "
                     f"{', '.join(map(str, sorted(points)))}); allowed: one of those, or set "
                     "optimizer.base_learning_rate and optimizer.warmup_samples")
  lr, warmup, _ = points[gbs]
  opt.base_learning_rate = opt.base_learning_rate or lr
  opt.warmup_samples = opt.warmup_samples or warmup


def synthetic() -> LlamaConfig:
  cfg = as_synthetic(reference(), global_batch_size=1)
  cfg.optimizer = AdamWConfig()           # no RCP at batch 1: the batch-16 point's values
  return cfg


def mini() -> LlamaConfig:
  """Llama scaled down (2 layers, hidden 64, 4 query and 2 key/value heads, SwiGLU 128, RoPE
  with the 3.1 scaling over a 64-token original context) on a generated corpus written as
  Megatron .bin/.idx files (input_pipeline.py), sequences of 64 tokens; the eval set is 1,024
  sequences as the rules say. The open division's checker wants a log-perplexity below 1.0."""
  return LlamaConfig(
      model=ModelConfig(vocab_size=128, hidden_size=64, num_layers=2, num_heads=4,
                        num_kv_heads=2, intermediate_size=128, rope_theta=10_000.0,
                        rope_original_max_position=64),
      data=DataConfig(source="mini", max_seq_length=64, eval_batch_size=256),
      optimizer=AdamWConfig(base_learning_rate=3e-3, warmup_samples=32 * 20),
      train=TrainConfig(global_batch_size=32, target=0.95, precision="float32",
                        eval_every_samples=32 * 50, max_samples=32 * 1500))


def tiny() -> LlamaConfig:
  """The smallest config that runs every code path (the contract test's)."""
  cfg = mini()
  cfg.model = ModelConfig(vocab_size=128, hidden_size=16, num_layers=2, num_heads=2,
                          num_kv_heads=1, intermediate_size=32, rope_theta=10_000.0,
                          rope_original_max_position=16)
  cfg.data = DataConfig(source="mini", max_seq_length=16, eval_batch_size=256,
                        mini_documents=200, mini_eval_documents=100)
  cfg.train.global_batch_size = 16
  cfg.train.eval_every_samples, cfg.train.max_samples = 160, 320
  return cfg


def batch_layout(cfg: LlamaConfig, batch_size: int, with_mask: bool = False) -> dict:
  """{name: (shape, dtype, logical axes)}: a sample's 8,192 input tokens and the next token of
  each (Megatron's GPTDataset: tokens = sample[:-1], labels = sample[1:]); eval batches add
  'mask' (1 real, 0 padding)."""
  tokens = ((batch_size, cfg.data.max_seq_length), "int32", ("batch", "length"))
  layout = {"tokens": tokens, "labels": tokens}
  if with_mask:
    layout["mask"] = ((batch_size,), "float32", ("batch",))
  return layout


# Every parameter's logical axes (flax paths; the Keras model uses the same names). Query,
# key and value kernels are [embed, heads x head_dim]: the joined dimension is 'heads' (a model
# axis splits query and key/value heads alike, which keeps each query head's key/value head in
# its shard: Megatron's GQA split).
PARAM_AXES = (
    (r"embed_tokens/embedding", ("vocab", "embed")),
    (r"(layer_\d+/(input_norm|post_attention_norm)|final_norm)/scale", ("embed",)),
    (r"layer_\d+/(q_proj|k_proj|v_proj)/kernel", ("embed", "heads")),
    (r"layer_\d+/o_proj/kernel", ("heads", "embed")),
    (r"layer_\d+/(gate_proj|up_proj)/kernel", ("embed", "mlp")),
    (r"layer_\d+/down_proj/kernel", ("mlp", "embed")),
    (r"lm_head/kernel", ("embed", "vocab")),
)


def split_dims(cfg: LlamaConfig) -> dict:
  """The sizes a mesh axis may split: the key/value heads bound the model axis (the query
  heads are a multiple of them), and so does the sequence under parallel.sequence_parallel."""
  return {"length": cfg.data.max_seq_length, "heads": cfg.model.num_kv_heads,
          "mlp": cfg.model.intermediate_size, "vocab": cfg.model.vocab_size,
          "residual_length": cfg.data.max_seq_length}


def pipeline_layers(cfg: LlamaConfig) -> list[tuple[str, str]]:
  """GPipe cuts Llama between decoder layers: the embedding goes with the first, the final
  norm and the output layer with the last (untied: each stage owns its own)."""
  n = cfg.model.num_layers
  layers = [(f"layer_{i}", [f"layer_{i}/.*"]) for i in range(n)]
  layers[0][1].append("embed_tokens/.*")
  layers[-1][1].append("final_norm/.*|lm_head/.*")
  return [(name, "|".join(paths)) for name, paths in layers]


def schedule_for(cfg: LlamaConfig) -> schedules.WarmupCosineSchedule:
  opt = cfg.optimizer
  return schedules.WarmupCosineSchedule(
      base_lr=opt.base_learning_rate, min_lr=opt.base_learning_rate * opt.end_learning_rate_ratio,
      warmup_steps=opt.warmup_steps(cfg.train.global_batch_size), max_steps=opt.max_steps)


def train_samples(cfg: LlamaConfig) -> int:
  """What the log's train_samples says: the corpus's samples when known, else the budget."""
  return cfg.data.train_examples or cfg.train.max_samples


def mllog_hyperparameters(cfg: LlamaConfig, train_examples: int) -> dict:
  """The keys closed_llama31_8b.yaml (ruleset 5.1.0) requires exactly once, and the RCPs'
  warmup in samples."""
  opt, gbs = cfg.optimizer, cfg.train.global_batch_size
  warmup = opt.warmup_steps(gbs)
  return {"max_sequence_length": cfg.data.max_seq_length,
          "opt_name": "adamw",
          "opt_base_learning_rate": opt.base_learning_rate,
          "opt_end_learning_rate": opt.base_learning_rate * opt.end_learning_rate_ratio,
          "opt_learning_rate_warmup_steps": warmup,
          "opt_learning_rate_warmup_samples": opt.warmup_samples,
          "opt_learning_rate_decay_steps": opt.max_steps - warmup,
          "opt_learning_rate_decay_schedule": "cosine with linear warmup",
          "opt_adamw_beta_1": opt.beta_1,
          "opt_adamw_beta_2": opt.beta_2,
          "opt_adamw_epsilon": opt.epsilon,
          "opt_adamw_weight_decay": opt.weight_decay,
          "opt_gradient_clip_norm": opt.clip_norm,
          "max_steps": opt.max_steps,
          "eval_interval_samples": cfg.train.eval_every_samples}


def missing_data(cfg, data_dir) -> list[str]:
  """What a reference run reads: each prefix's .bin and .idx."""
  if cfg.data.source != "indexed":
    return []
  prefixes = [p.strip() for p in cfg.data.train_prefixes.split(",") if p.strip()]
  return [prefix + ext for prefix in prefixes + [cfg.data.eval_prefix] for ext in (".bin", ".idx")
          if not os.path.exists(os.path.join(data_dir, prefix + ext))]


def check_framework(cfg, framework):
  """Llama's GPipe pipeline is JAX's (the TF pipeline places the Transformer's and ResNet's
  layers)."""
  stages, micro = cfg.parallel.axes()["stage"], cfg.parallel.microbatches
  if framework == "tf" and (stages > 1 or micro > 1):
    raise UsageError(f"--mesh stage={stages} / parallel.microbatches={micro} for Llama in TF: "
                     "its pipeline runs in JAX only; allowed: --framework jax, or stage=1 and "
                     "microbatches=1")


SPEC_NAME = "llama31_8b"

SPEC = WorkloadSpec(
    name=SPEC_NAME,
    title="Llama 3.1 8B pre-training (causal LM) on C4",
    metric=Metric("log_perplexity", "nats a token", low=0.0, high=20.0, higher_is_better=False,
                  counts="tokens"),
    presets=by_name(mini, reference, synthetic, tiny),
    mesh_axes=("data", "stage", "model"),
    param_axes=PARAM_AXES,
    data_dir_contents=("a folder with the MLPerf Llama 3.1 C4 files (<prefix>.bin and "
                       "<prefix>.idx for data.train_prefixes and data.eval_prefix)"),
    **from_module(globals()),
)
