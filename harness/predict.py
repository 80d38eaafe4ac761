"""`predict`: the time to train on a system you do not have, from one measured result, and its
backtest on the MLPerf results (docs/simulator.md#predict-time-to-train-at-scale).

A prediction is five numbers multiplied out, each from a stated source:

  samples   to converge at the target's global batch B: the benchmark's RCP mean at B
            (mlperf_logging's reference convergence points; between two RCPs interpolated
            linearly, as its RCP checker interpolates; below the smallest, the smallest's),
            the range the RCP's spread gives (mean -+ one standard deviation); a benchmark or
            a round without RCPs: the measured runs' own, at their batch only, said so
  steps     ceil(samples / B)
  step      per chip: the measured run's steady step (its training time, evals excluded, over
            its steps), less the all-reduce the simulator exposes on the measured system, is
            the compute at the measured examples per chip b_s; at the target's b_t it is
            scaled by the examples and by a per-chip efficiency eff(b) = b / (b + b_half)
            (a fixed cost per step: a chip with few examples a step is less busy), then the
            gradient all-reduce on the target's topology (simulate's best algorithm on the
            machine preset) overlapped with the backward pass (commsim/step.py)
  evals     as many as the measured runs made per sample trained, times the samples to
            converge; each the measured eval's time scaled to the target's chips as a step is
  time      steps x step + evals x eval, in minutes, as MLPerf scores run_start..run_stop

Everything here is plain Python (numpy, the simulator, mlperf_logging's files): no framework.
"""
import dataclasses
import glob
import json
import math
import os
import re
import statistics

import numpy as np
from mlperf_logging import benchmark_meta
from mlperf_logging.compliance_checker import mlp_parser

from harness import summarize
from harness.commsim import machine as machine_lib, step as step_lib, tables
from harness.errors import UsageError

# The part of a step that does not shrink with the examples a chip computes (launches, the
# optimizer's update, batch-norm and loss reductions, the host loop), and of an eval (its
# start, the metric's reduction): one value for every benchmark and machine, stated, not
# fitted per family; the backtest (docs/simulator.md) shows what it gets right and wrong.
STEP_FIXED_S = 0.004
EVAL_FIXED_S = 0.2
GRADIENT_BYTES = 4                 # float32 gradients (the v0.7-v4.0 TPU and GPU submissions)
SPLIT_TENSORS = 64                 # the gradient spread evenly over this many tensors (buckets)

# The parameters a benchmark's gradient all-reduce moves (its model, as this harness builds
# it: docs/workloads/*.md). Benchmarks without one are refused by name.
PARAMETERS = {"resnet": 25_557_032, "bert": 336_226_108, "transformer": 210_804_736,
              "ssd": 19_972_534}
NO_MODEL = {"dlrm": "its embedding tables are model-parallel (no gradient all-reduce to "
                    "simulate), and DLRM (v0.7-v2.1) is not a workload here",
            "dlrm_dcnv2": "its embedding tables are model-parallel (no gradient all-reduce "
                          "to simulate)"}


@dataclasses.dataclass
class Run:
  minutes: float          # run_start .. run_stop
  samples: float          # trained until the last eval (samples to converge when converged)
  evals: int
  eval_s: float           # all evals together
  converged: bool


@dataclasses.dataclass
class Measured:
  """One measured result: a system's runs of one benchmark."""
  benchmark: str
  round: str              # "0.7", "" for this harness's CSV
  org: str
  system: str
  accelerator: str
  chips: int
  global_batch: int
  train_samples: int      # one epoch
  runs: list
  score_minutes: float | None    # the official summarizer's score (olympic mean)
  machine: str | None     # the simulator preset of its accelerator
  sample_unit: str = "epochs"    # what the RCPs count: epochs, or samples (BERT)
  parameters: int | None = None  # the model's own (a harness row); None: PARAMETERS's

  @property
  def per_chip(self) -> float:
    return self.global_batch / self.chips

  def converged(self):
    return [r for r in self.runs if r.converged] or self.runs


# ----------------------------------------------------------------------------- reading

def _value(line):
  return line.value.get("value") if isinstance(line.value, dict) else line.value


def _metadata(line):
  return (line.value.get("metadata") or {}) if isinstance(line.value, dict) else {}


