"""Training-step throughput of our SSD-ResNet34 against keras-hub's RetinaNetObjectDetector,
same batch and image size, each framework against keras-hub on the same backend:

  ours (TF, Keras layers + XLA custom loop)  vs  keras-hub RetinaNet, TF backend, fit step
  ours (JAX, flax + optax, jit)              vs  keras-hub RetinaNet, JAX backend, fit step

Both are one-stage, anchor-based detectors on a ResNet-34 (basic blocks 3, 4, 6, ...), trained
with SGD momentum 0.9 and weight decay 5e-4, float32, randomly initialised, on one fixed
synthetic batch (the peer: 4 random boxes an image), timed after compilation. What differs
(the ratio compares two detectors of one family, not one model in two frameworks), at 320 px:

  ours (MLPerf SSD, 20.0M parameters)       keras-hub RetinaNet (built here, 30.9M)
  ResNet-34 through layer3 (stride 1)       all of ResNet-34, FPN P3-P7 (256 channels)
  five extra conv layers: 6 maps 40..1      5 levels 40, 20, 10, 5, 3
  4 or 6 anchors a location: 9,590          9 (3 scales x 3 ratios): 19,206
  one 3x3 conv a map for boxes, one for     four 3x3x256 convs + an output conv, for boxes
    81 classes (background 0)                 and for 80 classes (sigmoid, no background)
  softmax CE, 3:1 hard-negative mining,     sigmoid focal loss on every anchor,
    smooth L1 on positives                    Huber on positives
  targets assigned in the input pipeline    boxes matched to anchors (IoU) inside the step

It is still the closest peer: the MLPerf SSD has no maintained Keras or flax implementation
(AlgoPerf has no detection workload); keras-hub has no SSD (its detectors: RetinaNet and
D-FINE, a DETR-style transformer); keras-cv (last release 0.9.0, 2024-04, no longer developed
in favour of keras-hub) never released one (its detectors were RetinaNet and YOLOV8).
keras-hub's RetinaNet runs on both backends, its ResNet built as ResNet-34 here. The
reference's 300 px does not fit the FPN (it adds 2x-upsampled maps, so the image must be a
multiple of 32) and ours needs >= 257 px, so the size is a multiple of 32 from 288 (default
320; our anchor steps and scales keep the reference's pixels). Each measurement runs in its
own process (Keras picks its backend at import). Needs the bench extras:
pip install --no-deps -r bench/requirements.txt

  python bench/ssd_vs_keras_hub.py [--batch 32] [--image-size 320] [--steps 10] [--repeats 5]
                                   [--frameworks tf,jax]

Each side runs in its own process, kept alive between the --repeats interleaved rounds
(bench/method.py); ratios are medians of per-round ratios with their min-max; model FLOPs per
sample are counted on both sides by TF's graph profiler (the peer's count includes its
in-step box matching).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import method  # noqa: E402  pylint: disable=wrong-import-position

BOXES_PER_IMAGE = 4
WORKLOAD = "ssd"
SMALL = ["--batch=4", "--image-size=288", "--steps=3"]       # bench/all.py's size


def add_args(p):
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--image-size", type=int, default=320)
  p.add_argument("--steps", type=int, default=10)


def check_args(p, args):
  if args.image_size % 32 or args.image_size < 288:
    p.error(f"--image-size {args.image_size}: allowed: a multiple of 32 from 288 (keras-hub's "
            "FPN halves the image 5 times exactly; our extra layers need >= 257 px)")


def peer_name(args):
  return "keras-hub RetinaNet-ResNet34-FPN (another detector)"


def title(args):
  return (f"SSD-ResNet34 vs keras-hub RetinaNet-ResNet34-FPN training step, batch {args.batch}, "
          f"{args.image_size}x{args.image_size}, {args.steps} timed steps, float32")


def ours(framework, args):
  from harness.workload import RunContext
  from workloads.ssd import spec
  cfg = spec.SPEC.configure("synthetic", [f"train.global_batch_size={args.batch}",
                                          f"data.image_size={args.image_size}",
                                          "train.precision=float32"])
  trainer = spec.SPEC.make_trainer(framework, cfg, RunContext(seed=0, preset="synthetic"))
  return method.trainer_side(trainer, args.batch, args.steps)


def random_boxes(rng, batch, size):
  """{"boxes": (batch, n, 4) yxyx in pixels, "labels": (batch, n) in 0..79}: what keras-hub's
  compute_loss hands its label encoder (label -1 would mark padding; every box here is real)."""
  import numpy as np
  corner = rng.uniform(0, 0.7 * size, (batch, BOXES_PER_IMAGE, 2))
  extent = rng.uniform(0.1 * size, 0.3 * size, (batch, BOXES_PER_IMAGE, 2))
  return {"boxes": np.concatenate([corner, corner + extent], -1).astype("float32"),
          "labels": rng.integers(0, 80, (batch, BOXES_PER_IMAGE)).astype("int32")}


def peer(args):
  import keras
  import keras_hub
  import numpy as np
  batch, size = args.batch, args.image_size
  shape = (size, size, 3)
  resnet34 = keras_hub.models.ResNetBackbone(
      input_conv_filters=[64], input_conv_kernel_sizes=[7],
      stackwise_num_filters=[64, 128, 256, 512], stackwise_num_blocks=[3, 4, 6, 3],
      stackwise_num_strides=[1, 2, 2, 2], block_type="basic_block", image_shape=shape)
  backbone = keras_hub.models.RetinaNetBackbone(resnet34, min_level=3, max_level=7,
                                                use_p5=False, image_shape=shape)
  model = keras_hub.models.RetinaNetObjectDetector(backbone, num_classes=80,
                                                   bounding_box_format="yxyx")
  model.compile(optimizer=keras.optimizers.SGD(2.5e-3 * batch / 32, momentum=0.9,
                                               weight_decay=5e-4),
                jit_compile=True)       # losses: its defaults, Huber + BinaryFocalCrossentropy
  rng = np.random.default_rng(0)
  x = rng.normal(size=(batch, *shape)).astype("float32")
  y = random_boxes(rng, batch, size)
  # keras.Model's train_on_batch: keras-hub's override (PipelineModel) passes y through
  # ops.convert_to_tensor, which rejects the {"boxes", "labels"} dict that fit() and
  # compute_loss take; with no preprocessor it adds nothing else.
  step = lambda: keras.Model.train_on_batch(model, x, y)   # noqa: E731
  return method.keras_side(model, x, y, batch, args.steps, train_on_batch=step)


if __name__ == "__main__":
  method.main(sys.modules[__name__], __file__)
