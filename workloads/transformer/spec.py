"""Transformer (big) on WMT En-De (MLPerf `transformer`, ruleset 0.7.0): configs and presets,
framework-neutral.

The reference (mlcommons/training, retired `transformer`, TensorFlow) trains the "big" model
(6+6 layers, hidden 1024, 16 heads, filter 4096) with Adam and an rsqrt schedule on the
tokenized WMT17 TFRecords its data_download.py writes, and after every epoch translates
newstest2014 with beam search (beam 4, alpha 0.6, up to input length + 50 tokens) and scores
uncased BLEU (compute_bleu.py) until it reaches 25.0. BLEU is logged as eval_accuracy / 100.

A batch is rows of `data.max_length` tokens (fixed shapes: one compiled step), and training
pairs longer than max_length are discarded (`max_sequence_length`, method discard). A row holds
one sentence pair and padding, or with `data.packing` as many pairs as fit (Google's v0.7 JAX
submission: 2,048 packed rows of 256 per step, `train_samples` 566,340 rows an epoch; padding
otherwise takes most of a WMT row). `global_batch_size`, `train_samples` and epochs count rows
(= sentence pairs when not packed); the log's global_batch_size says which in its metadata.
"""
import dataclasses
import os

from harness import cadence, rules
from harness.config import TrainConfig, as_synthetic, in_range, key_of, one_of, positive
from harness.config_root import workload_config
from harness.errors import UsageError
from harness.workload import Metric, WorkloadSpec, by_name, from_module
from workloads.common import mini_cache
from workloads.common.moe import MoEConfig, check_groups
from workloads.common.moe import capacity as moe_capacity, dispatch_bytes as moe_dispatch_bytes
from workloads.common.moe import figures as moe_figures
from workloads.optim import schedules
from workloads.optim.configs import AdamConfig
from workloads.transformer import mini_corpus

BLEU = Metric("bleu", "BLEU points", low=0.0, high=100.0, log_scale=0.01)


@dataclasses.dataclass
class ModelConfig:
  """model_params.py TransformerBigParams, with the decoding settings of the eval."""
  vocab_size: int = 33708             # vocab.ende.32768 holds 33,708 subtokens (pad 0, EOS 1)
  hidden_size: int = 1024
  num_layers: int = 6                 # in the encoder, and again in the decoder
  num_heads: int = 16
  filter_size: int = 4096
  dropout: float = 0.1                # layer_postprocess_dropout (residual and embedding)
  attention_dropout: float = 0.1
  relu_dropout: float = 0.1
  beam_size: int = 4
  alpha: float = 0.6                  # length penalty ((5 + length) / 6) ** alpha
  extra_decode_length: int = 50       # decode up to input length + this
  moe: MoEConfig = dataclasses.field(default_factory=MoEConfig)   # ST-MoE experts (open division)

  def validate(self):
    positive(self, "hidden_size", "num_layers", "num_heads", "filter_size", "beam_size")
    if self.hidden_size % self.num_heads or self.hidden_size % 2:
      raise UsageError(f"{key_of(self, 'hidden_size')}={self.hidden_size} is not allowed; "
                       f"allowed: an even multiple of {key_of(self, 'num_heads')}="
                       f"{self.num_heads}")
    if self.vocab_size != 0 and self.vocab_size < 3:
      raise UsageError(f"{key_of(self, 'vocab_size')}={self.vocab_size} is out of range; "
                       "allowed: >= 3 (pad 0, EOS 1 and a word), or 0 with data.source=mini "
                       "(the mini vocabulary's size)")
    for field in ("dropout", "attention_dropout", "relu_dropout"):
      in_range(self, field, 0.0, 0.9)
    in_range(self, "alpha", 0.0, None)
    in_range(self, "extra_decode_length", 1, None)