def read_log(path, ruleset, train_samples_hint=0) -> tuple[Run, dict]:
  """A result log -> (Run, {global_batch, train_samples, benchmark}). Eval time: eval_start to
  eval_stop (or to its eval_accuracy where a log has no eval_stop)."""
  lines, _ = mlp_parser.parse_file(path, ruleset=ruleset)
  keys = {}
  start = stop = None
  evals, eval_s, open_eval, last_epoch, status, block_end = 0, 0.0, None, None, None, 0
  for line in lines:
    key = line.key
    if key in ("global_batch_size", "train_samples", "submission_benchmark") and key not in keys:
      keys[key] = _value(line)
    elif key == "run_start" and start is None:
      start = line.timestamp
    elif key == "run_stop" and stop is None:
      stop, status = line.timestamp, _metadata(line).get("status")
    elif key == "eval_start":
      open_eval = line.timestamp
    elif key in ("eval_stop", "eval_accuracy") and open_eval is not None:
      eval_s += (line.timestamp - open_eval) / 1000.0
      open_eval = None
      evals += 1
    if key == "eval_accuracy":
      last_epoch = _metadata(line).get("epoch_num", last_epoch)
    if key == "block_start":
      meta = _metadata(line)
      block_end = max(block_end, (meta.get("first_epoch_num") or 0) + (meta.get("epoch_count") or 0))
  if start is None or stop is None:
    raise UsageError(f"{path}: no run_start/run_stop; allowed: a complete MLPerf result log")
  if "global_batch_size" not in keys:
    raise UsageError(f"{path}: no global_batch_size; allowed: an MLPerf result log that logs it")
  keys["block_end"] = block_end
  return Run(minutes=(stop - start) / 60000.0, samples=float(last_epoch or 0), evals=evals,
             eval_s=eval_s, converged=status == "success"), keys


def machine_of(accelerator: str, system: str) -> str | None:
  """The simulator preset of an accelerator (system descriptions name it loosely: v0.7's TPU
  v4 systems say 'TPU')."""
  text = f"{accelerator} {system}".lower().replace("-", " ")
  for preset, words in (("tpu-v3", ("tpu v3",)), ("tpu-v4", ("tpu v4",)),
                        ("tpu-v5e", ("tpu v5e",)), ("dgx-a100", ("a100",)),
                        ("dgx-h100", ("h100",))):
    if any(w in text for w in words):
      return preset
  return None


def _sample_unit(benchmark):
  return "samples" if benchmark == "bert" else "epochs"


def read_mlperf(bench_dir, ruleset=None) -> Measured:
  """<org>/results/<system>/<benchmark>/ with its result_*.txt and <org>/systems/<system>.json."""
  bench_dir = os.path.abspath(bench_dir)
  files = sorted(glob.glob(os.path.join(bench_dir, "result_*.txt")))
  if not files:
    raise UsageError(f"{bench_dir}: no result_*.txt; allowed: an MLPerf result folder "
                     "<org>/results/<system>/<benchmark> with its logs")
  system_dir = os.path.dirname(bench_dir)
  org_dir = os.path.dirname(os.path.dirname(system_dir))
  system = os.path.basename(system_dir)
  desc_path = os.path.join(org_dir, "systems", f"{system}.json")
  if not os.path.isfile(desc_path):
    raise UsageError(f"{bench_dir}: no {desc_path}; allowed: the official layout with "
                     "<org>/systems/<system>.json")
  desc = read_system_json(desc_path)
  ruleset = summarize.ruleset_of(bench_dir, ruleset)
  runs, keys = [], {}
  for path in files:
    run, found = read_log(path, ruleset)
    if ruleset == "0.7.0" and os.path.basename(bench_dir) == "bert":
      # v0.7's BERT logs count steps (in epoch_num or in the blocks, one or the other)
      run.samples = max(run.samples, found["block_end"])
    runs.append(run)
    keys = keys or found
  benchmark = os.path.basename(bench_dir)
  gbs, epoch = int(keys["global_batch_size"]), int(keys.get("train_samples") or 0)
  unit = _sample_unit(benchmark)
  # samples trained: epochs x an epoch, or BERT's samples (v0.7's BERT logs counted steps)
  per = epoch if unit == "epochs" else gbs if ruleset == "0.7.0" else 1
  for run in runs:
    run.samples *= per or 1
  rows = summarize.summarize_mlperf(system_dir, ruleset)
  score = next((r["score_min"] for r in rows if r["benchmark"] == benchmark), None)
  return Measured(benchmark=benchmark, round=ruleset.rsplit(".", 1)[0],
                  org=os.path.basename(org_dir), system=system,
                  accelerator=desc["accelerator"], chips=desc["chips"], global_batch=gbs,
                  train_samples=epoch, runs=runs, score_minutes=score,
                  machine=machine_of(desc["accelerator"], system), sample_unit=unit)


