"""ResNet-50 v1.5 on ImageNet (MLPerf `resnet`): configs and presets, framework-neutral."""
import dataclasses

from harness import cadence, mesh, rules
from harness.config import TrainConfig, as_synthetic, in_range, key_of, one_of, positive
from harness.config_root import workload_config
from harness.errors import UsageError
from harness.workload import TOP1, WorkloadSpec, by_name, from_module
from workloads.common import image_batch
from workloads.optim import schedules
from workloads.optim.configs import LarsSgdConfig

IMAGENET_TRAIN_EXAMPLES = 1_281_167
IMAGENET_EVAL_EXAMPLES = 50_000


@dataclasses.dataclass
class ModelConfig:
  stage_sizes: tuple[int, ...] = (3, 4, 6, 3)    # bottleneck blocks per stage (ResNet-50)
  width: int = 64                                # filters of the first stage
  num_classes: int = 1000

  def validate(self):
    positive(self, "width", "num_classes")
    if not self.stage_sizes or min(self.stage_sizes) < 1:
      raise UsageError(f"{key_of(self, 'stage_sizes')}={self.stage_sizes!r} is out of range; allowed: "
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
    one_of(self, "source", ("imagenet2012", "mini", "synthetic"))
    positive(self, "image_size", "train_examples", "eval_examples", "eval_batch_size",
             "shuffle_buffer")
    in_range(self, "mini_label_noise", 0.0, 0.99)


@workload_config
class ResNetConfig:
  model: ModelConfig
  data: DataConfig
  optimizer: LarsSgdConfig


def reference() -> ResNetConfig:
  """The MLPerf reference recipe at global batch 4096 (RCP mean: 40 epochs to 75.9%).
  Target and eval cadence come from rules/resnet.yaml."""
  mlperf = rules.load("resnet")
  train = TrainConfig(global_batch_size=4096, max_epochs=45, target=mlperf.target,
                      precision="bfloat16")
  return ResNetConfig(
      optimizer=LarsSgdConfig(name="lars", base_learning_rate=10.0, warmup_epochs=5,
                              end_learning_rate=1e-4, decay_poly_power=2.0,
                              weight_decay=2e-4, momentum=0.9, label_smoothing=0.1),
      train=cadence.apply_rules(train, mlperf.eval_cadence))


def synthetic() -> ResNetConfig:
  return as_synthetic(reference(), global_batch_size=32)


def mini() -> ResNetConfig:
  """ResNet v1.5 bottlenecks at 1/8 width, one block per stage, on 32x32 generated images."""
  return ResNetConfig(
      model=ModelConfig(stage_sizes=(1, 1, 1, 1), width=8, num_classes=10),
      data=DataConfig(source="mini", image_size=32, train_examples=4096, eval_examples=1000,
                      eval_batch_size=256, shuffle_buffer=4096, mini_pixel_noise=2.0),
      optimizer=LarsSgdConfig(name="lars", base_learning_rate=2.0, warmup_epochs=1,
                              end_learning_rate=1e-4, decay_poly_power=2.0,
                              weight_decay=1e-4, momentum=0.9, label_smoothing=0.1),
      train=TrainConfig(global_batch_size=64, max_epochs=16, eval_every_epochs=1,
                        target=0.90, precision="float32"))


def tiny() -> ResNetConfig:
  """The smallest config that runs every code path (the contract test's): two stages of
  width 4 on 16x16 mini images."""
  cfg = mini()
  cfg.model = ModelConfig(stage_sizes=(1, 1), width=4, num_classes=10)
  cfg.data = DataConfig(source="mini", image_size=16, train_examples=64, eval_examples=40,
                        eval_batch_size=16, shuffle_buffer=64)
  cfg.train.global_batch_size = 16
  cfg.train.max_epochs = 2
  return cfg


# Every parameter's logical axes (flax paths; the Keras model maps its names onto these).
PARAM_AXES = (
    (r"classifier/kernel", ("channels", "classes")),
    (r"classifier/bias", ("classes",)),
    (r".*/kernel", ("kernel_h", "kernel_w", "conv_in", "conv_out")),   # convolutions
    (r".*(BatchNorm|bn)[^/]*/(scale|bias)", ("channels",)),
)


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


def pipeline_layers(cfg) -> list[tuple[str, str]]:
  """GPipe cuts ResNet between bottleneck blocks (the stem goes with the first block, the
  pooling and classifier with the last): [(layer, regex of its parameter paths)]."""
  n = sum(cfg.model.stage_sizes)
  return [(f"BottleneckBlock_{i}", "|".join([f"BottleneckBlock_{i}/.*"] + (["stem_.*"] if i == 0
           else []) + (["classifier/.*"] if i == n - 1 else []))) for i in range(n)]


def check_spatial_partitions(stage_sizes, image_size, spatial):
  """Every layer's rows must split evenly over the `spatial` slabs (the halo exchange assumes
  equal slabs): the image size must be a multiple of the total downsampling x spatial."""
  stride = 2 ** (len(stage_sizes) + 1)          # stem conv, max pool, one per later stage
  if spatial > 1 and image_size % (stride * spatial):
    raise ValueError(f"--spatial-partitions {spatial} with image size {image_size}: the TF "
                     f"halo exchange splits every layer's rows evenly, so the size must be a "
                     f"multiple of {stride * spatial}")


def check_framework(cfg, framework):
  """Layout limits of one framework's model, decidable from the config alone."""
  axes = cfg.parallel.axes()
  if framework == "tf" and axes["stage"] > 1 and axes["data"] > 1:
    raise ValueError(f"--mesh stage={axes['stage']},data={axes['data']} in TF: its pipeline "
                     "normalises each micro-batch on its own stage device, not over data "
                     "replicas; allowed: stage=K with data=1 in TF, or data=D in JAX")
  if framework == "tf":
    check_spatial_partitions(cfg.model.stage_sizes, cfg.data.image_size,
                             cfg.parallel.axes()["spatial"])


SPEC = WorkloadSpec(
    name="resnet50",
    mlperf_benchmark="resnet",
    title="ResNet-50 v1.5 on ImageNet",
    metric=TOP1,
    presets=by_name(mini, reference, synthetic, tiny),
    bn_span=mesh.run_bn_span,
    mesh_axes=("data", "stage", "spatial"),
    split_dims=lambda cfg: {"height": cfg.data.image_size},
    batch_layout=image_batch.batch_layout,
    param_axes=PARAM_AXES,
    missing_data=image_batch.missing_data,
    data_dir_contents=image_batch.DATA_DIR_CONTENTS,
    **from_module(globals()),
)
