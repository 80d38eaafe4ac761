"""Training-step throughput of our ResNet-50 against keras.applications.ResNet50, same batch and
image size, each framework against the Keras model on the same backend:

  ours (TF, Keras layers + XLA custom loop)  vs  keras.applications.ResNet50, TF backend, fit()
  ours (JAX, flax + optax, jit)              vs  keras.applications.ResNet50, JAX backend, fit()

Each measurement runs in its own process (Keras picks its backend at import). Both sides use
SGD with momentum, float32, synthetic device-resident data, and are timed after compilation.

  python bench/resnet_vs_keras.py [--batch 32] [--image-size 224] [--steps 10]
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ours(framework, batch, image_size, steps):
  sys.path.insert(0, ROOT)
  from harness import config
  from harness.workload import RunContext
  from workloads.resnet import spec
  cfg = spec.synthetic()
  config.apply_overrides(cfg, [f"train.global_batch_size={batch}", f"data.image_size={image_size}",
                               "optimizer.name=sgd", "train.precision=float32"])
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
  proc = subprocess.run([sys.executable, __file__, "--worker", kind, "--batch", str(args.batch),
                         "--image-size", str(args.image_size), "--steps", str(args.steps)],
                        capture_output=True, text=True, env=env)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
  if proc.returncode or not lines:
    raise SystemExit(f"{kind} failed:\n{proc.stderr[-2000:]}")
  return json.loads(lines[-1])["samples_per_s"]


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--image-size", type=int, default=224)
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--worker", choices=["ours-tf", "ours-jax", "keras-tf", "keras-jax"])
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
  rates = {kind: measure(kind, args) for kind in ("ours-tf", "keras-tf", "ours-jax", "keras-jax")}
  for kind, rate in rates.items():
    print(f"  {kind:10s} {rate:9.2f} samples/s")
  print(f"ratio TF  (ours / keras.applications, TF backend):  "
        f"{rates['ours-tf'] / rates['keras-tf']:.3f}")
  print(f"ratio JAX (ours / keras.applications, JAX backend): "
        f"{rates['ours-jax'] / rates['keras-jax']:.3f}")


if __name__ == "__main__":
  main()
