"""Training-step throughput of our ResNet-50 against keras.applications.ResNet50, same batch and
image size, each framework against the Keras model on the same backend:

  ours (TF, Keras layers + XLA custom loop)  vs  keras.applications.ResNet50, TF backend, fit()
  ours (JAX, flax + optax, jit)              vs  keras.applications.ResNet50, JAX backend, fit()

Each measurement runs in its own process (Keras picks its backend at import). Both sides use
SGD with momentum, float32, synthetic device-resident data, and are timed after compilation.

  python bench/resnet_vs_keras.py [--batch 32] [--image-size 224] [--steps 10] [--repeats 5]

The four measurements are interleaved over --repeats rounds (bench/method.py); the ratios are
medians of per-round ratios, with their min-max.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import method  # noqa: E402  pylint: disable=wrong-import-position


def ours(framework, batch, image_size, steps):
  from harness.workload import RunContext
  from workloads.resnet import spec
  cfg = spec.SPEC.configure("synthetic", [f"train.global_batch_size={batch}",
                                          f"data.image_size={image_size}", "optimizer.name=sgd",
                                          "train.precision=float32"])
  trainer = spec.SPEC.make_trainer(framework, cfg, RunContext(seed=0, preset="synthetic"))
  return method.trainer_rate(trainer, batch, steps)


def keras_peer(batch, image_size, steps):
  import keras
  model = keras.applications.ResNet50(weights=None, input_shape=(image_size, image_size, 3),
                                      classes=1000)
  return method.keras_train_rate(model, keras.optimizers.SGD(0.1, momentum=0.9), batch,
                                 image_size, 1000, steps)


if __name__ == "__main__":
  method.vs_keras_main(__file__, __doc__, "ResNet-50", ours, keras_peer)