SYSTEM_FIELDS = ("accelerator_model_name", "accelerators_per_node", "number_of_nodes")


def read_system_json(path) -> dict:
  """MLPerf's system description -> {accelerator, chips, nodes, per_node}; a missing field is
  one line naming it."""
  try:
    with open(path) as f:
      desc = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise UsageError(f"{path}: not a readable JSON system description ({e})") from None
  missing = [k for k in SYSTEM_FIELDS if str(desc.get(k, "")).strip() == ""]
  if missing:
    raise UsageError(f"{path}: missing {', '.join(missing)}; allowed: MLPerf's system "
                     f"description with {', '.join(SYSTEM_FIELDS)}")
  try:
    nodes, per = int(desc["number_of_nodes"]), int(desc["accelerators_per_node"])
  except ValueError:
    raise UsageError(f"{path}: number_of_nodes={desc['number_of_nodes']!r}, "
                     f"accelerators_per_node={desc['accelerators_per_node']!r}; allowed: "
                     "integers") from None
  return {"accelerator": desc["accelerator_model_name"], "chips": nodes * per,
          "nodes": nodes, "per_node": per, "system_name": desc.get("system_name", "")}


def read_harness_csv(path) -> Measured:
  """This harness's result CSV: its successful rows of one workload x framework x preset x
  device count, their logs (the log_path column)."""
  import pandas as pd                            # pylint: disable=import-outside-toplevel
  from harness import registry
  frame = pd.read_csv(path)
  frame = frame[frame["status"] == "success"]
  if frame.empty:
    raise UsageError(f"{path}: no successful run; allowed: a result CSV with a converged run")
  first = frame.iloc[0]
  frame = frame[(frame["workload"] == first["workload"]) & (frame["framework"] == first["framework"])
                & (frame["preset"] == first["preset"]) & (frame["num_devices"] == first["num_devices"])]
  spec = registry.get(first["workload"])
  from harness import rules
  ruleset = rules.load(spec.mlperf_benchmark).ruleset
  runs, keys = [], {}
  for log in frame["log_path"]:
    if not os.path.isfile(log):
      raise UsageError(f"{path}: its log {log} is missing; allowed: a CSV whose log_path "
                       "files exist")
    run, keys = read_log(log, ruleset)
    runs.append(run)
  benchmark = spec.mlperf_benchmark
  unit = _sample_unit(benchmark) if first["preset"] == "reference" else "epochs"
  epoch = int(keys.get("train_samples") or 0)
  for run in runs:
    run.samples = run.samples * (epoch or 1) if unit == "epochs" else run.samples
  minutes = sorted(r.minutes for r in runs)
  parameters = _harness_parameters(spec, first)
  score, _ = summarize.olympic_minutes(minutes, 0, summarize.drop_count(benchmark))
  return Measured(benchmark=benchmark, round="", org="this harness",
                  system=f"{first['system']} ({first['framework']}, {first['preset']})",
                  accelerator=str(first["device_kind"]), chips=int(first["num_devices"]),
                  global_batch=int(keys["global_batch_size"]), train_samples=epoch, runs=runs,
                  score_minutes=score, machine=machine_of(str(first["device_kind"]), ""),
                  sample_unit=unit if first["preset"] == "reference" else "mini",
                  parameters=parameters)


