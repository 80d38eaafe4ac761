"""DLRM-DCNv2 on Criteo 1TB multi-hot (MLPerf `dlrm_dcnv2`): configs and presets,
framework-neutral.

The MLPerf reference (mlcommons/training recommendation_v2/torchrec_dlrm, TorchRec): 13 dense
features through a bottom MLP to the embedding dimension, 26 categorical features each a bag of
ids (multi-hot) summed from its table, the 27 vectors concatenated and crossed by DCNv2's
low-rank cross layers, then the top MLP to one logit; binary cross entropy, Adagrad, one epoch
over days 0-22, ROC AUC over the whole eval set 20 times an epoch, target 0.80275.
"""
import dataclasses
import glob
import os

import numpy as np

from harness import cadence, rules
from harness.config import TrainConfig, as_synthetic, in_range, key_of, one_of, positive
from harness.config_root import workload_config
from harness.errors import UsageError
from harness.workload import Metric, WorkloadSpec, by_name, from_module
from workloads.dlrm import embedding_plan
from workloads.optim import schedules
from workloads.optim.configs import AdagradConfig

CRITEO_TRAIN_EXAMPLES = 4_195_197_692      # days 0-22
CRITEO_EVAL_EXAMPLES = 89_137_319          # the first half of day 23 (closed_dlrm_dcnv2.yaml)
# The reference's --num_embeddings_per_feature (tables capped at 40M rows) and
# --multi_hot_sizes (materialize_synthetic_multihot_dataset.py), in feature order.
CRITEO_ROWS = (40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956,
               405282, 10, 2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152,
               12973, 108, 36)
CRITEO_MULTI_HOT = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3,
                    1, 1)

AUC = Metric("auc", "ROC AUC")


@dataclasses.dataclass
class ModelConfig:
  dense_features: int = 13
  num_embeddings_per_feature: tuple[int, ...] = CRITEO_ROWS
  multi_hot_sizes: tuple[int, ...] = CRITEO_MULTI_HOT
  embedding_dim: int = 128
  bottom_mlp: tuple[int, ...] = (512, 256, 128)       # ends at embedding_dim
  top_mlp: tuple[int, ...] = (1024, 1024, 512, 256, 1)   # ends at one logit
  dcn_num_layers: int = 3
  dcn_low_rank_dim: int = 512
  row_wise_min_rows: int = 100_000    # tables this large split row-wise over `model`

  @property
  def num_features(self) -> int:
    return len(self.num_embeddings_per_feature)

  @property
  def interaction_dim(self) -> int:
    return (self.num_features + 1) * self.embedding_dim

  def validate(self):
    positive(self, "dense_features", "embedding_dim", "dcn_num_layers", "dcn_low_rank_dim",
             "row_wise_min_rows")
    rows, hot = self.num_embeddings_per_feature, self.multi_hot_sizes
    if not rows or min(rows) < 1 or len(hot) != len(rows) or min(hot) < 1:
      raise UsageError(f"{key_of(self, 'multi_hot_sizes')}={hot!r} with "
                       f"{key_of(self, 'num_embeddings_per_feature')}={rows!r}: allowed one "
                       "positive bag size per table, each table at least one row")
    if not self.bottom_mlp or self.bottom_mlp[-1] != self.embedding_dim:
      raise UsageError(f"{key_of(self, 'bottom_mlp')}={self.bottom_mlp!r} must end at "
                       f"{key_of(self, 'embedding_dim')}={self.embedding_dim}")
    if not self.top_mlp or self.top_mlp[-1] != 1:
      raise UsageError(f"{key_of(self, 'top_mlp')}={self.top_mlp!r} must end at one logit (1)")


@dataclasses.dataclass
class DataConfig:
  """`criteo` reads the reference's multi-hot files from --data-dir (input_pipeline.py):
  day_<d>_dense.npy, day_<d>_sparse_multi_hot.npz, day_<d>_labels.npy; train days 0-22, eval
  the first half of day 23."""
  source: str = "criteo"              # criteo | mini (generated, the same files) | synthetic
  train_days: int = 23                # days 0 .. train_days - 1; day train_days is eval
  train_examples: int = CRITEO_TRAIN_EXAMPLES
  eval_examples: int = CRITEO_EVAL_EXAMPLES
  eval_batch_size: int = 65536
  mini_seed: int = 1234               # the mini dataset is fixed; the run seed does not change it
  mini_zipf: float = 1.2              # id frequencies of the generated days ~ rank^-zipf

  def validate(self):
    one_of(self, "source", ("criteo", "mini", "synthetic"))
    positive(self, "train_days", "train_examples", "eval_examples", "eval_batch_size")
    in_range(self, "mini_zipf", 0.0, None)