@dataclasses.dataclass
class DataConfig:
  """Where pairs come from. `tfrecord` reads what the reference's data_download.py writes into
  --data-dir: <data-dir>/wmt32k-train-000NN-of-00100 (tf.train.Example, int64 lists 'inputs'
  and 'targets', subtoken ids ending in EOS), the vocabulary vocab.ende.32768, and the raw
  newstest2014.en / newstest2014.de that the reference translates and scores."""
  source: str = "tfrecord"            # tfrecord | tfds (tfds_wmt.py) | mini (generated, written
                                      # the same way) | synthetic
  train_pattern: str = "*train*"      # the reference's dataset.py pattern
  vocab_file: str = "vocab.ende.32768"
  eval_source: str = "newstest2014.en"
  eval_reference: str = "newstest2014.de"
  max_length: int = 256               # training pairs longer than this are discarded
  packing: bool = False               # several pairs per row (common/packing.py); rows = samples
  eval_max_length: int = 256          # eval inputs are padded (or cut) to this many tokens
  train_examples: int = 0             # logged train_samples; 0: rules/ (pairs) or, packed,
                                      # the rows one pass over the training files packs into
  eval_examples: int = 3003           # newstest2014 sentences
  eval_batch_size: int = 64
  shuffle_buffer: int = 10_000
  tfds_train_subsets: str = "newscommentary_v12,europarl_v7,commoncrawl"   # the reference's
  tfds_eval_subset: str = "newstest2014"
  tfds_train_shards: int = 100        # TFRecord files the tfds pairs are written into
  tfds_vocab_size: int = 32768        # without vocab_file in --data-dir: tfds learns one this
  tfds_vocab_corpus_chars: int = 100_000_000   # size from this many characters of the pairs
  mini_seed: int = 4321               # the mini corpus is fixed; the run seed only shuffles it
  mini_train_pairs: int = 6000
  mini_words: int = 12                # words per word class in the mini grammar's lexicon

  def validate(self):
    one_of(self, "source", ("tfrecord", "tfds", "mini", "synthetic"))
    positive(self, "max_length", "eval_max_length", "eval_examples", "eval_batch_size",
             "shuffle_buffer", "mini_train_pairs", "mini_words", "tfds_train_shards",
             "tfds_vocab_size", "tfds_vocab_corpus_chars")
    in_range(self, "max_length", 2, None)
    in_range(self, "train_examples", 0, None)


@workload_config
class TransformerConfig:
  model: ModelConfig
  data: DataConfig
  optimizer: AdamConfig


def reference() -> TransformerConfig:
  """The reference's big model and recipe (run_training.sh --params=big): base lr 2.0, warmup
  16,000 steps, betas 0.9/0.997, target 25.0 BLEU from rules/, eval every epoch. The
  reference batches 4,096 tokens per GPU by length buckets (8 GPUs: ~32k tokens a step); here
  128 packed rows of 256 tokens (~29k tokens at ~90% fill), Google's v0.7 layout."""
  mlperf = rules.load("transformer")
  train = TrainConfig(global_batch_size=128, target=mlperf.target, precision="bfloat16",
                      max_epochs=30.0)
  cadence.apply_rules(train, mlperf.eval_cadence)
  return TransformerConfig(data=DataConfig(packing=True), train=train)


def synthetic() -> TransformerConfig:
  return as_synthetic(reference(), global_batch_size=16)


def mini() -> TransformerConfig:
  """A small Transformer (2+2 layers, hidden 64) on a generated parallel corpus (a seeded
  grammar translated word by word with reordering, input_pipeline.mini_corpus), written as the
  reference's TFRecords and newstest-style text, scored with the same beam search and BLEU.
  Packed as the reference preset (6,000 pairs in ~3,000 rows of 24: half the steps an epoch,
  time to target 21 s against 45 s with a pair a row)."""
  return TransformerConfig(
      model=ModelConfig(vocab_size=0, hidden_size=64, num_layers=2, num_heads=4,
                        filter_size=128, dropout=0.1, attention_dropout=0.1, relu_dropout=0.1,
                        extra_decode_length=8),
      data=DataConfig(source="mini", max_length=24, eval_max_length=24, eval_examples=200,
                      eval_batch_size=100, shuffle_buffer=6000, packing=True),
      optimizer=AdamConfig(base_learning_rate=1.0, warmup_steps=200, beta_2=0.98),
      train=TrainConfig(global_batch_size=64, target=85.0, precision="float32",
                        max_epochs=20.0, eval_every_epochs=1))


def moe_mini() -> TransformerConfig:
  """The mini Transformer with ST-MoE expert layers (open division: the MLPerf model is
  dense): 4 experts in the second layer of the encoder and of the decoder (every 2nd layer;
  ST-MoE's every 4th needs 4 layers), routed in groups of 96 tokens (4 packed rows)."""
  cfg = mini()
  cfg.model.moe = MoEConfig(num_experts=4, every=2, group_size=96)
  return cfg


