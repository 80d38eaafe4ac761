"""EfficientNet B0-B7 on ImageNet (not an MLPerf benchmark: rules/efficientnet.yaml is the
project's own rule file): configs, presets and the architecture table, framework-neutral.

The architecture (MBConv stages, width/depth rounding, per-block drop rates) is computed here,
once, and both jax_model.py and tf_model.py build from `blocks(...)`, so the two frameworks
cannot disagree on it; keras.applications.EfficientNetB* is the count reference.
"""
import dataclasses
import math

from harness import cadence, mesh, rules
from harness.config import TrainConfig, as_synthetic, in_range, one_of, positive
from harness.config_root import workload_config
from harness.errors import UsageError
from harness.workload import TOP1, WorkloadSpec, by_name, from_module
from workloads.common import image_batch
from workloads.optim import schedules
from workloads.optim.configs import LarsPolyConfig, RmsPropConfig

IMAGENET_TRAIN_EXAMPLES = 1_281_167
IMAGENET_EVAL_EXAMPLES = 50_000

# (kernel, repeats, filters_in, filters_out, expand_ratio, strides) of the seven B0 stages;
# every block has squeeze-and-excite at 0.25 of its input filters (Tan & Le 2019, Table 1).
STAGES = ((3, 1, 32, 16, 1, 1), (3, 2, 16, 24, 6, 2), (5, 2, 24, 40, 6, 2),
          (3, 3, 40, 80, 6, 2), (5, 3, 80, 112, 6, 1), (5, 4, 112, 192, 6, 2),
          (3, 1, 192, 320, 6, 1))
SE_RATIO = 0.25
STEM_FILTERS, TOP_FILTERS = 32, 1280
BN_MOMENTUM, BN_EPSILON = 0.99, 1e-3

# variant: (width coefficient, depth coefficient, resolution, final dropout)
VARIANTS = {"b0": (1.0, 1.0, 224, 0.2), "b1": (1.0, 1.1, 240, 0.2),
            "b2": (1.1, 1.2, 260, 0.3), "b3": (1.2, 1.4, 300, 0.3),
            "b4": (1.4, 1.8, 380, 0.4), "b5": (1.6, 2.2, 456, 0.4),
            "b6": (1.8, 2.6, 528, 0.5), "b7": (2.0, 3.1, 600, 0.5)}