@workload_config
class DlrmConfig:
  model: ModelConfig
  data: DataConfig
  optimizer: AdagradConfig


def reference() -> DlrmConfig:
  """The reference recipe at global batch 55,296 (the RCP NVIDIA measured at the v3.0
  submission: 0.76 epochs to converge on average), constant Adagrad rate 0.004, one epoch,
  in float32 as the reference trains (bf16 compute: --set train.precision=bfloat16)."""
  mlperf = rules.load("dlrm_dcnv2")
  train = TrainConfig(global_batch_size=55296, max_epochs=1.0, target=mlperf.target,
                      precision="float32")
  return DlrmConfig(train=cadence.apply_rules(train, mlperf.eval_cadence))


def synthetic() -> DlrmConfig:
  return as_synthetic(reference(), global_batch_size=2048)


MINI_ROWS = (4000, 2000, 1000, 500, 200, 100, 40, 10, 4, 3)
MINI_MULTI_HOT = (3, 2, 1, 4, 2, 1, 1, 3, 1, 1)


def mini() -> DlrmConfig:
  """Ten tables of 3 to 4,000 rows, 16-wide, on generated days whose clicks follow a planted
  logistic model of the dense features and the ids (input_pipeline.py); AUC target below
  what that model allows."""
  cfg = DlrmConfig(
      model=ModelConfig(num_embeddings_per_feature=MINI_ROWS, multi_hot_sizes=MINI_MULTI_HOT,
                        embedding_dim=16, bottom_mlp=(64, 16), top_mlp=(64, 32, 1),
                        dcn_num_layers=2, dcn_low_rank_dim=16, row_wise_min_rows=1000),
      data=DataConfig(source="mini", train_days=4, train_examples=65536, eval_examples=8192,
                      eval_batch_size=2048),
      optimizer=AdagradConfig(base_learning_rate=0.05),
      train=TrainConfig(global_batch_size=512, max_epochs=3.0, target=0.87,
                        precision="float32"))
  cfg.train.evals_per_epoch = 4
  return cfg


def tiny() -> DlrmConfig:
  """The smallest config that runs every code path (the contract test's)."""
  cfg = mini()
  cfg.model = ModelConfig(num_embeddings_per_feature=(40, 12, 6, 3), multi_hot_sizes=(2, 1, 3, 1),
                          embedding_dim=8, bottom_mlp=(16, 8), top_mlp=(16, 1),
                          dcn_num_layers=1, dcn_low_rank_dim=4, row_wise_min_rows=12)
  cfg.data = DataConfig(source="mini", train_days=2, train_examples=256, eval_examples=100,
                        eval_batch_size=64)
  cfg.train.global_batch_size = 32
  cfg.train.max_epochs = 1.0
  cfg.train.evals_per_epoch = 2
  return cfg


def plan(cfg, model: int) -> embedding_plan.Plan:
  """The embedding rows' placement on `model` peers (embedding_plan.py)."""
  m = cfg.model
  return embedding_plan.make_plan(tuple(m.num_embeddings_per_feature), model,
                                  m.row_wise_min_rows)


def schedule_for(cfg) -> schedules.LrPolicySchedule:
  opt = cfg.optimizer
  return schedules.LrPolicySchedule(opt.base_learning_rate, opt.warmup_steps,
                                    opt.decay_start_step, opt.decay_steps)


def batch_layout(cfg, batch_size: int, with_mask: bool = False) -> dict:
  """{name: (shape, dtype, logical axes)}: the dense features (log-transformed, as the
  reference's files hold them), every feature's ids side by side (feature f's bag is
  multi_hot_sizes[f] columns), the click label; eval batches add 'mask'."""
  m = cfg.model
  layout = {"dense": ((batch_size, m.dense_features), "float32", ("batch", "embed")),
            "sparse": ((batch_size, sum(m.multi_hot_sizes)), "int32", ("batch", "length")),
            "label": ((batch_size,), "float32", ("batch",))}
  if with_mask:
    layout["mask"] = ((batch_size,), "float32", ("batch",))
  return layout


def unique_rows_bound(cfg, batch_size: int) -> int:
  """The most distinct slab rows `batch_size` examples can look up: per feature, its lookups
  or its table's rows, whichever is fewer (a feature's ids land in its own table's rows): the
  static size of a sparse update's unique rows."""
  m = cfg.model
  return int(sum(min(batch_size * hot, rows) for hot, rows in
                 zip(m.multi_hot_sizes, m.num_embeddings_per_feature)))


