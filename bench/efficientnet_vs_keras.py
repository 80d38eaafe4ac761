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

The four measurements run in their own processes (Keras picks its backend at import),
interleaved over --repeats rounds (bench/method.py); the ratios are medians of per-round
ratios, with their min-max.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import method  # noqa: E402  pylint: disable=wrong-import-position


def ours(framework, batch, image_size, steps):
  from harness.workload import RunContext
  from workloads.efficientnet import spec
  cfg = spec.SPEC.configure("synthetic", [f"train.global_batch_size={batch}",
                                          f"data.image_size={image_size}",
                                          "train.precision=float32"])
  trainer = spec.SPEC.make_trainer(framework, cfg, RunContext(seed=0, preset="synthetic"))
  return method.trainer_rate(trainer, batch, steps)


def keras_peer(batch, image_size, steps):
  import keras
  model = keras.applications.EfficientNetB0(weights=None,
                                            input_shape=(image_size, image_size, 3),
                                            classes=1000)
  optimizer = keras.optimizers.RMSprop(0.016, rho=0.9, momentum=0.9, epsilon=1e-3,
                                       use_ema=True, ema_momentum=0.9999)
  return method.keras_train_rate(model, optimizer, batch, image_size, 1000, steps)


if __name__ == "__main__":
  method.vs_keras_main(__file__, __doc__, "EfficientNet-B0", ours, keras_peer)