def tiny() -> TransformerConfig:
  """The smallest config that runs every code path (the contract test's)."""
  cfg = mini()
  cfg.model = ModelConfig(vocab_size=0, hidden_size=16, num_layers=1, num_heads=2,
                          filter_size=32, extra_decode_length=4)
  cfg.data.mini_train_pairs, cfg.data.eval_examples, cfg.data.eval_batch_size = 256, 24, 16
  cfg.data.mini_words = 4
  cfg.train.global_batch_size, cfg.train.max_epochs = 32, 2.0
  return cfg


def derive(cfg: TransformerConfig):
  """model.vocab_size 0 (the mini presets') is the mini vocabulary's size, which follows from
  data.mini_seed and data.mini_words."""
  if cfg.model.vocab_size == 0:
    if cfg.data.source != "mini":
      raise UsageError(f"model.vocab_size=0 needs data.source=mini (got {cfg.data.source!r}); "
                       "allowed: the vocabulary's size (33708 for vocab.ende.32768)")
    cfg.model.vocab_size = mini_corpus.vocabulary(cfg.data.mini_seed,
                                                  cfg.data.mini_words).vocab_size


def batch_layout(cfg: TransformerConfig, batch_size: int, with_mask: bool = False) -> dict:
  """{name: (shape, dtype, logical axes)}. Train: 'inputs' and 'targets', subtoken ids ending
  in EOS, padded with 0; packed, also each one's '_segmentation' and '_position'
  (PACKED_FEATURES). Eval: 'inputs' (padded to eval_max_length), 'index' (the sentence's
  line in the eval files, for the host-side BLEU) and 'mask' (1 real, 0 padding)."""
  if with_mask:
    return {"inputs": ((batch_size, cfg.data.eval_max_length), "int32", ("batch", "length")),
            "index": ((batch_size,), "int32", ("batch",)),
            "mask": ((batch_size,), "float32", ("batch",))}
  tokens = ((batch_size, cfg.data.max_length), "int32", ("batch", "length"))
  names = ("inputs", "targets") + (PACKED_FEATURES if cfg.data.packing else ())
  return {name: tokens for name in names}


PACKED_FEATURES = ("inputs_segmentation", "inputs_position", "targets_segmentation",
                   "targets_position")


def packed_features(batch) -> dict | None:
  """The packing features of a train batch, or None when its rows are not packed."""
  return ({k: batch[k] for k in PACKED_FEATURES} if PACKED_FEATURES[0] in batch else None)


def pipeline_layers(cfg) -> list[tuple[str, str]]:
  """GPipe cuts the encoder layers then the decoder layers as one list (Lingvo's GPipe
  Transformer): one schedule, and a stage may hold the last encoder and first decoder layers.
  Two pipelines over the same axis (encoder's, then decoder's) would fill and drain twice a
  step, two bubbles; in one list the encoder's output rides along to every decoder layer.
  [(layer, regex of its parameter paths)]: the shared embedding is read by the first layer
  (source lookups) and the first decoder and last layers (target lookups, logits)."""
  n = cfg.model.num_layers
  layers = [(f"encoder/layer_{i}", [f"encoder/layer_{i}/.*"]) for i in range(n)]
  layers += [(f"decoder/layer_{i}", [f"decoder/layer_{i}/.*"]) for i in range(n)]
  layers[0][1].append("embedding_shared/.*")
  layers[n - 1][1].append("encoder/output_norm/.*")
  layers[n][1].append("embedding_shared/.*")
  layers[-1][1].extend(["decoder/output_norm/.*", "embedding_shared/.*"])
  return [(name, "|".join(dict.fromkeys(paths))) for name, paths in layers]


def sample_unit(cfg: TransformerConfig) -> str:
  return "packed rows" if cfg.data.packing else "sentence pairs"


# Every parameter's logical axes (flax paths; the Keras model uses the same names). Attention
# kernels keep heads as their own dimension ([embed, heads, kv] and [heads, kv, embed]), so a
# model axis can split heads without reshaping (Mesh-TF's layout).
PARAM_AXES = (
    (r".*ffn/router/kernel", ("embed", "routes")),
    (r".*ffn/experts/filter/kernel", ("experts", "embed", "mlp")),
    (r".*ffn/experts/filter/bias", ("experts", "mlp")),
    (r".*ffn/experts/output/kernel", ("experts", "mlp", "embed")),
    (r".*ffn/experts/output/bias", ("experts", "embed")),
    (r"embedding_shared/embedding", ("vocab", "embed")),
    (r".*(self_attention|encdec_attention)/(query|key|value)/kernel", ("embed", "heads", "kv")),
    (r".*(self_attention|encdec_attention)/output/kernel", ("heads", "kv", "embed")),
    (r".*ffn/filter/kernel", ("embed", "mlp")),
    (r".*ffn/filter/bias", ("mlp",)),
    (r".*ffn/output/kernel", ("mlp", "embed")),
    (r".*ffn/output/bias", ("embed",)),
    (r".*_norm/(scale|bias)", ("embed",)),
)