# The embedding slab's rows split over `model` (embedding_plan.py); every dense weight whole
# (None: no logical dimension a mesh axis splits).
PARAM_AXES = (
    (r"embedding/slab", ("vocab", "embed")),
    (r".*/kernel", (None, None)),
    (r".*/bias", (None,)),
)


def parameter_count(cfg) -> int:
  """The model's parameters by formula (TorchRec's DLRM_DCN): the tables, the MLPs (weights
  and biases) and each cross layer's V [d, r], W [r, d] and bias [d]."""
  m = cfg.model
  count = sum(m.num_embeddings_per_feature) * m.embedding_dim
  for widths in ((m.dense_features,) + tuple(m.bottom_mlp),
                 (m.interaction_dim,) + tuple(m.top_mlp)):
    count += sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))
  d, r = m.interaction_dim, m.dcn_low_rank_dim
  return count + m.dcn_num_layers * (2 * d * r + d)


def mllog_hyperparameters(cfg, train_examples: int) -> dict:
  """The keys closed_dlrm_dcnv2.yaml requires."""
  del train_examples
  opt = cfg.optimizer
  return {"opt_name": "adagrad", "opt_base_learning_rate": opt.base_learning_rate,
          "opt_adagrad_learning_rate_decay": opt.lr_decay,
          "opt_weight_decay": opt.weight_decay,
          "opt_adagrad_initial_accumulator_value": opt.initial_accumulator_value,
          "opt_adagrad_epsilon": opt.epsilon,
          "opt_learning_rate_warmup_steps": opt.warmup_steps,
          "opt_learning_rate_decay_start_step": opt.decay_start_step,
          "opt_learning_rate_decay_steps": opt.decay_steps}


def describe_lines(cfg, parameters: int) -> list:
  """The tables' placement on this run's model axis, and the reference's parameter count."""
  model = cfg.parallel.axes()["model"]
  p = plan(cfg, model)
  whole = [f"{f}" for f, t in enumerate(p.tables) if t.kind == embedding_plan.TABLE_WISE]
  dim = cfg.model.embedding_dim
  lines = [("embedding tables", f"{p.kinds()[embedding_plan.ROW_WISE]} row-wise over "
            f"model={model}, {len(whole)} table-wise (whole on one peer: "
            f"{', '.join(whole) or 'none'}); {p.rows_per_shard:,} slab rows a peer "
            f"({p.rows_per_shard * dim * 4 / 2**20:,.1f} MiB float32), "
            f"{p.slab_rows - p.real_rows:,} of them padding"),
           ("parameters (formula)", f"{parameter_count(cfg):,} (the tables' real rows)")]
  del parameters
  return lines


def check_framework(cfg, framework: str):
  """A batch split over data replicas, tables over `model`: nothing else is laid out."""
  del framework
  axes = cfg.parallel.axes()
  for axis in ("stage", "expert", "spatial"):
    if axes[axis] > 1:
      raise UsageError(f"--mesh {axis}={axes[axis]}: DLRM-DCNv2 has no {axis} layout; "
                       "allowed: data and model")


def missing_data(cfg, data_dir) -> list[str]:
  """The reference's preprocessed multi-hot days (train days and the eval day)."""
  if cfg.data.source != "criteo":
    return []
  days = range(cfg.data.train_days + 1)
  return [name for d in days for name in (f"day_{d}_dense.npy", f"day_{d}_labels.npy",
                                          f"day_{d}_sparse_multi_hot.npz")
          if not glob.glob(os.path.join(data_dir, name))]


def split_dims(cfg) -> dict:
  """The slab's rows split over `model` for any size: the plan pads them."""
  del cfg
  return {}


SPEC = WorkloadSpec(
    name="dlrm",
    mlperf_benchmark="dlrm_dcnv2",
    title="DLRM-DCNv2 on Criteo 1TB multi-hot",
    metric=AUC,
    presets=by_name(mini, reference, synthetic, tiny),
    mesh_axes=("data", "model"),
    param_axes=PARAM_AXES,
    data_dir_contents=("the reference's multi-hot Criteo days: day_<d>_dense.npy, "
                       "day_<d>_labels.npy, day_<d>_sparse_multi_hot.npz for d = 0..23 "
                       "(materialize_synthetic_multihot_dataset.py output)"),
    host_evaluator="auc.AucEvaluator",
    **from_module(globals()),
)