def _harness_parameters(spec, row) -> int:
  """The trainable parameters of the row's model (its preset, in its framework), counted from
  shapes by the framework (imported here only), as `simulate --workload` counts them."""
  from harness.workload import RunContext
  cfg = spec.configure(row["preset"])
  if hasattr(cfg.data, "init_checkpoint"):
    cfg.data.init_checkpoint = ""
  cfg.parallel.mesh = "data=1"                   # shapes only: any device count will do
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  trainer = spec.make_trainer(row["framework"], cfg, RunContext(seed=0, preset=row["preset"],
                                                               describing=True))
  return int(trainer.parameter_count())


def read_result(path, ruleset=None) -> Measured:
  if os.path.isfile(path) and path.endswith(".csv"):
    return read_harness_csv(path)
  if os.path.isdir(path):
    return read_mlperf(path, ruleset)
  raise UsageError(f"{path!r}: not a result; allowed: an MLPerf result folder "
                   "<org>/results/<system>/<benchmark> or a result CSV of this harness")


# ----------------------------------------------------------------------------- convergence

def _rcp_files(benchmark):
  """{ruleset: path} of mlperf_logging's RCP tables for a benchmark."""
  from mlperf_logging.rcp_checker import rcp_checker
  root = os.path.dirname(rcp_checker.__file__)
  out = {}
  for path in glob.glob(os.path.join(root, "training_*", f"rcps_{benchmark}.json")):
    out[os.path.basename(os.path.dirname(path))[len("training_"):]] = path
  return out


def _version(ruleset):
  return tuple(int(x) for x in ruleset.split("."))


def rcp_points(benchmark, ruleset) -> list[dict]:
  """[{bs, mean, stdev}] sorted by batch, as the RCP checker computes them: the olympic mean
  (dropping the fastest and slowest run; unet3d four of each) and the population standard
  deviation of every run."""
  path = _rcp_files(benchmark)[ruleset]
  with open(path) as f:
    raw = json.load(f)
  drop = 4 if benchmark == "unet3d" else 1
  points = []
  for record in raw.values():
    epochs = sorted(record.get("Epochs to converge") or record.get("samples to converge"))
    points.append({"bs": int(record["BS"]), "mean": float(np.mean(epochs[drop:len(epochs) - drop])),
                   "stdev": float(np.std(epochs))})
  return sorted(points, key=lambda p: p["bs"])


def rcp_ruleset(benchmark, ruleset) -> str | None:
  """The round's own RCPs, or, for a round before RCPs (v0.7), the first later round's for
  the same benchmark."""
  have = sorted(_rcp_files(benchmark), key=_version)
  if ruleset in have:
    return ruleset
  later = [r for r in have if _version(r) > _version(ruleset)]
  return later[0] if later else None


def rcp_at(points, bs) -> dict | None:
  """The RCP at `bs`: exact, interpolated between the nearest below and above (mean and
  stdev, linearly, as the checker's _create_interp_rcp), the smallest RCP below the range (a
  smaller batch converges no faster, the checker's rule), None above it."""
  for p in points:
    if p["bs"] == bs:
      return dict(p, how="RCP")
  below = [p for p in points if p["bs"] < bs]
  above = [p for p in points if p["bs"] > bs]
  if below and above:
    lo, hi = below[-1], above[0]
    return {"bs": bs, "how": f"RCPs {lo['bs']} and {hi['bs']} interpolated",
            "mean": float(np.interp(bs, [lo["bs"], hi["bs"]], [lo["mean"], hi["mean"]])),
            "stdev": float(np.interp(bs, [lo["bs"], hi["bs"]], [lo["stdev"], hi["stdev"]]))}
  if above:
    return dict(above[0], bs=bs, how=f"the smallest RCP ({above[0]['bs']})")
  return None


