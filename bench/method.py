"""The measuring method every bench script shares: ours and the peer interleaved.

A throughput measured once, or ours measured after the peer, picks up whatever else the machine
was doing at that moment (a ratio here once ranged 0.95-1.03 from run to run). So every script
runs R rounds; each round measures every side once, the order alternating between rounds
(forward, then reversed), and the ratio ours/peer is taken within each round, where both sides
saw the same machine. Printed: each side's median rate, and per pair the median ratio with its
min-max over the rounds. Plain Python: the sides may be in-process callables or subprocesses.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from harness.bench_table import COLUMNS     # the scripts put the repository on sys.path


def add_repeats_arg(parser, default=5):
  parser.add_argument("--repeats", type=int, default=default,
                      help=f"interleaved rounds of measurements (default {default})")


def interleaved(measures: dict, repeats: int, log=print, warmup_rounds=0) -> dict:
  """{name: [value per round]}: round r calls every measure once, forward when r is even and
  in reverse when odd, so no side always runs first (or last). The first `warmup_rounds`
  rounds run the same way and are dropped."""
  if repeats < 1:
    raise ValueError(f"--repeats {repeats}: allowed: an integer >= 1")
  names = list(measures)
  values = {name: [] for name in names}
  for r in range(warmup_rounds + repeats):
    for name in (names if r % 2 == 0 else names[::-1]):
      values[name].append(float(measures[name]()))
    if log:
      label = (f"warm-up {r + 1}/{warmup_rounds}" if r < warmup_rounds else
               f"round {r - warmup_rounds + 1}/{repeats}")
      log(f"  {label}: " + ", ".join(f"{n} {values[n][-1]:.4g}" for n in names))
  return {name: vs[warmup_rounds:] for name, vs in values.items()}


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


def backend_env(kind: str) -> dict:
  """The environment of a worker: KERAS_BACKEND for a peer on 'tf' or 'jax'."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  if kind.startswith("peer-"):
    env["KERAS_BACKEND"] = "jax" if kind == "peer-jax" else "tensorflow"
  return env


# ---------------------------------------------------------------- one side a process, kept alive
def serve(make):
  """A worker's side: `make()` -> (measure, flops_per_sample or None) builds and compiles once,
  and one measure runs untimed (a side's first timed call ran up to a third slower: buffers
  first allocated, caches cold); then every 'measure' line on stdin is answered with one JSON
  line {"samples_per_s": v}."""
  measure, flops = make()
  measure()
  print(json.dumps({"ready": True, "flops_per_sample": flops}), flush=True)
  for line in sys.stdin:
    if line.strip() != "measure":
      break
    print(json.dumps({"samples_per_s": float(measure())}), flush=True)


class Worker:
  """`python SCRIPT --worker KIND FLAGS` (its own process: Keras fixes its backend at import),
  kept alive between rounds so each side compiles once; measure() asks it for one timing."""

  def __init__(self, script: str, kind: str, flags, env):
    self.kind = kind
    self.stderr = tempfile.TemporaryFile("w+")       # a file: a full pipe would block the worker
    self.proc = subprocess.Popen([sys.executable, script, "--worker", kind, *flags],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=self.stderr, text=True, env=env)
    self.flops_per_sample = self._answer()["flops_per_sample"]

  def _answer(self) -> dict:
    for line in self.proc.stdout:
      if line.startswith("{"):
        return json.loads(line)
    self.proc.wait()
    self.stderr.seek(0)
    raise SystemExit(f"{self.kind} failed (exit {self.proc.returncode}):\n"
                     f"{self.stderr.read()[-3000:]}")

  def measure(self) -> float:
    self.proc.stdin.write("measure\n")
    self.proc.stdin.flush()
    return self._answer()["samples_per_s"]

  def close(self):
    if self.proc.poll() is None:
      self.proc.stdin.close()
      self.proc.wait()
    self.stderr.close()


# ---------------------------------------------------------------- what a side measures
def timed(step, sync, batch: int, steps: int):
  """() -> samples/s of `steps` calls of step(), synced once at the end by sync(last output)."""
  def measure():
    start = time.perf_counter()
    for _ in range(steps):
      out = step()
    sync(out)
    return steps * batch / (time.perf_counter() - start)
  return measure