def round_filters(filters, width_coefficient, divisor=8):
  """Channels scaled by the width coefficient, to a multiple of 8, never 10% below."""
  filters *= width_coefficient
  rounded = max(divisor, int(filters + divisor / 2) // divisor * divisor)
  return int(rounded + divisor if rounded < 0.9 * filters else rounded)


def round_repeats(repeats, depth_coefficient):
  return int(math.ceil(depth_coefficient * repeats))


@dataclasses.dataclass(frozen=True)
class Block:
  name: str              # block1a, block2b, ... (keras.applications' names, both frameworks)
  kernel: int
  filters_in: int
  filters_out: int
  expand_ratio: int
  strides: int
  se_filters: int
  drop_rate: float       # stochastic depth: drop_connect_rate * block index / number of blocks

  @property
  def residual(self):
    return self.strides == 1 and self.filters_in == self.filters_out


def blocks(width_coefficient, depth_coefficient, drop_connect_rate):
  """Every MBConv block of a variant, in order."""
  total = sum(round_repeats(s[1], depth_coefficient) for s in STAGES)
  out, index = [], 0
  for stage, (kernel, repeats, f_in, f_out, expand, strides) in enumerate(STAGES):
    f_in, f_out = round_filters(f_in, width_coefficient), round_filters(f_out, width_coefficient)
    for j in range(round_repeats(repeats, depth_coefficient)):
      block_in = f_in if j == 0 else f_out
      out.append(Block(f"block{stage + 1}{chr(ord('a') + j)}", kernel, block_in, f_out, expand,
                       strides if j == 0 else 1, max(1, int(block_in * SE_RATIO)),
                       drop_connect_rate * index / total))
      index += 1
  return out


@dataclasses.dataclass
class ModelConfig:
  variant: str = "b0"                  # b0..b7 set the four fields below and the resolution
                                       # (spec.derive); any other name keeps them as given
  width_coefficient: float = 1.0
  depth_coefficient: float = 1.0
  dropout_rate: float = 0.2            # before the classifier
  drop_connect_rate: float = 0.2       # stochastic depth of the last block (0 at the first)
  num_classes: int = 1000
  bn_momentum: float = BN_MOMENTUM     # of the running statistics (mini: faster, few steps)

  def validate(self):
    one_of(self, "variant", tuple(VARIANTS) + ("mini", "custom"))
    positive(self, "width_coefficient", "depth_coefficient", "num_classes")
    in_range(self, "dropout_rate", 0.0, 0.99)
    in_range(self, "drop_connect_rate", 0.0, 0.99)
    in_range(self, "bn_momentum", 0.0, 0.9999)


def variant(name, num_classes=1000) -> tuple[ModelConfig, int]:
  """(model config, image size) of EfficientNet-B0..B7."""
  width, depth, size, dropout = VARIANTS[name]
  return ModelConfig(name, width, depth, dropout, 0.2, num_classes, BN_MOMENTUM), size


def derive(cfg):
  """`--set model.variant=b3`: B3's width, depth, dropout and, where data.image_size is 0 (the
  variant presets'), its 300 px. An image size the user sets stays (it used to be overwritten
  by the variant's, silently: `--set data.image_size=64` trained at 224)."""
  if cfg.model.variant in VARIANTS:
    width, depth, size, dropout = VARIANTS[cfg.model.variant]
    m = cfg.model
    m.width_coefficient, m.depth_coefficient, m.dropout_rate = width, depth, dropout
    if not cfg.data.image_size:
      cfg.data.image_size = size
  if not cfg.data.image_size:
    raise UsageError(f"data.image_size=0 needs a model.variant of {', '.join(VARIANTS)} (got "
                     f"{cfg.model.variant!r}); allowed: a size in pixels")


@dataclasses.dataclass
class DataConfig:
  source: str = "imagenet2012"     # imagenet2012 (tfds) | mini (generated) | synthetic
  image_size: int = 0              # 0: the variant's resolution (spec.derive)
  train_examples: int = IMAGENET_TRAIN_EXAMPLES
  eval_examples: int = IMAGENET_EVAL_EXAMPLES
  eval_batch_size: int = 1024
  shuffle_buffer: int = 16384
  mini_seed: int = 1234
  mini_label_noise: float = 0.05
  mini_pixel_noise: float = 2.0

  def validate(self):
    one_of(self, "source", ("imagenet2012", "mini", "synthetic"))
    positive(self, "train_examples", "eval_examples", "eval_batch_size", "shuffle_buffer")
    in_range(self, "image_size", 0, None)
    in_range(self, "mini_label_noise", 0.0, 0.99)


@workload_config
class EfficientNetConfig:
  model: ModelConfig
  data: DataConfig
  optimizer: RmsPropConfig | LarsPolyConfig = dataclasses.field(default_factory=RmsPropConfig)


def reference() -> EfficientNetConfig:
  """EfficientNet-B0 with the tensorflow/tpu default recipe (rules/efficientnet.yaml): RMSProp,
  0.016 x batch/256 with 5 warmup epochs then x0.97 every 2.4 epochs, EMA 0.9999, 350 epochs
  at batch 2048; target and eval cadence from the rule file."""
  rule = rules.load("efficientnet")
  model, _ = variant("b0")
  train = TrainConfig(global_batch_size=2048, max_epochs=350, target=rule.target,
                      precision="bfloat16")
  return EfficientNetConfig(model=model, data=DataConfig(),
                            optimizer=RmsPropConfig(),
                            train=cadence.apply_rules(train, rule.eval_cadence))


def large_batch() -> EfficientNetConfig:
  """The at-scale recipe of "Training EfficientNets at Supercomputer Scale" (arXiv 2011.00071)
  as tensorflow/tpu implements it: LARS with warmup and polynomial decay (configs.LarsPolyConfig,
  the code's defaults; the paper's tuned values for batch 65,536 are not in its code) and batch
  norm over groups of 128 samples (main.py batch_norm_batch_size), at batch 65,536."""
  cfg = reference()
  cfg.optimizer = LarsPolyConfig()
  cfg.train.global_batch_size = 65536
  cfg.parallel.bn_group_samples = 128
  return cfg


def synthetic() -> EfficientNetConfig:
  return as_synthetic(reference(), global_batch_size=32)


def mini() -> EfficientNetConfig:
  """EfficientNet at width and depth 0.25 (one block per stage, 8..80 channels) on 32x32
  generated images; the reference recipe's optimizer with a shorter schedule. The moving
  averages (batch-norm statistics and the EMA eval uses) have horizons of ~10 steps, not ~100
  and ~10,000: a run this short would otherwise evaluate mostly its initial weights. Pixel
  noise 1.0 (ResNet's mini has 2.0): at 2.0 this model needed 4 (JAX) to 6 (TF) epochs of ~15 s
  on 2 CPU cores, at 1.0 both reach 0.94-0.95 at epoch 3 (seed 0), under the 0.955 the 5%
  label noise allows. (With the depthwise convs as taps, TF reaches 0.94 at epoch 2.)"""
  return EfficientNetConfig(
      model=ModelConfig(variant="mini", width_coefficient=0.25, depth_coefficient=0.25,
                        dropout_rate=0.1, drop_connect_rate=0.1, num_classes=10,
                        bn_momentum=0.9),
      data=DataConfig(source="mini", image_size=32, train_examples=4096, eval_examples=1000,
                      eval_batch_size=256, shuffle_buffer=4096, mini_pixel_noise=1.0),
      optimizer=RmsPropConfig(base_learning_rate_per_256=0.064, warmup_epochs=1.0,
                              decay_epochs=1.0, decay_factor=0.9, ema_decay=0.9),
      train=TrainConfig(global_batch_size=64, max_epochs=16, eval_every_epochs=1,
                        target=0.90, precision="float32"))


def mini_large_batch() -> EfficientNetConfig:
  """The mini model and data with the large_batch recipe's kind of training: LARS with warmup
  and polynomial decay (here to 0), the loss's L2 term, batch norm over groups of 32 samples."""
  cfg = mini()
  cfg.optimizer = LarsPolyConfig(base_learning_rate_per_256=8.0, warmup_epochs=1.0,
                                 end_learning_rate=0.0, ema_decay=0.9)
  cfg.parallel.bn_group_samples = 32
  return cfg


def tiny() -> EfficientNetConfig:
  """Every code path at the smallest size (the contract test's)."""
  cfg = mini()
  cfg.model.width_coefficient = cfg.model.depth_coefficient = 0.1
  cfg.data = DataConfig(source="mini", image_size=16, train_examples=64, eval_examples=40,
                        eval_batch_size=16, shuffle_buffer=64)
  cfg.train.global_batch_size = 16
  cfg.train.max_epochs = 2
  return cfg


def schedule_for(cfg, train_examples: int):
  """The recipe's learning rate in steps: RMSProp's exponential stairs or LARS' polynomial."""
  if cfg.optimizer.name == "lars":
    return schedules.efficientnet_poly_for(cfg.optimizer, cfg.train, train_examples)
  return schedules.warmup_exponential_for(cfg.optimizer, cfg.train, train_examples)


def loss_l2(cfg) -> float:
  """The weight of the L2 term the loss carries (LARS recipe); RMSProp adds its in the update."""
  return cfg.optimizer.weight_decay if cfg.optimizer.name == "lars" else 0.0


# Every parameter's logical axes (flax paths; Keras layer names are the same joined by '_').
PARAM_AXES = (
    (r"predictions/kernel", ("channels", "classes")),
    (r"predictions/bias", ("classes",)),
    (r".*/kernel", ("kernel_h", "kernel_w", "conv_in", "conv_out")),   # convs, depthwise too
    (r".*/(scale|bias)", ("channels",)),                               # batch norm, SE biases
)


def mllog_hyperparameters(cfg, train_examples: int) -> dict:
  """The recipe's keys (rules/efficientnet.yaml `logged_fixed_keys` and tunables; the LARS
  recipe's with MLPerf ResNet's lars_* names)."""
  opt = cfg.optimizer
  schedule = schedule_for(cfg, train_examples)
  if opt.name == "lars":
    return {"opt_name": "lars",
            "lars_opt_base_learning_rate": schedule.base_lr,
            "lars_opt_learning_rate_warmup_epochs": opt.warmup_epochs,
            "lars_opt_end_learning_rate": opt.end_learning_rate,
            "lars_opt_learning_rate_decay_poly_power": opt.decay_poly_power,
            "lars_opt_learning_rate_decay_steps": schedule.decay_steps,
            "lars_opt_weight_decay": opt.lars_weight_decay,
            "lars_opt_momentum": opt.momentum,
            "lars_epsilon": opt.lars_epsilon,
            "opt_weight_decay": opt.weight_decay,
            "model_eval_ema_factor": opt.ema_decay,
            "label_smoothing": opt.label_smoothing}
  return {"opt_name": "rmsprop",
          "opt_base_learning_rate": schedule.base_lr,
          "opt_learning_rate_warmup_epochs": opt.warmup_epochs,
          "opt_learning_rate_decay_interval": opt.decay_epochs,
          "opt_learning_rate_decay_factor": opt.decay_factor,
          "opt_weight_decay": opt.weight_decay,
          "opt_rmsprop_decay": opt.decay,
          "opt_rmsprop_momentum": opt.momentum,
          "opt_rmsprop_epsilon": opt.epsilon,
          "model_eval_ema_factor": opt.ema_decay,
          "label_smoothing": opt.label_smoothing}


SPEC = WorkloadSpec(
    name="efficientnet",
    title="EfficientNet-B0 on ImageNet (not an MLPerf benchmark)",
    metric=TOP1,
    presets=by_name(mini, mini_large_batch, reference, large_batch, synthetic, tiny),
    bn_span=mesh.run_bn_span,
    mesh_axes=("data",),
    batch_layout=image_batch.batch_layout,
    param_axes=PARAM_AXES,
    missing_data=image_batch.missing_data,
    needs_data_dir=("reference", "large_batch"),
    data_dir_contents=image_batch.DATA_DIR_CONTENTS,
    **from_module(globals()),
)
