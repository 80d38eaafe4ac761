"""BERT-large pre-training, masked-LM phase (MLPerf `bert`): configs and presets,
framework-neutral.

The MLPerf task starts from the reference's TF1 checkpoint (model.ckpt-28252) and trains with
LAMB on the Wikipedia TFRecords until masked-LM accuracy on the 10,000-example eval set
reaches 0.720. BERT's eval cadence is in training samples, not epochs (rules/bert.yaml).
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
from workloads.optim.configs import LambConfig


@dataclasses.dataclass
class ModelConfig:
  """bert_config.json of the reference bundle (BERT-large, uncased WordPiece vocab)."""
  vocab_size: int = 30522
  hidden_size: int = 1024
  num_layers: int = 24
  num_heads: int = 16
  intermediate_size: int = 4096
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  dropout: float = 0.1                # hidden_dropout_prob = attention_probs_dropout_prob
  initializer_range: float = 0.02     # truncated normal stddev for every weight

  def validate(self):
    positive(self, "vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
             "max_position_embeddings", "type_vocab_size", "initializer_range")
    if self.hidden_size % self.num_heads:
      raise UsageError(f"{key_of(self, 'hidden_size')}={self.hidden_size} is not divisible by "
                       f"{key_of(self, 'num_heads')}={self.num_heads}; allowed: a multiple of "
                       "num_heads")
    in_range(self, "dropout", 0.0, 0.9)


@dataclasses.dataclass
class DataConfig:
  """Where examples come from. `tfrecord` reads the reference's pretraining TFRecords:
  <data-dir>/part-*  (create_pretraining_data.py output, part-00XXX-of-00500) for training,
  <data-dir>/eval_10k (pick_eval_samples.py output) for eval, and the initial checkpoint
  <data-dir>/tf1_ckpt/model.ckpt-28252 (as the reference bundle names them)."""
  source: str = "tfrecord"            # tfrecord | mini (generated, written as TFRecords) | synthetic
  max_seq_length: int = 512
  max_predictions_per_seq: int = 76
  train_pattern: str = "part-*"
  eval_pattern: str = "eval_10k"
  init_checkpoint: str = "tf1_ckpt/model.ckpt-28252"   # relative to --data-dir; "" = random init
  train_examples: int = 0             # logged as train_samples; 0: the run's sample budget
  eval_examples: int = 10_000
  eval_batch_size: int = 256
  shuffle_buffer: int = 10_000
  mini_seed: int = 1234               # the mini corpus is fixed; the run seed only shuffles it
  mini_documents: int = 1000
  mini_topics: int = 4                # each document's sentences follow one topic's Markov chain
  mini_dupe_factor: int = 5           # masked copies of each example (create_pretraining_data)
  mini_eval_documents: int = 400
  # Packed rows (workloads/bert/packing.py; JAX): several samples a max_seq_length row, each
  # still one sample. train.global_batch_size stays the samples a step on average: a step is
  # ceil(global_batch_size / packing_factor) rows, and the samples it trains (counted on the
  # host) drive the eval cadence and epoch_num.
  packing: bool = False
  max_samples_per_row: int = 3        # NVIDIA's and Graphcore's packs hold up to 3
  packing_factor: float = 2.0         # samples a row expected (Graphcore: ~2 on Wikipedia, 3/row)
  packing_window: int = 64            # the greedy packer's look-ahead, in samples

  def validate(self):
    one_of(self, "source", ("tfrecord", "mini", "synthetic"))
    positive(self, "max_seq_length", "max_predictions_per_seq", "eval_examples",
             "eval_batch_size", "shuffle_buffer", "mini_documents", "mini_topics",
             "mini_dupe_factor", "mini_eval_documents")
    in_range(self, "train_examples", 0, None)
    in_range(self, "max_predictions_per_seq", 1, self.max_seq_length)
    positive(self, "max_samples_per_row", "packing_window")
    in_range(self, "packing_factor", 1.0, float(self.max_samples_per_row))


@workload_config
class BertConfig:
  model: ModelConfig
  data: DataConfig
  optimizer: LambConfig


def eval_interval_samples(global_batch_size: int) -> int:
  """MLPerf v1.0+: FLOOR(0.05 * (230.23 * GBS + 3,000,000), 25,000) samples between evals."""
  return 25_000 * math.floor(0.05 * (230.23 * global_batch_size + 3_000_000) / 25_000)


REFERENCE_SAMPLES = 256 * 13_700      # the RCP point's budget: 13,700 steps at batch 256


def reference() -> BertConfig:
  """The RCP point at global batch 256 (rules/bert.yaml): lr 3.5e-4, no warmup, from the
  reference checkpoint, target 0.720. The eval interval (the MLPerf formula of the batch) and
  the LAMB decay steps (the sample budget in batches) are left to `derive`, so they follow
  `--set train.global_batch_size`: at 256, 150,000 samples and 13,700 steps."""
  mlperf = rules.load("bert")
  return BertConfig(
      optimizer=LambConfig(base_learning_rate=0.00035, training_steps=0),
      train=TrainConfig(global_batch_size=256, target=mlperf.target, precision="bfloat16",
                        eval_every_samples=0, max_samples=REFERENCE_SAMPLES))


def derive(cfg: BertConfig):
  """Fills the values a config leaves 0: the eval interval from the MLPerf formula of the
  global batch, the LAMB decay steps (--num_train_steps) from the sample budget."""
  gbs = cfg.train.global_batch_size
  if not cfg.train.eval_every_samples:
    cfg.train.eval_every_samples = eval_interval_samples(gbs)
  if not cfg.optimizer.training_steps:
    cfg.optimizer.training_steps = math.ceil(cfg.train.max_samples / gbs)


def synthetic() -> BertConfig:
  cfg = as_synthetic(reference(), global_batch_size=8)
  cfg.data.init_checkpoint = ""               # generated batches: no checkpoint read
  return cfg


def mini() -> BertConfig:
  """BERT scaled down (2 layers, hidden 64, feed-forward 128, 64-token vocab, sequence 32) on a
  generated corpus written as TFRecords in the reference format; from random weights (no mini
  checkpoint). Masked-LM accuracy on a 2-core CPU, seed 0: JAX 0.36 at 900 steps and 0.62 at
  1,350; TF 0.43 and 0.63 (and < 1.0, as the checker needs). A feed-forward width of 256 (4x
  hidden, as BERT) learns along the same curve (0.62 at 1,350 steps) at 3/4 of the speed."""
  return BertConfig(
      model=ModelConfig(vocab_size=64, hidden_size=64, num_layers=2, num_heads=4,
                        intermediate_size=128, max_position_embeddings=32, dropout=0.0),
      data=DataConfig(source="mini", max_seq_length=32, max_predictions_per_seq=5,
                      init_checkpoint="", eval_examples=1000, eval_batch_size=250,
                      shuffle_buffer=4096),
      optimizer=LambConfig(base_learning_rate=0.02, training_steps=2400, warmup_steps=50),
      train=TrainConfig(global_batch_size=32, target=0.6, precision="float32",
                        eval_every_samples=4800, max_samples=2400 * 32))


def tiny() -> BertConfig:
  """The smallest config that runs every code path (the contract test's)."""
  cfg = mini()
  cfg.model = ModelConfig(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2,
                          intermediate_size=32, max_position_embeddings=16, dropout=0.0)
  cfg.data = DataConfig(source="mini", max_seq_length=16, max_predictions_per_seq=3,
                        init_checkpoint="", eval_examples=40, eval_batch_size=16,
                        shuffle_buffer=256, mini_documents=60, mini_eval_documents=40,
                        mini_dupe_factor=1)
  cfg.optimizer.training_steps = 20
  cfg.train.global_batch_size = 16
  cfg.train.eval_every_samples, cfg.train.max_samples = 160, 320
  return cfg


def batch_layout(cfg: BertConfig, batch_size: int, with_mask: bool = False) -> dict:
  """{name: (shape, dtype, logical axes)} of a batch as the input pipeline yields it (int32
  ids: the TFRecords store int64, the reader casts). Eval batches add 'mask' (1 real, 0
  padding). The masked-LM prediction slots have no logical name: they are never split."""
  seq, preds = cfg.data.max_seq_length, cfg.data.max_predictions_per_seq
  if cfg.data.packing and not with_mask:
    return packed_layout(cfg, batch_size)
  tokens, slots = ((batch_size, seq), "int32", ("batch", "length")), ("batch", None)
  layout = {"input_ids": tokens, "input_mask": tokens, "segment_ids": tokens,
            "masked_lm_positions": ((batch_size, preds), "int32", slots),
            "masked_lm_ids": ((batch_size, preds), "int32", slots),
            "masked_lm_weights": ((batch_size, preds), "float32", slots),
            "next_sentence_labels": ((batch_size,), "int32", ("batch",))}
  if with_mask:
    layout["mask"] = ((batch_size,), "float32", ("batch",))
  return layout


def packed_rows(cfg: BertConfig, samples: int) -> int:
  """Rows of a packed step meant to carry `samples` samples on average."""
  return max(1, math.ceil(samples / cfg.data.packing_factor))


def packed_layout(cfg: BertConfig, samples: int) -> dict:
  """A packed training batch's layout (packing.py): packed_rows rows, per-token positions,
  input_mask holding each token's sample (1..S), one NSP slot a sample."""
  d = cfg.data
  rows, seq, slots = packed_rows(cfg, samples), d.max_seq_length, d.max_samples_per_row
  preds = d.max_predictions_per_seq + slots
  tokens, per_row = ((rows, seq), "int32", ("batch", "length")), ("batch", None)
  return {"input_ids": tokens, "input_mask": tokens, "segment_ids": tokens, "positions": tokens,
          "masked_lm_positions": ((rows, preds), "int32", per_row),
          "masked_lm_ids": ((rows, preds), "int32", per_row),
          "masked_lm_weights": ((rows, preds), "float32", per_row),
          "cls_positions": ((rows, slots), "int32", per_row),
          "next_sentence_labels": ((rows, slots), "int32", per_row),
          "next_sentence_weights": ((rows, slots), "float32", per_row)}


# Every parameter's logical axes (flax paths; the Keras model uses the same names). Query/key/
# value kernels are [embed, heads * kv] in BERT's layout: the joined dimension is 'heads'.
PARAM_AXES = (
    (r"word_embeddings/embedding", ("vocab", "embed")),
    (r"position_embeddings/embedding", ("length", "embed")),
    (r"token_type_embeddings/embedding", (None, "embed")),
    (r".*LayerNorm/(scale|bias)", ("embed",)),
    (r"layer_\d+/(query|key|value)/kernel", ("embed", "heads")),
    (r"layer_\d+/(query|key|value)/bias", ("heads",)),
    (r"layer_\d+/attention_output/kernel", ("heads", "embed")),
    (r"layer_\d+/intermediate/kernel", ("embed", "mlp")),
    (r"layer_\d+/intermediate/bias", ("mlp",)),
    (r"layer_\d+/output/kernel", ("mlp", "embed")),
    (r"layer_\d+/(attention_output|output)/bias", ("embed",)),
    (r"(pooler|mlm_transform)/kernel", ("embed", None)),
    (r"(pooler|mlm_transform)/bias", ("embed",)),
    (r"nsp/kernel", ("embed", "classes")),
    (r"nsp/bias", ("classes",)),
    (r"mlm_output_bias", ("vocab",)),
)


def pipeline_layers(cfg) -> list[tuple[str, str]]:
  """GPipe cuts BERT between encoder layers (the embeddings go with the first, the pooler and
  both heads with the last): [(layer, regex of its parameter paths)]. The word embedding is
  read by the first layer (lookup) and the last (the masked-LM projection tied to it)."""
  n = cfg.model.num_layers
  layers = [(f"layer_{i}", [f"layer_{i}/.*"]) for i in range(n)]
  layers[0][1].append("(word|position|token_type)_embeddings/.*|embeddings_LayerNorm/.*")
  layers[-1][1].append("pooler/.*|nsp/.*|mlm_.*|word_embeddings/.*")
  return [(name, "|".join(paths)) for name, paths in layers]


def schedule_for(cfg: BertConfig) -> schedules.BertLambSchedule:
  opt = cfg.optimizer
  return schedules.BertLambSchedule(base_lr=opt.base_learning_rate,
                                    training_steps=opt.training_steps,
                                    warmup_steps=opt.warmup_steps,
                                    start_warmup_step=opt.start_warmup_step,
                                    power=opt.decay_poly_power)


def train_samples(cfg: BertConfig) -> int:
  """What the log's train_samples says: the corpus size when known, else the sample budget
  (the reference logs train_batch_size * num_train_steps)."""
  return cfg.data.train_examples or cfg.train.max_samples


def mllog_hyperparameters(cfg: BertConfig, train_examples: int) -> dict:
  """The keys closed_bert.yaml (ruleset 5.0.0) requires exactly once, plus the reference's."""
  opt = cfg.optimizer
  return {"opt_name": "lamb",
          "opt_base_learning_rate": opt.base_learning_rate,
          "opt_lamb_epsilon": opt.epsilon,
          "opt_lamb_beta_1": opt.beta_1,
          "opt_lamb_beta_2": opt.beta_2,
          "opt_lamb_weight_decay_rate": opt.weight_decay_rate,
          "opt_learning_rate_training_steps": opt.training_steps,
          "opt_learning_rate_warmup_steps": opt.warmup_steps,
          "num_warmup_steps": opt.warmup_steps,
          "start_warmup_step": opt.start_warmup_step,
          "opt_lamb_learning_rate_decay_poly_power": opt.decay_poly_power,
          "max_sequence_length": cfg.data.max_seq_length,
          "eval_interval_samples": cfg.train.eval_every_samples}


def missing_data(cfg, data_dir) -> list[str]:
  """What a reference run reads: train shards, the eval file and the initial checkpoint (a TF1
  checkpoint is <prefix>.index plus <prefix>.data-*)."""
  if cfg.data.source != "tfrecord":
    return []
  missing = [p for p in (cfg.data.train_pattern, cfg.data.eval_pattern)
             if not glob.glob(os.path.join(data_dir, p))]
  ckpt = cfg.data.init_checkpoint
  if ckpt and not glob.glob(os.path.join(data_dir, ckpt) + ".index"):
    missing.append(ckpt)
  return missing


def check_framework(cfg, framework):
  """BERT's GPipe pipeline is JAX's (the TF pipeline places the Transformer's and ResNet's
  layers). Packed rows run in JAX on one host: the TF model has no per-sample attention,
  positions or NSP slots, and each host's packer would train a different number of samples a
  step."""
  stages, micro = cfg.parallel.axes()["stage"], cfg.parallel.microbatches
  if framework == "tf" and (stages > 1 or micro > 1):
    raise UsageError(f"--mesh stage={stages} / parallel.microbatches={micro} for BERT in TF: "
                     "its pipeline runs in JAX only; allowed: --framework jax, or stage=1 and "
                     "microbatches=1")
  if not cfg.data.packing:
    return
  if framework == "tf":
    raise UsageError("data.packing=true in TF: packed rows are built in the JAX model only; "
                     "allowed: --framework jax, or data.packing=false")
  if cfg.parallel.num_processes > 1:
    raise UsageError(f"data.packing=true with --num-processes {cfg.parallel.num_processes}: "
                     "each host's packer trains its own number of samples a step; allowed: "
                     "one process")


SPEC = WorkloadSpec(
    name="bert",
    title="BERT-large pre-training (masked LM + next sentence) on Wikipedia",
    metric=Metric("masked_lm_accuracy", "fraction", counts="masked-LM tokens"),
    presets=by_name(mini, reference, synthetic, tiny),
    mesh_axes=("data", "stage", "model"),
    split_dims=lambda cfg: {"length": cfg.data.max_seq_length, "heads": cfg.model.num_heads,
                            "mlp": cfg.model.intermediate_size, "vocab": cfg.model.vocab_size},
    param_axes=PARAM_AXES,
    data_dir_contents=("a folder with the MLPerf BERT TFRecords (part-*, eval_10k) and "
                       "tf1_ckpt/model.ckpt-28252"),
    **from_module(globals()),
)