def check_framework(cfg: TransformerConfig, framework: str):
  """The expert layers' fit (before any framework loads): a mesh with an expert axis needs
  experts to split; experts do not run inside a GPipe pipeline; each batch shard's tokens
  are whole routing groups. (Which axes the expert axis combines with in each framework is
  harness.mesh.COMPOSITION's.)"""
  del framework                     # the protocol's argument: these hold in both frameworks
  moe, axes = cfg.model.moe, cfg.parallel.axes()
  if axes["expert"] > 1 and not moe.num_experts:
    raise UsageError(f"--mesh expert={axes['expert']}: model.moe.num_experts=0 (dense) has no "
                     "experts to split; allowed: --set model.moe.num_experts=E (E a multiple "
                     f"of {axes['expert']}) or no expert axis")
  if not moe.num_experts:
    return
  if axes["stage"] > 1 or cfg.parallel.microbatches > 1:
    raise UsageError("model.moe.num_experts with a GPipe pipeline (--mesh stage / "
                     "parallel.microbatches) is not supported; allowed: data, expert, model")
  if axes["data"]:
    check_groups(moe, cfg.train.global_batch_size, cfg.data.max_length,
                 axes["data"] * axes["expert"])


def describe_lines(cfg: TransformerConfig, parameters: int) -> list[tuple[str, str]]:
  """describe's MoE lines: the experts' parameters against the dense feed-forwards they
  replace, the parameters a token's compute uses (ST-MoE's '32B dense compute with 269B
  parameters', at this size), feed-forward FLOPs per token, and one step's all-to-all
  values (forward and backward dispatch and combine)."""
  moe, m = cfg.model.moe, cfg.model
  if not moe.num_experts:
    return []
  tokens = cfg.train.global_batch_size * cfg.data.max_length
  f = moe_figures(moe, m.hidden_size, m.filter_size, m.num_layers, 2, tokens)
  per_layer = f["expert_parameters"] // f["expert_layers"]
  ffn = f["dense_parameters_replaced"] // f["expert_layers"]
  router = m.hidden_size * moe.num_experts
  dense_compute = parameters - f["expert_parameters"] + f["expert_layers"] * (2 * ffn + router)
  value_bytes = 2 if cfg.train.precision == "bfloat16" else 4
  capacity = moe_capacity(moe.group_size, moe.num_experts, moe.capacity_factor_train,
                          moe.min_expert_capacity)
  return [
      ("experts", f"{moe.num_experts} in each of {f['expert_layers']} layers (one feed-forward "
                  f"in {moe.every} of encoder and decoder), top-2 (second: "
                  f"{moe.second_policy}), capacity {capacity} per {moe.group_size}-token group "
                  f"(factor {moe.capacity_factor_train:g}; eval {moe.capacity_factor_eval:g})"),
      ("expert parameters", f"{f['expert_parameters']:,} ({per_layer:,} a layer) in place of "
                            f"{f['dense_parameters_replaced']:,} dense"),
      ("compute per token", f"that of {dense_compute:,} parameters of the {parameters:,} "
                            "(two experts and the router per expert layer)"),
      ("FFN FLOPs per token", f"{f['ffn_flops_per_token_moe']:,} in an expert layer against "
                              f"{f['ffn_flops_per_token_dense']:,} dense (forward)"),
      ("all-to-all per step", _all_to_all_line(cfg, f["all_to_all_values_per_step"] * value_bytes))]


def all_to_all_bytes(cfg: TransformerConfig, chips: int):
  """(bytes a chip's dispatch all-to-all carries, what they are) with the batch over `chips`
  (simulate --collective all-to-all), or None for the dense model."""
  moe = cfg.model.moe
  if not moe.num_experts:
    return None
  check_groups(moe, cfg.train.global_batch_size, cfg.data.max_length, chips)
  value_bytes = 2 if cfg.train.precision == "bfloat16" else 4
  tokens = cfg.train.global_batch_size * cfg.data.max_length
  nbytes = moe_dispatch_bytes(moe, cfg.model.hidden_size, tokens, chips, value_bytes)
  return nbytes, (f"{tokens:,} tokens a step over {chips} chips in groups of {moe.group_size}, "
                  f"{moe.num_experts} experts x {moe_capacity(moe.group_size, moe.num_experts, moe.capacity_factor_train, moe.min_expert_capacity)} "
                  f"slots of {cfg.model.hidden_size} x {value_bytes} B: {nbytes / 1e6:.4g} MB per "
                  f"chip in each dispatch (and combine; x4 a layer with the backward)")


