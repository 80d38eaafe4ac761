"""SSD300 with a ResNet-34 backbone on COCO 2017 (MLPerf `ssd`, rulesets 0.7.0-1.0.0):
configs, presets, the feature-map geometry and the mlperf keys, framework-neutral.

The architecture (mlcommons/training retired_benchmarks/ssd-v1 ssd300.py): torchvision's
ResNet-34 through layer3, with layer3's first block at stride 1 (38x38x256 at 300x300); five
extra layers, each a 1x1 conv then a 3x3 conv (bias, ReLU, no batch norm), the first three at
stride 2 with padding 1 and the last two unpadded (19, 10, 5, 3, 1); on each of the six maps a
3x3 box head (4 coordinates) and a 3x3 class head (81 classes, background 0) per anchor.
Both jax_model.py and tf_model.py build from `feature_maps(cfg)` and `extra_layers(cfg.model)`,
so their shapes cannot disagree. At the reference sizes: 19,972,534 parameters.
"""
import dataclasses
import math
import os

from harness import cadence, mesh, rules
from harness.config import TrainConfig, as_synthetic, in_range, key_of, one_of, positive
from harness.config_root import workload_config
from harness.errors import UsageError
from harness.workload import Metric, WorkloadSpec, by_name, from_module, is_synthetic
from workloads.optim import schedules
from workloads.optim.configs import SgdStepConfig

COCO_TRAIN_EXAMPLES = 117_266      # train2017 images with at least one box (reference count)
COCO_EVAL_EXAMPLES = 4_952         # val2017 images with a box: the reference's COCODetection
                                   # drops the 48 without (ssd-v1 utils.py), eval included

BOX_MAP = Metric("box_map", "COCO box mAP@[.50:.95], a fraction")


@dataclasses.dataclass
class ModelConfig:
  backbone_blocks: tuple[int, ...] = (3, 4, 6)   # basic blocks of ResNet-34's layer1..layer3
  backbone_width: int = 64                       # layer1's channels (x2 per later layer)
  extra_middle: tuple[int, ...] = (256, 256, 128, 128, 128)   # each extra layer's 1x1 conv
  extra_out: tuple[int, ...] = (512, 512, 256, 256, 256)      # its 3x3 conv (a new feature map)
  extra_strides: tuple[int, ...] = (2, 2, 2, 1, 1)   # stride 2: padding 1; stride 1: none
  anchors_per_location: tuple[int, ...] = (4, 6, 6, 6, 4, 4)  # 4: ratios {2}; 6: {2, 3}
  anchor_scales: tuple[float, ...] = (21, 45, 99, 153, 207, 261, 315)   # pixels, one more
  anchor_steps: tuple[float, ...] = (8, 16, 32, 64, 100, 300)           # than the maps
  num_classes: int = 81                          # background (0) + COCO's 80
  bn_momentum: float = 0.9                       # torch's 0.1 of the new value
  backbone_checkpoint: str = ""    # ImageNet ResNet-34 weights (.npz, torchvision names) in
                                   # --data-dir; "" starts the backbone from scratch

  def validate(self):
    positive(self, "backbone_width", "num_classes")
    if not self.backbone_blocks or min(self.backbone_blocks) < 1:
      raise UsageError(f"{key_of(self, 'backbone_blocks')}={self.backbone_blocks!r} is out of "
                       "range; allowed: one or more positive block counts, e.g. 3,4,6")
    n = len(self.extra_out)
    if len(self.extra_middle) != n or len(self.extra_strides) != n:
      raise UsageError(f"{key_of(self, 'extra_middle')}, extra_out and extra_strides have "
                       f"{len(self.extra_middle)}, {n}, {len(self.extra_strides)} entries; "
                       "allowed: one per extra layer")
    if not set(self.extra_strides) <= {1, 2}:
      raise UsageError(f"{key_of(self, 'extra_strides')}={self.extra_strides!r}; allowed: 1 or 2")
    if not set(self.anchors_per_location) <= {4, 6}:
      raise UsageError(f"{key_of(self, 'anchors_per_location')}={self.anchors_per_location!r};"
                       " allowed: 4 (aspect ratio 2) or 6 (ratios 2 and 3) per map")
    maps = n + 1
    for field, want in (("anchors_per_location", maps), ("anchor_steps", maps),
                        ("anchor_scales", maps + 1)):
      if len(getattr(self, field)) != want:
        raise UsageError(f"{key_of(self, field)} has {len(getattr(self, field))} entries; "
                         f"allowed: {want} ({maps} feature maps)")
    in_range(self, "bn_momentum", 0.0, 0.9999)