def convergence(measured: Measured, batch: int) -> dict:
  """Samples to converge at `batch`: {mean, low, high, source}; a one-line error when neither
  an RCP nor the measured runs give it."""
  unit = measured.sample_unit
  runs = measured.converged()
  measured_mean = statistics.mean(r.samples for r in runs)
  if unit != "mini":
    ruleset = rcp_ruleset(measured.benchmark, f"{measured.round}.0" if measured.round else "")
    if ruleset:
      point = rcp_at(rcp_points(measured.benchmark, ruleset), batch)
      if point is not None:
        scale = measured.train_samples if unit == "epochs" else 1
        mean, sd = point["mean"] * scale, point["stdev"] * scale
        own = "" if ruleset.startswith(measured.round) else f" (round {measured.round} has none)"
        return {"mean": mean, "low": mean - sd, "high": mean + sd,
                "source": f"{point['how']} at ruleset {ruleset}{own}: {point['mean']:.4g} "
                          f"{unit} -+ {point['stdev']:.3g}"}
  if batch == measured.global_batch or unit == "mini":
    spread = [r.samples for r in runs]
    if unit == "mini":
      return {"mean": measured_mean, "low": min(spread), "high": max(spread),
              "source": f"the measured runs' own ({len(runs)} runs at batch "
                        f"{measured.global_batch}; a mini preset has no RCP, and its samples "
                        "are assumed not to change with the batch)"}
    return {"mean": measured_mean, "low": min(spread), "high": max(spread),
            "source": f"the measured runs' own ({len(runs)} runs; no RCP covers "
                      f"{measured.benchmark} at batch {batch})"}
  raise UsageError(f"--batch {batch}: no RCP of {measured.benchmark} covers it and the "
                   f"measured runs are at batch {measured.global_batch}; allowed: "
                   f"--batch {measured.global_batch}" + _covered(measured))


def _covered(measured) -> str:
  ruleset = rcp_ruleset(measured.benchmark, f"{measured.round}.0") if measured.round else None
  if not ruleset:
    return ""
  points = rcp_points(measured.benchmark, ruleset)
  return f", or a batch up to {points[-1]['bs']} (the RCPs of ruleset {ruleset})"


def default_batch(measured: Measured, chips: int) -> int:
  """The largest batch the benchmark's RCPs cover that divides over the chips (as a submitter
  would pick); without RCPs, the measured batch."""
  ruleset = rcp_ruleset(measured.benchmark, f"{measured.round}.0") if measured.round else None
  if not ruleset or measured.sample_unit == "mini":
    return measured.global_batch
  fits = [p["bs"] for p in rcp_points(measured.benchmark, ruleset) if p["bs"] % chips == 0]
  if not fits:
    raise UsageError(f"no RCP batch of {measured.benchmark} divides over {chips} chips; "
                     "allowed: --batch B")
  return max(fits)


# ----------------------------------------------------------------------------- the step

@dataclasses.dataclass
class Target:
  chips: int
  machine: str | None
  topology: str
  kwargs: dict                 # simulator Machine arguments
  accelerator: str
  source: str


def target_from_system(desc: dict, machine=None, topology=None) -> Target:
  machine = machine or machine_of(desc["accelerator"], desc.get("system_name", ""))
  return make_target(desc["chips"], machine, topology, desc["accelerator"],
                     per_node=desc["per_node"])


def make_target(chips, machine, topology=None, accelerator="", per_node=8, link=None) -> Target:
  """The simulator's machine for `chips` chips of a preset (its topology kind, the squarest
  torus or nodes of `per_node`), or of the given link figures (`link`: Machine keywords)."""
  if chips < 1:
    raise UsageError(f"--chips {chips} is out of range; allowed: >= 1")
  if link is None:
    if machine not in machine_lib.PRESETS:
      raise UsageError(f"machine {machine!r} has no preset; allowed: "
                       f"{', '.join(machine_lib.PRESETS)}, or link figures "
                       "(--link-bandwidth and the rest, as simulate takes them)")
    preset = machine_lib.PRESETS[machine]
    kind, shape = machine_lib.parse_topology(preset.topology)
    kwargs = dict(link_bandwidth=preset.link_bandwidth, link_latency=preset.link_latency,
                  overhead=preset.overhead, injection_bandwidth=preset.injection_bandwidth,
                  network_bandwidth=preset.network_bandwidth,
                  network_latency=preset.network_latency, nics_per_node=preset.nics_per_node,
                  efficiency=preset.efficiency)
  else:
    kind, shape, kwargs = link.pop("kind"), (0, 0), link
  if topology is None:
    per_node = shape[-1] if kind == "multinode" and per_node is None else per_node
    topology = ("multinode:1x%d" % chips if kind == "multinode" and chips <= per_node else
                tables.scaling_shape(kind, chips, per_node, len(shape)))
  return Target(chips, machine, topology, kwargs, accelerator,
                f"{machine or 'given links'} {topology}")


