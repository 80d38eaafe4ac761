"""ResNet-50 v1.5 on ImageNet (MLPerf `resnet`): configs and presets, framework-neutral."""
import dataclasses

from harness import rules
from harness.config import (OptimizerConfig, ParallelConfig, TrainConfig, _check_choice,
                            _positive)
from harness.errors import UsageError
from harness.workload import WorkloadSpec
from workloads.optim import schedules

IMAGENET_TRAIN_EXAMPLES = 1_281_167
IMAGENET_EVAL_EXAMPLES = 50_000


@dataclasses.dataclass
class ModelConfig:
  stage_sizes: tuple[int, ...] = (3, 4, 6, 3)    # bottleneck blocks per stage (ResNet-50)
  width: int = 64                                # filters of the first stage
  num_classes: int = 1000

  def validate(self):
    _positive(self, "width", "num_classes")
    if not self.stage_sizes or min(self.stage_sizes) < 1:
      raise UsageError(f"model.stage_sizes={self.stage_sizes!r} is out of range; allowed: "
                       "one or more positive block counts, e.g. 3,4,6,3")


@dataclasses.dataclass
class DataConfig:
  source: str = "imagenet2012"     # imagenet2012 (tfds) | mini (generated) | synthetic
  image_size: int = 224
  train_examples: int = IMAGENET_TRAIN_EXAMPLES
  eval_examples: int = IMAGENET_EVAL_EXAMPLES
  eval_batch_size: int = 1024
  shuffle_buffer: int = 16384
  mini_seed: int = 1234            # the mini dataset is fixed; the run seed only shuffles it
  mini_label_noise: float = 0.05   # keeps the best reachable accuracy below 1.0
  mini_pixel_noise: float = 2.0    # Gaussian noise on the generated images (task difficulty)

  def validate(self):
    _check_choice("data.source", self.source, ("imagenet2012", "mini", "synthetic"))
    _positive(self, "image_size", "train_examples", "eval_examples", "eval_batch_size",
              "shuffle_buffer")
    if not 0.0 <= self.mini_label_noise < 1.0:
      raise UsageError(f"data.mini_label_noise={self.mini_label_noise!r} is out of range; "
                       "allowed: 0 <= value < 1")


@dataclasses.dataclass
class ResNetConfig:
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
  train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
  parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)


def reference() -> ResNetConfig:
  """The MLPerf reference recipe at global batch 4096 (RCP mean: 40 epochs to 75.9%).
  Target and eval cadence come from rules/resnet.yaml."""
  mlperf = rules.load("resnet")
  return ResNetConfig(
      optimizer=OptimizerConfig(name="lars", base_learning_rate=10.0, warmup_epochs=5,
                                end_learning_rate=1e-4, decay_poly_power=2.0,
                                weight_decay=2e-4, momentum=0.9, label_smoothing=0.1),
      train=TrainConfig(global_batch_size=4096, max_epochs=45,
                        eval_every_epochs=mlperf.eval_cadence["every"], eval_offset_epochs=0,
                        target=mlperf.target, precision="bfloat16"))


def synthetic() -> ResNetConfig:
  cfg = reference()
  cfg.data.source = "synthetic"
  cfg.train.global_batch_size = 32
  return cfg


def mini() -> ResNetConfig:
  """ResNet v1.5 bottlenecks at 1/8 width, one block per stage, on 32x32 generated images."""
  return ResNetConfig(
      model=ModelConfig(stage_sizes=(1, 1, 1, 1), width=8, num_classes=10),
      data=DataConfig(source="mini", image_size=32, train_examples=4096, eval_examples=1000,
                      eval_batch_size=256, shuffle_buffer=4096, mini_pixel_noise=2.0),
      optimizer=OptimizerConfig(name="lars", base_learning_rate=2.0, warmup_epochs=1,
                                end_learning_rate=1e-4, decay_poly_power=2.0,
                                weight_decay=1e-4, momentum=0.9, label_smoothing=0.1),
      train=TrainConfig(global_batch_size=64, max_epochs=16, eval_every_epochs=1,
                        target=0.90, precision="float32"))


def batch_layout(cfg: ResNetConfig, batch_size: int, with_mask: bool = False) -> dict:
  """{name: (shape, dtype)} of a batch as the input pipeline yields it; each framework turns
  this into its own specs (jax.ShapeDtypeStruct, tf.TensorSpec) to compile before any data."""
  size = cfg.data.image_size
  layout = {"image": ((batch_size, size, size, 3), "float32"), "label": ((batch_size,), "int32")}
  if with_mask:
    layout["mask"] = ((batch_size,), "float32")
  return layout


def mllog_hyperparameters(cfg: ResNetConfig, train_examples: int) -> dict:
  """The optimizer keys the resnet compliance rules require (lars_* or sgd's opt_*)."""
  opt = cfg.optimizer
  schedule = schedules.warmup_poly_for(opt, cfg.train, train_examples)
  if opt.name == "lars":
    return {"opt_name": "lars", "lars_epsilon": opt.lars_epsilon,
            "lars_opt_weight_decay": opt.weight_decay,
            "lars_opt_base_learning_rate": opt.base_learning_rate,
            "lars_opt_learning_rate_warmup_epochs": opt.warmup_epochs,
            "lars_opt_end_learning_rate": opt.end_learning_rate,
            "lars_opt_learning_rate_decay_steps": schedule.decay_steps,
            "lars_opt_learning_rate_decay_poly_power": opt.decay_poly_power,
            "lars_opt_momentum": opt.momentum}
  return {"opt_name": "sgd", "opt_weight_decay": opt.weight_decay,
          "opt_base_learning_rate": opt.base_learning_rate,
          "opt_learning_rate_warmup_epochs": opt.warmup_epochs,
          "opt_end_learning_rate": opt.end_learning_rate,
          "opt_learning_rate_decay_steps": schedule.decay_steps,
          "opt_learning_rate_decay_poly_power": opt.decay_poly_power,
          "opt_momentum": opt.momentum}


SPEC = WorkloadSpec(
    name="resnet50",
    mlperf_benchmark="resnet",
    title="ResNet-50 v1.5 on ImageNet",
    metric_name="top1_accuracy",
    presets={"mini": mini, "reference": reference, "synthetic": synthetic},
    trainer_modules={"jax": "workloads.resnet.jax_trainer", "tf": "workloads.resnet.tf_trainer"},
    mllog_hyperparameters=mllog_hyperparameters,
    # Samples per batch-norm statistic: group size x per-replica batch (all replicas: the
    # global batch, which plain jit over a data-sharded batch computes).
    bn_span=lambda cfg, data_replicas: (
        (cfg.parallel.bn_group_size or data_replicas)
        * cfg.train.global_batch_size // data_replicas),
)