def trainer_side(trainer, batch: int, steps: int):
  """One of our trainers on its synthetic data: -> (measure, model FLOPs per sample). The
  trainer is initialised and run once (data setup, warm caches); a measure is one
  trainer.train(steps), one host sync. FLOPs: `describe`'s model_flops_per_example (TF: 3 x
  the forward matmuls and convs of the traced train step, tf_flops.model_flops), None on JAX
  (its describe has XLA's whole-program count instead)."""
  trainer.init()
  trainer.train(1)
  flops = trainer.describe().model_flops_per_example
  def measure():
    start = time.perf_counter()
    trainer.train(steps)                               # returns after its one host sync
    return steps * batch / (time.perf_counter() - start)
  return measure, (float(flops) if flops and flops == flops else None)


def keras_side(model, x, y, batch: int, steps: int, sample_weight=None, train_on_batch=None):
  """A compiled Keras model's own train step (train_on_batch) on one fixed batch:
  -> (measure, FLOPs per sample). The model is compiled by the caller (jit_compile=True) and
  stepped twice before timing. FLOPs are counted as ours are (tf_flops.model_flops of Keras'
  train_step traced), on the TF backend only (None on JAX: the models are the same on both
  backends)."""
  import numpy as np
  step = train_on_batch or (lambda: model.train_on_batch(x, y, sample_weight=sample_weight))
  step()                                                # compile
  step()
  sync = lambda out: float(np.asarray(out).ravel()[0])  # noqa: E731
  flops = None
  if os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow":
    data = (x, y) if sample_weight is None else (x, y, sample_weight)
    flops = keras_step_flops(model, data) / batch
  return timed(step, sync, batch, steps), flops


def keras_step_flops(model, data) -> float:
  """Model FLOPs of one Keras train step on `data`, counted as ours are
  (workloads/parallel/tf_flops.model_flops: 3 x the forward matmuls and convs)."""
  import tensorflow as tf
  from workloads.parallel.tf_flops import model_flops
  spec = lambda a: tf.TensorSpec(np.shape(a), tf.as_dtype(np.asarray(a).dtype))  # noqa: E731
  specs = tf.nest.map_structure(spec, data)
  return model_flops(tf.function(model.train_step).get_concrete_function(specs).graph)


def keras_image_side(model, optimizer, batch: int, image_size: int, classes: int, steps: int):
  """An image classifier's Keras side: sparse cross entropy on softmax outputs, one fixed
  random batch (float32 images, integer labels)."""
  import keras
  model.compile(optimizer=optimizer,
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=False),
                jit_compile=True)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(batch, image_size, image_size, 3)).astype("float32")
  y = rng.integers(0, classes, batch)
  return keras_side(model, x, y, batch, steps)


# ---------------------------------------------------------------- a peer comparison
# The table's columns: harness/bench_table.py (bench/all.py writes them as CSV; `report --bench`
# draws them). A row
# compares ours with the peer on one framework ('tf', 'jax'), or ours on TF with ours on JAX
# ('tf/jax'); GFLOP columns: model FLOPs per sample, counted on each side from one traced TF
# train step (tf_flops.model_flops); model_flop_ratio = ratio_median x ours / peer GFLOP.
FRAMEWORKS = ("tf", "jax")


def bench_args(bench, argv=None, worker=True):
  """The arguments of a bench module: its own (bench.add_args), --repeats, --frameworks, and
  --worker for the processes it starts."""
  p = argparse.ArgumentParser(description=bench.__doc__.split("\n\n")[0])
  bench.add_args(p)
  own = [a.dest for a in p._actions if a.dest != "help"]          # what a worker is given
  add_repeats_arg(p)
  p.add_argument("--frameworks", default="tf,jax",
                 help="comma-separated, of tf and jax (default both)")
  if worker:
    p.add_argument("--worker", choices=[f"{s}-{f}" for s in ("ours", "peer") for f in FRAMEWORKS])
  args = p.parse_args(argv)
  frameworks = args.frameworks.split(",")
  bad = [f for f in frameworks if f not in FRAMEWORKS]
  if bad or not frameworks:
    p.error(f"--frameworks {args.frameworks}: allowed: tf, jax or tf,jax")
  args.frameworks = [f for f in FRAMEWORKS if f in frameworks]
  if hasattr(bench, "check_args"):
    bench.check_args(p, args)
  args.own_flags = [f"--{d.replace('_', '-')}={getattr(args, d)}" for d in own]
  return args