def all_reduce_seconds(target: Target):
  if target.chips == 1:
    return lambda nbytes: 0.0
  return step_lib._best_all_reduce(target.kwargs, target.topology)  # pylint: disable=protected-access


def exposed_all_reduce(params, compute_s, target: Target) -> tuple[float, float]:
  """(all-reduce seconds in all, seconds exposed after the backward pass) of a step whose
  compute takes compute_s (a third forward, two thirds backward)."""
  sizes = [params * GRADIENT_BYTES / SPLIT_TENSORS] * SPLIT_TENSORS
  ready = step_lib.buckets(sizes, step_lib.BUCKET_BYTES["jax"], compute_s * 2 / 3, compute_s / 3)
  seconds = all_reduce_seconds(target)
  return sum(seconds(b) for _, b in ready), step_lib.overlap(ready, seconds, compute_s)


def predict(measured: Measured, target: Target, batch: int | None = None) -> dict:
  """The breakdown (module docstring) of `measured` on `target` at global batch `batch`."""
  if measured.benchmark in NO_MODEL and not measured.parameters:
    raise UsageError(f"{measured.benchmark}: {NO_MODEL[measured.benchmark]}")
  params = measured.parameters or PARAMETERS.get(measured.benchmark)
  if params is None:
    raise UsageError(f"{measured.benchmark}: no parameter count (not one of this harness's "
                     f"workloads); allowed: {', '.join(sorted(PARAMETERS))}")
  batch = batch or default_batch(measured, target.chips)
  if batch < target.chips:
    raise UsageError(f"--batch {batch} is below the {target.chips} chips; allowed: at least "
                     "one example a chip")
  conv = convergence(measured, batch)
  runs = measured.converged()
  # the measured step: training time (evals out) over the steps trained, median over runs
  steps_run = [math.ceil(r.samples / measured.global_batch) for r in runs]
  step_s = statistics.median((r.minutes * 60 - r.eval_s) / max(s, 1)
                             for r, s in zip(runs, steps_run))
  source = make_target(measured.chips, measured.machine, None, measured.accelerator) \
      if measured.machine else None
  source_exposed = exposed_all_reduce(params, step_s, source)[1] if source else 0.0
  compute_s = max(step_s - source_exposed, step_s * 0.05)
  b_s, b_t = measured.per_chip, batch / target.chips
  chip_speed = _chip_speed(measured, target)
  fixed = min(STEP_FIXED_S, compute_s / 2)
  compute_t = (fixed + (compute_s - fixed) * b_t / b_s) / chip_speed
  all_reduce_t, exposed_t = exposed_all_reduce(params, compute_t, target)
  step_t = compute_t + exposed_t
  # evals: per sample trained as measured, each scaled like a step's compute (eval examples
  # spread over the chips) -- the eval batch per chip follows the chips
  evals_per_sample = statistics.mean(r.evals / r.samples for r in runs if r.samples) \
      if any(r.samples for r in runs) else 0.0
  eval_each = statistics.mean(r.eval_s / r.evals for r in runs if r.evals) \
      if any(r.evals for r in runs) else 0.0
  eval_fixed = min(EVAL_FIXED_S, eval_each / 2)
  eval_t = (eval_fixed + (eval_each - eval_fixed) * measured.chips / target.chips) / chip_speed
  out = {"benchmark": measured.benchmark, "from": f"{measured.org} {measured.system}",
         "from_chips": measured.chips, "from_batch": measured.global_batch,
         "measured_minutes": measured.score_minutes, "to": target.source,
         "chips": target.chips, "batch": batch, "per_chip": b_t,
         "convergence": conv["source"], "sample_unit": measured.sample_unit,
         "parameters": params, "measured_step_s": step_s, "source_exposed_s": source_exposed,
         "compute_s": compute_t, "all_reduce_s": all_reduce_t, "exposed_s": exposed_t,
         "step_s": step_t, "eval_s": eval_t, "step_fixed_s": fixed,
         "chip_speed": chip_speed}
  for key in ("mean", "low", "high"):
    samples = conv[key]
    steps = math.ceil(samples / batch)
    evals = evals_per_sample * samples
    out[f"samples_{key}"] = samples
    out[f"steps_{key}"] = steps
    out[f"evals_{key}"] = evals
    out[f"minutes_{key}"] = (steps * step_t + evals * out["eval_s"]) / 60
  out["predicted_minutes"] = out["minutes_mean"]
  return out


