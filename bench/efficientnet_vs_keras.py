"""Training-step throughput of our EfficientNet-B0 against keras.applications.EfficientNetB0,
same batch and image size, each framework against the Keras model on the same backend:

  ours (TF, Keras layers + XLA custom loop)  vs  keras.applications.EfficientNetB0, TF backend
  ours (JAX, flax + optax, jit)              vs  keras.applications.EfficientNetB0, JAX backend

Both sides run the reference recipe's kind of step: RMSProp (rho 0.9, momentum 0.9, epsilon
1e-3) with a moving average of the weights updated every step (ours: tensorflow/tpu's EMA of
weights and batch-norm statistics; Keras: its optimizer's use_ema, weights only), dropout and
stochastic depth on, float32, synthetic device-resident data, timed after compilation. Keras'
model includes its input Rescaling/Normalization layers (a few elementwise ops).

  python bench/efficientnet_vs_keras.py [--batch 32] [--image-size 224] [--steps 10] [--repeats 5]
                                        [--frameworks tf,jax]

Each side runs in its own process (Keras picks its backend at import), kept alive between the
--repeats interleaved rounds (bench/method.py); ratios are medians of per-round ratios with
their min-max; model FLOPs per sample are counted on both sides by TF's graph profiler.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import method  # noqa: E402  pylint: disable=wrong-import-position


WORKLOAD = "efficientnet"
SMALL = ["--batch=8", "--image-size=64", "--steps=3"]        # bench/all.py's size


def add_args(p):
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--image-size", type=int, default=224)
  p.add_argument("--steps", type=int, default=10)


def peer_name(args):
  return "keras.applications.EfficientNetB0"


def title(args):
  return (f"EfficientNet-B0 training step, batch {args.batch}, "
          f"{args.image_size}x{args.image_size}, {args.steps} timed steps, float32")


def ours(framework, args):
  from harness.workload import RunContext
  from workloads.efficientnet import spec
  cfg = spec.SPEC.configure("synthetic", [f"train.global_batch_size={args.batch}",
                                          f"data.image_size={args.image_size}",
                                          "train.precision=float32"])
  trainer = spec.SPEC.make_trainer(framework, cfg, RunContext(seed=0, preset="synthetic"))
  return method.trainer_side(trainer, args.batch, args.steps)


def peer(args):
  import keras
  model = keras.applications.EfficientNetB0(
      weights=None, input_shape=(args.image_size, args.image_size, 3), classes=1000)
  optimizer = keras.optimizers.RMSprop(0.016, rho=0.9, momentum=0.9, epsilon=1e-3,
                                       use_ema=True, ema_momentum=0.9999)
  return method.keras_image_side(model, optimizer, args.batch, args.image_size, 1000,
                                 args.steps)


if __name__ == "__main__":
  method.main(sys.modules[__name__], __file__)