@dataclasses.dataclass
class DataConfig:
  source: str = "coco2017"         # coco2017 (tfds coco/2017) | mini (generated) | synthetic
  image_size: int = 300
  train_examples: int = COCO_TRAIN_EXAMPLES
  eval_examples: int = COCO_EVAL_EXAMPLES
  eval_batch_size: int = 256
  shuffle_buffer: int = 8192
  num_cropping_iterations: int = 1   # SSD random crop tries per IoU choice (logged max_samples)
  annotations: str = "annotations/instances_val2017.json"   # in --data-dir; rebuilt if absent
  mini_seed: int = 1234            # the mini set is fixed; the run seed only shuffles it
  mini_max_objects: int = 3        # shapes per generated image (1..this)
  mini_pixel_noise: float = 8.0    # Gaussian noise on the generated images

  def validate(self):
    one_of(self, "source", ("coco2017", "mini", "synthetic"))
    positive(self, "image_size", "train_examples", "eval_examples", "eval_batch_size",
             "shuffle_buffer", "mini_max_objects")
    in_range(self, "num_cropping_iterations", 1, 50)     # closed_ssd.yaml: max_samples 1..50
    in_range(self, "mini_pixel_noise", 0.0, None)


@workload_config
class SsdConfig:
  model: ModelConfig
  data: DataConfig
  optimizer: SgdStepConfig


# ----------------------------------------------------------------------------- geometry

def conv_out(size, kernel, stride, padding):
  return (size + 2 * padding - kernel) // stride + 1


def backbone_size(model: ModelConfig, image_size: int) -> int:
  """Rows of the backbone's output: 7x7/2 conv (pad 3), 3x3/2 max pool (pad 1), then one
  stride-2 3x3 (pad 1) per layer after layer1 except the last (layer3 at stride 1)."""
  return real_rows(image_size, model)[-1]


def backbone_channels(model: ModelConfig) -> int:
  return model.backbone_width * 2 ** (len(model.backbone_blocks) - 1)


def extra_layers(model: ModelConfig):
  """[(middle channels, out channels, stride, padding)] of the extra layers."""
  return [(m, o, s, 1 if s == 2 else 0) for m, o, s in
          zip(model.extra_middle, model.extra_out, model.extra_strides)]


def feature_maps(cfg) -> list[tuple[int, int]]:
  """[(rows, channels)] of the maps the heads read: the backbone's, then each extra layer's."""
  size = backbone_size(cfg.model, cfg.data.image_size)
  maps = [(size, backbone_channels(cfg.model))]
  for _, out, stride, padding in extra_layers(cfg.model):
    size = conv_out(size, 3, stride, padding)
    if size < 1:
      raise UsageError(f"data.image_size={cfg.data.image_size} leaves no rows for the extra "
                       f"layers (model.extra_strides={cfg.model.extra_strides}); allowed: a "
                       "larger image")
    maps.append((size, out))
  return maps


def num_anchors(cfg) -> int:
  return sum(s * s * k for (s, _), k in zip(feature_maps(cfg), cfg.model.anchors_per_location))


def anchor_geometry(cfg) -> dict:
  """What boxes.default_boxes needs: fig size, map sizes, steps, scales, aspect ratios."""
  m = cfg.model
  return dict(fig_size=cfg.data.image_size, feat_size=tuple(s for s, _ in feature_maps(cfg)),
              steps=tuple(m.anchor_steps), scales=tuple(m.anchor_scales),
              aspect_ratios=tuple((2,) if k == 4 else (2, 3) for k in m.anchors_per_location))


# ----------------------------------------------------------------------------- presets