def _chip_speed(measured, target) -> float:
  """How much faster a target chip computes than a measured one: the ratio of the presets'
  bf16 peaks when the accelerators differ and both are known, else 1 (said in the output)."""
  if not target.machine or target.machine == measured.machine or not measured.machine:
    return 1.0
  a, b = machine_lib.PRESETS[measured.machine], machine_lib.PRESETS[target.machine]
  return b.peak_flops / a.peak_flops if a.peak_flops and b.peak_flops else 1.0


# ----------------------------------------------------------------------------- backtest

def _rounds(folders):
  """(round folder, org folder, system folder, benchmark folder) of every result under the
  folders (a round folder, an org, or the parent of rounds)."""
  out = []
  for folder in folders:
    folder = os.path.abspath(folder)
    if not os.path.isdir(folder):
      raise UsageError(f"{folder!r}: no such folder; allowed: MLPerf result folders "
                       "(training_vX.Y, or their parent)")
    for path in sorted(glob.glob(os.path.join(folder, "**", "result_*.txt"), recursive=True)):
      bench = os.path.dirname(path)
      if bench not in out:
        out.append(bench)
  return out


def families(folders) -> dict:
  """{(round, org, benchmark, accelerator): [bench_dir, ...]} for every benchmark folder."""
  out = {}
  for bench in _rounds(folders):
    system_dir = os.path.dirname(bench)
    org_dir = os.path.dirname(os.path.dirname(system_dir))
    round_dir = os.path.basename(os.path.dirname(org_dir))
    desc_path = os.path.join(org_dir, "systems", f"{os.path.basename(system_dir)}.json")
    if not os.path.isfile(desc_path):
      continue
    desc = read_system_json(desc_path)
    accel = machine_of(desc["accelerator"], os.path.basename(system_dir)) or desc["accelerator"]
    key = (round_dir, os.path.basename(org_dir), os.path.basename(bench), accel)
    out.setdefault(key, []).append((desc["chips"], bench, desc))
  return {k: sorted(v, key=lambda x: (x[0], x[1])) for k, v in out.items()}


def backtest(folders) -> list[dict]:
  """Every family with two or more system sizes: each larger system predicted from the
  family's smallest, at the larger one's own global batch, against its measured score."""
  rows = []
  for (round_dir, org, benchmark, accel), members in sorted(families(folders).items()):
    sizes = sorted({chips for chips, _, _ in members})
    if len(sizes) < 2:
      continue
    family = f"{round_dir.replace('training_', '')} {org} {benchmark} {accel}"
    smallest = [m for m in members if m[0] == sizes[0]][0]
    for chips, bench, desc in members:
      if chips == sizes[0]:
        continue
      row = {"family": family, "from": f"{os.path.basename(os.path.dirname(smallest[1]))} "
                                        f"({smallest[0]} chips)",
             "to": f"{os.path.basename(os.path.dirname(bench))} ({chips} chips)",
             "predicted_minutes": None, "measured_minutes": None, "error": None, "reason": ""}
      try:
        target_measured = read_mlperf(bench)
        row["measured_minutes"] = target_measured.score_minutes
        source = read_mlperf(smallest[1])
        if source.machine is None:
          raise UsageError(f"accelerator {source.accelerator!r} has no simulator preset; "
                           f"presets: {', '.join(machine_lib.PRESETS)}")
        target = target_from_system(desc)
        out = predict(source, target, target_measured.global_batch)
        row["predicted_minutes"] = out["predicted_minutes"]
        row["batch"] = out["batch"]
        row["convergence"] = out["convergence"]
        if row["measured_minutes"]:
          row["error"] = row["predicted_minutes"] / row["measured_minutes"] - 1
      except UsageError as e:
        row["reason"] = str(e)
      rows.append(row)
  return rows


def backtest_summary(rows) -> dict:
  errors = [abs(r["error"]) for r in rows if r["error"] is not None]
  return {"predicted": len(errors), "refused": sum(r["error"] is None for r in rows),
          "median_abs_error": statistics.median(errors) if errors else None,
          "worst_abs_error": max(errors) if errors else None}
