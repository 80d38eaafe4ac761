"""Training-step throughput of our ResNet-50 v1.5 against a Keras peer, same batch and image
size, each framework against the peer on the same Keras backend:

  ours (TF, Keras layers + XLA custom loop)  vs  the peer, TF backend, its compiled train step
  ours (JAX, flax + optax, jit)              vs  the peer, JAX backend, its compiled train step

The peer (--peer) is keras-hub's ResNetBackbone built as ResNet-50 v1.5 with a pooled dense
classifier (default): our architecture exactly (the stride on the 3x3 conv, symmetric padding
before strided convs, no conv biases; the same 25.6M parameters and model FLOPs), or
keras.applications.ResNet50, which is v1 (the stride on the first 1x1 conv: fewer FLOPs, so
compare it by the model-FLOP ratio). Both sides use SGD with momentum 0.9, float32, one fixed
synthetic batch, and are timed after compilation. Needs the bench extras for keras-hub:
pip install --no-deps -r bench/requirements.txt

  python bench/resnet_vs_keras.py [--batch 32] [--image-size 224] [--steps 10] [--repeats 5]
                                  [--peer keras-hub|applications] [--frameworks tf,jax]

Each side runs in its own process (Keras picks its backend at import), kept alive between the
--repeats interleaved rounds (bench/method.py); ratios are medians of per-round ratios with
their min-max; model FLOPs per sample are counted on both sides by TF's graph profiler.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import method  # noqa: E402  pylint: disable=wrong-import-position

WORKLOAD = "resnet50"
SMALL = ["--batch=16", "--image-size=64", "--steps=5"]       # bench/all.py's size


def add_args(p):
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--image-size", type=int, default=224)
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--peer", choices=["keras-hub", "applications"], default="keras-hub")


def peer_name(args):
  return ("keras-hub ResNetBackbone (v1.5)" if args.peer == "keras-hub"
          else "keras.applications.ResNet50 (v1)")


def title(args):
  return (f"ResNet-50 training step, batch {args.batch}, {args.image_size}x{args.image_size}, "
          f"{args.steps} timed steps, float32")


def ours(framework, args):
  from harness.workload import RunContext
  from workloads.resnet import spec
  cfg = spec.SPEC.configure("synthetic", [f"train.global_batch_size={args.batch}",
                                          f"data.image_size={args.image_size}",
                                          "optimizer.name=sgd", "train.precision=float32"])
  trainer = spec.SPEC.make_trainer(framework, cfg, RunContext(seed=0, preset="synthetic"))
  return method.trainer_side(trainer, args.batch, args.steps)


def peer(args):
  import keras
  shape = (args.image_size, args.image_size, 3)
  if args.peer == "applications":
    model = keras.applications.ResNet50(weights=None, input_shape=shape, classes=1000)
  else:
    import keras_hub
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[7],
        stackwise_num_filters=[64, 128, 256, 512], stackwise_num_blocks=[3, 4, 6, 3],
        stackwise_num_strides=[1, 2, 2, 2], block_type="bottleneck_block",
        use_pre_activation=False, image_shape=shape)
    inputs = keras.Input(shape)
    pooled = keras.layers.GlobalAveragePooling2D()(backbone(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1000, activation="softmax")(pooled))
  return method.keras_image_side(model, keras.optimizers.SGD(0.1, momentum=0.9), args.batch,
                                 args.image_size, 1000, args.steps)


if __name__ == "__main__":
  method.main(sys.modules[__name__], __file__)