def reference() -> SsdConfig:
  """The MLPerf reference recipe (ssd-v1 train.py) at global batch 1024 (the 1.0.0 RCP's
  smallest batch): SGD momentum 0.9, weight decay 5e-4, 2.5e-3 x batch/32, linear warmup,
  x0.1 at epochs 40 and 50; eval at the rules' epochs 40, 50, 55, ... 80; bf16."""
  rule = rules.load("ssd")
  train = TrainConfig(global_batch_size=1024, max_epochs=80, target=rule.target,
                      precision="bfloat16")
  return SsdConfig(model=ModelConfig(backbone_checkpoint="resnet34-333f7ec4.npz"),
                   data=DataConfig(num_cropping_iterations=50),
                   optimizer=SgdStepConfig(warmup_steps=300),
                   train=cadence.apply_rules(train, rule.eval_cadence))


def synthetic() -> SsdConfig:
  cfg = as_synthetic(reference(), global_batch_size=32)
  cfg.model.backbone_checkpoint = ""          # generated images: no backbone weights read
  return cfg


def mini() -> SsdConfig:
  """SSD at 1/4 width, one basic block per backbone layer, three extra layers, on 64x64
  generated images of coloured shapes (4 classes): maps 8, 4, 2, 1; anchors sized for shapes
  of 12-40 px. The reference's optimizer, warmup and x0.1 steps on a short schedule."""
  return SsdConfig(
      model=ModelConfig(backbone_blocks=(1, 1, 1), backbone_width=16,
                        extra_middle=(32, 32, 32), extra_out=(64, 64, 64),
                        extra_strides=(2, 2, 2), anchors_per_location=(4, 6, 6, 4),
                        anchor_scales=(8, 16, 28, 44, 64), anchor_steps=(8, 16, 32, 64),
                        num_classes=5),
      data=DataConfig(source="mini", image_size=64, train_examples=1536, eval_examples=256,
                      eval_batch_size=128, shuffle_buffer=2048, num_cropping_iterations=1),
      # boundaries the rules allow: 40 x (1 + k/10) and 50 x (1 + k/10), here k = -8
      optimizer=SgdStepConfig(base_learning_rate_per_32=0.02, warmup_steps=32,
                              decay_boundary_epochs=(8, 10)),
      train=TrainConfig(global_batch_size=64, max_epochs=12, eval_at_epochs=(6, 8, 10, 12),
                        target=0.35,
                        precision="float32"))


def tiny() -> SsdConfig:
  """Every code path at the smallest size (the contract test's)."""
  cfg = mini()
  cfg.model.backbone_width = 8
  cfg.model.extra_middle, cfg.model.extra_out = (8, 8, 8), (16, 16, 16)
  cfg.data.train_examples, cfg.data.eval_examples, cfg.data.eval_batch_size = 64, 24, 16
  cfg.data.shuffle_buffer = 64
  cfg.train.global_batch_size = 16
  cfg.train.max_epochs = 2
  cfg.train.eval_at_epochs = (1, 2)
  return cfg


def derive(cfg):
  """The learning rate follows the batch after --set (reference: 2.5e-3 x batch / 32)."""
  feature_maps(cfg)                      # a one-line error if the image is too small


def base_learning_rate(cfg) -> float:
  return cfg.optimizer.base_learning_rate_per_32 * cfg.train.global_batch_size / 32


def schedule_for(cfg, train_examples: int) -> schedules.WarmupStepSchedule:
  per_epoch = schedules.steps_per_epoch(train_examples, cfg.train.global_batch_size)
  opt = cfg.optimizer
  return schedules.WarmupStepSchedule(
      base_lr=base_learning_rate(cfg), warmup_steps=opt.warmup_steps,
      warmup_factor=opt.warmup_factor,
      boundaries=tuple(int(round(e * per_epoch)) for e in opt.decay_boundary_epochs),
      decay_factor=opt.decay_factor)