def _all_to_all_line(cfg, total_bytes):
  """The dispatch and combine, forward and backward, of all devices; with the mesh's data and
  expert sizes, one device's part (its groups' slots: what its all-to-alls carry, of which
  (expert - 1) / expert leave it)."""
  axes = cfg.parallel.axes()
  line = f"{total_bytes:,} bytes (dispatch and combine, forward and backward)"
  if axes["data"] and axes["expert"] > 1:
    line += f"; {total_bytes // (axes['data'] * axes['expert']):,} bytes a device"
  return line


def schedule_for(cfg: TransformerConfig) -> schedules.RsqrtSchedule:
  opt = cfg.optimizer
  return schedules.RsqrtSchedule(base_lr=opt.base_learning_rate,
                                 hidden_size=cfg.model.hidden_size,
                                 warmup_steps=opt.warmup_steps)


def train_samples(cfg: TransformerConfig) -> int:
  """Unpacked: data.train_examples, else the rules' sentence-pair count (packed rows are
  counted by input_pipeline.data_source)."""
  return cfg.data.train_examples or int(rules.load("transformer").eval_cadence["train_samples"])


def mllog_hyperparameters(cfg: TransformerConfig, train_examples: int) -> dict:
  """The keys closed_transformer.yaml (ruleset 0.7.0) requires exactly once; a value with
  metadata is a (value, {metadata}) pair."""
  del train_examples
  opt = cfg.optimizer
  return {"opt_name": opt.name,
          "opt_base_learning_rate": opt.base_learning_rate,
          "opt_learning_rate_warmup_steps": opt.warmup_steps,
          "opt_adam_beta_1": opt.beta_1,
          "opt_adam_beta_2": opt.beta_2,
          "opt_adam_epsilon": opt.epsilon,
          "max_sequence_length": (cfg.data.max_length, {"method": "discard"})}


TFDS_REFERENCE_SUBSETS = ("newscommentary_v12,europarl_v7,commoncrawl", "newstest2014")


def tfds_config_name(data_cfg) -> str:
  """tfds WMT config name: 'mlperf' for the reference's subsets, else keyed by the subsets."""
  chosen = (data_cfg.tfds_train_subsets, data_cfg.tfds_eval_subset)
  if chosen == TFDS_REFERENCE_SUBSETS:
    return "mlperf"
  return "subsets_" + mini_cache.key({"train": chosen[0], "eval": chosen[1]})[:8]


def missing_data(cfg, data_dir) -> list[str]:
  d = cfg.data
  if d.source == "tfds":       # the prepared tfds dataset (tfds_wmt.py; a missing vocabulary
    prepared = os.path.join("wmt_translate", f"de-en.{tfds_config_name(d)}", "1.0.0")
    return [] if os.path.exists(os.path.join(data_dir, prepared)) else [prepared]   # is learned)
  if d.source != "tfrecord":
    return []
  import glob
  missing = [] if glob.glob(os.path.join(data_dir, d.train_pattern)) else [d.train_pattern]
  return missing + [f for f in (d.vocab_file, d.eval_source, d.eval_reference)
                    if not os.path.exists(os.path.join(data_dir, f))]


SPEC = WorkloadSpec(
    name="transformer",
    title="Transformer (big) translation, WMT English-German",
    metric=BLEU,
    presets=by_name(mini, moe_mini, reference, synthetic, tiny),
    mesh_axes=("data", "model", "stage", "expert"),
    split_dims=lambda cfg: {"length": cfg.data.max_length, "heads": cfg.model.num_heads,
                            "mlp": cfg.model.filter_size, "vocab": cfg.model.vocab_size,
                            "experts": cfg.model.moe.num_experts},
    param_axes=PARAM_AXES,
    data_dir_contents=("the reference's data_download.py output: wmt32k-train-*, "
                       "vocab.ende.32768, newstest2014.en, newstest2014.de (or, with "
                       "data.source=tfds, vocab.ende.32768 and the prepared tfds WMT dataset)"),
    host_evaluator="host_bleu.BleuEvaluator",
    **from_module(globals()),
)
