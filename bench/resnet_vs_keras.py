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
import argparse
import json
import os
import sys
import time

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
  trainer.init()
  trainer.train(1)                                     # first call: data setup, warm caches
  start = time.perf_counter()
  trainer.train(steps)
  return steps * batch / (time.perf_counter() - start)


def keras_peer(batch, image_size, steps):
  import keras
  import numpy as np
  model = keras.applications.ResNet50(weights=None, input_shape=(image_size, image_size, 3),
                                      classes=1000)
  model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=False),
                jit_compile=True)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(batch, image_size, image_size, 3)).astype("float32")
  y = rng.integers(0, 1000, batch)
  model.train_on_batch(x, y)                           # compile
  model.train_on_batch(x, y)
  start = time.perf_counter()
  for _ in range(steps):
    loss = model.train_on_batch(x, y)
  float(np.asarray(loss).ravel()[0])                   # sync
  return steps * batch / (time.perf_counter() - start)


def measure(kind, args):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  if kind == "keras-jax":
    env["KERAS_BACKEND"] = "jax"
  elif kind == "keras-tf":
    env["KERAS_BACKEND"] = "tensorflow"
  flags = ["--batch", str(args.batch), "--image-size", str(args.image_size),
           "--steps", str(args.steps)]
  return method.subprocess_rate(__file__, kind, flags, env)


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--image-size", type=int, default=224)
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--worker", choices=["ours-tf", "ours-jax", "keras-tf", "keras-jax"])
  method.add_repeats_arg(p)
  args = p.parse_args()
  if args.worker:
    if args.worker.startswith("ours"):
      value = ours(args.worker.split("-")[1], args.batch, args.image_size, args.steps)
    else:
      value = keras_peer(args.batch, args.image_size, args.steps)
    print(json.dumps({"samples_per_s": value}))
    return
  print(f"ResNet-50 training step, batch {args.batch}, {args.image_size}x{args.image_size}, "
        f"{args.steps} timed steps, float32")
  kinds = ("ours-tf", "keras-tf", "ours-jax", "keras-jax")
  values = method.interleaved({k: (lambda k=k: measure(k, args)) for k in kinds}, args.repeats)
  method.report(values, [("TF  (ours / keras.applications, TF backend)", "ours-tf", "keras-tf"),
                         ("JAX (ours / keras.applications, JAX backend)", "ours-jax",
                          "keras-jax")])


if __name__ == "__main__":
  main()