def batch_layout(cfg, batch_size: int, with_mask: bool = False) -> dict:
  """Train batches carry each anchor's encoded box and class (targets assigned in the input
  pipeline); eval batches carry what COCO needs to map detections back to the image."""
  size, anchors = cfg.data.image_size, num_anchors(cfg)
  layout = {"image": ((batch_size, size, size, 3), "float32",
                      ("batch", "height", "width", "channels"))}
  if not with_mask:
    layout["boxes"] = ((batch_size, anchors, 4), "float32", ("batch", None, None))
    layout["labels"] = ((batch_size, anchors), "int32", ("batch", None))
  else:
    layout["image_id"] = ((batch_size,), "int32", ("batch",))
    layout["image_size"] = ((batch_size, 2), "float32", ("batch", None))   # original h, w
    layout["mask"] = ((batch_size,), "float32", ("batch",))
  return layout


# Every parameter's logical axes (flax paths; Keras layer names are the same joined by '_').
PARAM_AXES = (
    (r".*/kernel", ("kernel_h", "kernel_w", "conv_in", "conv_out")),
    (r".*/(scale|bias)", ("channels",)),
)


def mllog_hyperparameters(cfg, train_examples: int) -> dict:
  """Every key closed_ssd.yaml (ruleset 1.0.0) requires, as the reference logs them."""
  opt = cfg.optimizer
  return {"opt_base_learning_rate": base_learning_rate(cfg),
          "opt_weight_decay": opt.weight_decay,
          "opt_learning_rate_warmup_steps": opt.warmup_steps,
          "opt_learning_rate_warmup_factor": opt.warmup_factor,
          "opt_learning_rate_decay_boundary_epochs": list(opt.decay_boundary_epochs),
          "max_samples": cfg.data.num_cropping_iterations,
          "gradient_accumulation_steps": 1}


def backbone_stride(model: ModelConfig) -> int:
  """The backbone's total stride: the 7x7/2 conv, the max pool and the stride-2 layers."""
  return 2 ** len(model.backbone_blocks)


def spatial_rows(cfg, spatial: int) -> int:
  """Image rows under TF's spatial partitioning: the image's, padded at the bottom (with zeros)
  to a multiple of spatial x the backbone's stride, so that every backbone level splits into
  equal slabs (300 -> 304 at spatial=2: 152, 76, 38 rows; 150, 75, 38 real), as Google's v0.7
  SSD padded its image. The model zeroes each level's rows past the real image's extent and
  leaves them out of batch norm's statistics, so the result equals the unpadded image's."""
  unit = spatial * backbone_stride(cfg.model)
  return -(-cfg.data.image_size // unit) * unit


def real_rows(image_size: int, model: ModelConfig) -> list[int]:
  """The unpadded image's rows at each backbone level: after the 7x7/2 conv, after the max
  pool, then after each layer (what TF's padded slabs keep; the rest is zeroed)."""
  rows = [conv_out(image_size, 7, 2, 3)]
  rows.append(conv_out(rows[-1], 3, 2, 1))
  n = len(model.backbone_blocks)
  for i in range(n):
    rows.append(conv_out(rows[-1], 3, 2, 1) if 0 < i < n - 1 else rows[-1])
  return rows


def missing_data(cfg, data_dir) -> list[str]:
  missing = []
  if cfg.data.source == "coco2017" and not os.path.isdir(os.path.join(data_dir, "coco")):
    missing.append("coco/2017/")
  ckpt = cfg.model.backbone_checkpoint
  if not is_synthetic(cfg) and ckpt and not os.path.exists(os.path.join(data_dir, ckpt)):
    missing.append(ckpt)
  return missing


SPEC = WorkloadSpec(
    name="ssd",
    title="SSD300-ResNet34 on COCO 2017",
    metric=BOX_MAP,
    presets=by_name(mini, reference, synthetic, tiny),
    bn_span=mesh.run_bn_span,
    mesh_axes=("data", "spatial"),
    split_dims=lambda cfg: {"height": cfg.data.image_size},
    param_axes=PARAM_AXES,
    data_dir_contents=("a tensorflow-datasets data dir holding a prepared coco/2017/ (tfds "
                       "build coco/2017 --data_dir DIR) and the backbone's resnet34-333f7ec4.npz"),
    host_evaluator="host_eval.CocoEvaluator",
    **from_module(globals()),
)
