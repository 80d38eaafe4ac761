"""The measuring method every bench script shares: ours and the peer interleaved.

A throughput measured once, or ours measured after the peer, picks up whatever else the machine
was doing at that moment (a ratio here once ranged 0.95-1.03 from run to run). So every script
runs R rounds; each round measures every side once, the order alternating between rounds
(forward, then reversed), and the ratio ours/peer is taken within each round, where both sides
saw the same machine. Printed: each side's median rate, and per pair the median ratio with its
min-max over the rounds. Plain Python: the sides may be in-process callables or subprocesses.
"""
import json
import statistics
import subprocess
import sys
import time


def add_repeats_arg(parser, default=5):
  parser.add_argument("--repeats", type=int, default=default,
                      help=f"interleaved rounds of measurements (default {default})")


def interleaved(measures: dict, repeats: int, log=print) -> dict:
  """{name: [value per round]}: round r calls every measure once, forward when r is even and
  in reverse when odd, so no side always runs first (or last)."""
  if repeats < 1:
    raise ValueError(f"--repeats {repeats}: allowed: an integer >= 1")
  names = list(measures)
  values = {name: [] for name in names}
  for r in range(repeats):
    for name in (names if r % 2 == 0 else names[::-1]):
      values[name].append(float(measures[name]()))
    if log:
      log(f"  round {r + 1}/{repeats}: " + ", ".join(f"{n} {values[n][-1]:.4g}" for n in names))
  return values


def ratios(values: dict, ours: str, peer: str) -> list:
  """ours / peer within each round."""
  return [a / b for a, b in zip(values[ours], values[peer])]


def summary(rs) -> tuple:
  """(median, min, max) of per-round ratios."""
  return statistics.median(rs), min(rs), max(rs)


def ratio_line(label: str, rs) -> str:
  median, low, high = summary(rs)
  return (f"ratio {label}: median {median:.3f} [min {low:.3f}, max {high:.3f}] over "
          f"{len(rs)} interleaved rounds")


def report(values: dict, pairs, unit="samples/s", out=print):
  """Prints each side's median and one ratio line per (label, ours, peer) pair."""
  for name, vs in values.items():
    out(f"  {name:16s} median {statistics.median(vs):10.3f} {unit}")
  for label, ours, peer in pairs:
    out(ratio_line(label, ratios(values, ours, peer)))


def subprocess_rate(script: str, worker: str, flags, env) -> float:
  """Runs `python SCRIPT --worker WORKER FLAGS` (its own process: Keras fixes its backend at
  import) and returns the samples_per_s of the JSON line it prints last."""
  proc = subprocess.run([sys.executable, script, "--worker", worker, *flags],
                        capture_output=True, text=True, env=env)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
  if proc.returncode or not lines:
    raise SystemExit(f"{worker} failed:\n{proc.stderr[-2000:]}")
  return json.loads(lines[-1])["samples_per_s"]


def backend_env(kind: str) -> dict:
  """The environment of a worker: KERAS_BACKEND for 'keras-jax' / 'keras-tf' peers."""
  import os
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  if kind == "keras-jax":
    env["KERAS_BACKEND"] = "jax"
  elif kind == "keras-tf":
    env["KERAS_BACKEND"] = "tensorflow"
  return env


def keras_train_rate(model, optimizer, batch: int, image_size: int, classes: int,
                     steps: int) -> float:
  """Samples/s of Keras' own compiled train step (train_on_batch, jit_compile) on one fixed
  random batch, timed after two warm-up steps, synced once at the end."""
  import keras
  import numpy as np
  model.compile(optimizer=optimizer,
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=False),
                jit_compile=True)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(batch, image_size, image_size, 3)).astype("float32")
  y = rng.integers(0, classes, batch)
  model.train_on_batch(x, y)                           # compile
  model.train_on_batch(x, y)
  start = time.perf_counter()
  for _ in range(steps):
    loss = model.train_on_batch(x, y)
  float(np.asarray(loss).ravel()[0])                   # sync
  return steps * batch / (time.perf_counter() - start)


def trainer_rate(trainer, batch: int, steps: int) -> float:
  """Samples/s of one of our trainers on its synthetic data, timed after init and one call."""
  trainer.init()
  trainer.train(1)                                     # first call: data setup, warm caches
  start = time.perf_counter()
  trainer.train(steps)                                 # returns after its one host sync
  return steps * batch / (time.perf_counter() - start)


def vs_keras_main(script: str, doc: str, model_name: str, ours, keras_peer):
  """The command line of a `<model>_vs_keras.py` bench: four sides, ours and the
  keras.applications peer on each backend, each in its own process (`--worker`), interleaved;
  ours(framework, batch, image_size, steps) and keras_peer(batch, image_size, steps) return
  samples/s."""
  import argparse
  p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--image-size", type=int, default=224)
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--worker", choices=["ours-tf", "ours-jax", "keras-tf", "keras-jax"])
  add_repeats_arg(p)
  args = p.parse_args()
  if args.worker:
    if args.worker.startswith("ours"):
      value = ours(args.worker.split("-")[1], args.batch, args.image_size, args.steps)
    else:
      value = keras_peer(args.batch, args.image_size, args.steps)
    print(json.dumps({"samples_per_s": value}))
    return
  print(f"{model_name} training step, batch {args.batch}, {args.image_size}x{args.image_size}, "
        f"{args.steps} timed steps, float32")
  flags = ["--batch", str(args.batch), "--image-size", str(args.image_size),
           "--steps", str(args.steps)]
  kinds = ("ours-tf", "keras-tf", "ours-jax", "keras-jax")
  values = interleaved({k: (lambda k=k: subprocess_rate(script, k, flags, backend_env(k)))
                        for k in kinds}, args.repeats)
  report(values, [("TF  (ours / keras.applications, TF backend)", "ours-tf", "keras-tf"),
                  ("JAX (ours / keras.applications, JAX backend)", "ours-jax", "keras-jax")])