# Rounds run and dropped before the measured ones, once every side's worker is up: the first
# rounds after the workers' start ran up to 15% slower on both sides alike, for 2-3 rounds.
WARMUP_ROUNDS = 2


def compare(bench, script: str, args, log=print) -> list:
  """Ours against the peer on each of args.frameworks, each side its own kept-alive worker
  process, interleaved over args.repeats rounds after WARMUP_ROUNDS dropped ones: -> the
  table's rows (COLUMNS)."""
  kinds = [f"{s}-{f}" for f in args.frameworks for s in ("ours", "peer")]
  say = log or (lambda line: None)
  workers = {}
  try:
    for kind in kinds:                  # one after another: a compile has the machine to itself
      say(f"  starting {kind} ...")
      workers[kind] = Worker(script, kind, args.own_flags, backend_env(kind))
    values = interleaved({k: w.measure for k, w in workers.items()}, args.repeats, log=log,
                          warmup_rounds=WARMUP_ROUNDS)
  finally:
    for w in workers.values():
      w.close()
  flops = {s: next((workers[f"{s}-{f}"].flops_per_sample for f in args.frameworks
                    if workers[f"{s}-{f}"].flops_per_sample), None) for s in ("ours", "peer")}
  gflop = {s: flops[s] / 1e9 if flops[s] else None for s in flops}

  def row(framework, ours, peer, peer_name, peer_gflop):
    median, low, high = summary(ratios(values, ours, peer))
    flop_ratio = (median * gflop["ours"] / peer_gflop if gflop["ours"] and peer_gflop else None)
    return {"workload": bench.WORKLOAD, "framework": framework,
            "ours_samples_per_s": statistics.median(values[ours]), "peer": peer_name,
            "peer_samples_per_s": statistics.median(values[peer]), "ratio_median": median,
            "ratio_min": low, "ratio_max": high, "ours_gflop_per_sample": gflop["ours"],
            "peer_gflop_per_sample": peer_gflop, "model_flop_ratio": flop_ratio, "mfu": None}

  rows = [row(f, f"ours-{f}", f"peer-{f}", bench.peer_name(args), gflop["peer"])
          for f in args.frameworks]
  if len(args.frameworks) == 2:
    rows.append(row("tf/jax", "ours-tf", "ours-jax", "ours (JAX)", gflop["ours"]))
  return rows


def fmt(value, spec):
  return "" if value is None or value != value else format(value, spec)


def table(rows) -> str:
  """The rows as a fixed-width text table."""
  lines = [f"{'workload':13s} {'framework':9s} {'ours/s':>9s} {'peer/s':>9s} "
           f"{'ratio median [min, max]':>25s} {'GFLOP ours':>10s} {'GFLOP peer':>10s} "
           f"{'FLOP ratio':>10s}  peer"]
  for r in rows:
    interval = (f"{r['ratio_median']:.3f} [{r['ratio_min']:.3f}, {r['ratio_max']:.3f}]"
                if r["ratio_median"] is not None else "")
    lines.append(f"{r['workload']:13s} {r['framework']:9s} "
                 f"{fmt(r['ours_samples_per_s'], '9.2f'):>9s} "
                 f"{fmt(r['peer_samples_per_s'], '9.2f'):>9s} {interval:>25s} "
                 f"{fmt(r['ours_gflop_per_sample'], '10.3f'):>10s} "
                 f"{fmt(r['peer_gflop_per_sample'], '10.3f'):>10s} "
                 f"{fmt(r['model_flop_ratio'], '10.3f'):>10s}  {r['peer'] or ''}"
                 + (f"  MFU {r['mfu']:.3f}" if r.get("mfu") is not None else ""))
  return "\n".join(lines)


def main(bench, script: str):
  """The command line of one `<model>_vs_<peer>.py` bench: a worker when --worker is given,
  else the interleaved comparison and its table."""
  args = bench_args(bench)
  if args.worker:
    side, framework = args.worker.split("-")
    serve(lambda: bench.ours(framework, args) if side == "ours" else bench.peer(args))
    return
  print(bench.title(args))
  print(table(compare(bench, script, args)))
