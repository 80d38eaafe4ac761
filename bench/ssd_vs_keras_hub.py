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

The four measurements are interleaved over --repeats rounds (bench/method.py); the ratios are
medians of per-round ratios, with their min-max.
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import method  # noqa: E402  pylint: disable=wrong-import-position

BOXES_PER_IMAGE = 4


def ours(framework, batch, size, steps):
  from harness.workload import RunContext
  from workloads.ssd import spec
  cfg = spec.SPEC.configure("synthetic", [f"train.global_batch_size={batch}",
                                          f"data.image_size={size}", "train.precision=float32"])
  trainer = spec.SPEC.make_trainer(framework, cfg, RunContext(seed=0, preset="synthetic"))
  return method.trainer_rate(trainer, batch, steps)


def random_boxes(rng, batch, size):
  """{"boxes": (batch, n, 4) yxyx in pixels, "labels": (batch, n) in 0..79}: what keras-hub's
  compute_loss hands its label encoder (label -1 would mark padding; every box here is real)."""
  import numpy as np
  corner = rng.uniform(0, 0.7 * size, (batch, BOXES_PER_IMAGE, 2))
  extent = rng.uniform(0.1 * size, 0.3 * size, (batch, BOXES_PER_IMAGE, 2))
  return {"boxes": np.concatenate([corner, corner + extent], -1).astype("float32"),
          "labels": rng.integers(0, 80, (batch, BOXES_PER_IMAGE)).astype("int32")}


def keras_hub_peer(batch, size, steps):
  import keras
  import keras_hub
  import numpy as np
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
  step()                                                        # compile
  step()
  start = time.perf_counter()
  for _ in range(steps):
    loss = step()
  float(np.asarray(loss).ravel()[0])                            # sync
  return steps * batch / (time.perf_counter() - start)


def measure(kind, args):
  flags = [f"--batch={args.batch}", f"--image-size={args.image_size}", f"--steps={args.steps}"]
  return method.subprocess_rate(__file__, kind, flags,
                                method.backend_env(kind.replace("keras-hub", "keras")))


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--image-size", type=int, default=320)
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--worker", choices=["ours-tf", "ours-jax", "keras-hub-tf", "keras-hub-jax"])
  method.add_repeats_arg(p)
  args = p.parse_args()
  if args.image_size % 32 or args.image_size < 288:
    p.error(f"--image-size {args.image_size}: allowed: a multiple of 32 from 288 (keras-hub's "
            "FPN halves the image 5 times exactly; our extra layers need >= 257 px)")
  if args.worker:
    value = (ours(args.worker.split("-")[1], args.batch, args.image_size, args.steps)
             if args.worker.startswith("ours")
             else keras_hub_peer(args.batch, args.image_size, args.steps))
    print(json.dumps({"samples_per_s": value}))
    return
  print(f"SSD-ResNet34 vs keras-hub RetinaNet-ResNet34-FPN training step, batch {args.batch}, "
        f"{args.image_size}x{args.image_size}, {args.steps} timed steps, float32")
  kinds = ("ours-tf", "keras-hub-tf", "ours-jax", "keras-hub-jax")
  values = method.interleaved({k: (lambda k=k: measure(k, args)) for k in kinds}, args.repeats)
  method.report(values, [("TF  (ours / keras-hub RetinaNet, TF backend)", "ours-tf",
                          "keras-hub-tf"),
                         ("JAX (ours / keras-hub RetinaNet, JAX backend)", "ours-jax",
                          "keras-hub-jax")])


if __name__ == "__main__":
  main()
