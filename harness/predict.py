"""`predict`: the time to train on a system you do not have, from one measured result, and its
backtest on the MLPerf results (docs/simulator.md#predict-time-to-train-at-scale).

A prediction carries each measured run to the target, every factor from a stated source:

  samples   the run's own samples trained x RCP(B_target) / RCP(B_source): the RCP (the
            reference's convergence points, interpolated as mlperf_logging's RCP checker
            interpolates) only as a ratio, so at the measured batch the samples are the run's
  steps     ceil(samples / B_target)
  step      the run's own steady step (its training time, evals excluded, over its steps) x
            model(target) / model(source): the model is the compute at b examples a chip (a
            fixed part and the rest per example, over the presets' bf16 peak ratio) plus the
            gradient all-reduce the simulator exposes after the backward pass
            (commsim/step.py); on the measured system it is 1. A source on a CPU, simulated
            devices or a chip without a preset needs the step measured on the target's chip
            (step_s) for any other accelerator
  evals     the run's evals x the samples ratio, each its own eval time scaled to the target's
            chips as a step's compute is
  time      the olympic mean of the runs carried over (the runs the official summarizer does
            not count still count as failed), x the source's scaling.json: on the measured
            system at its batch it is the measured score

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
  minutes: float          # run_start .. run_stop (the official summarizer's reading)
  samples: float          # trained until the last eval (samples to converge when converged)
  evals: int
  eval_s: float           # all evals together
  converged: bool         # run_stop's status is success
  counted: bool = True    # the official summarizer counts it (compliance check passed)
  path: str = ""


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
  per_node: int = 8       # accelerators a node (the system description's)
  scaling: float = 1.0    # scaling.json: the RCP normalisation applied to its score
  path: str = ""          # the benchmark folder, or the CSV

  @property
  def per_chip(self) -> float:
    return self.global_batch / self.chips

  def converged(self):
    return [r for r in self.runs if r.converged] or [r for r in self.runs if r.minutes == r.minutes]

  def scored(self) -> tuple[list, int]:
    """(the runs its score averages, the runs it drops as failed): the ones the official
    summarizer counts; where it counts none (every log fails the round's compliance check),
    the converged ones, so that a prediction is still made (its measured score is None)."""
    runs = [r for r in self.runs if r.counted] or self.converged()
    return runs, len(self.runs) - len(runs)


# ----------------------------------------------------------------------------- reading

def _value(line):
  return line.value.get("value") if isinstance(line.value, dict) else line.value


def _metadata(line):
  meta = line.value.get("metadata") if isinstance(line.value, dict) else None
  return meta if isinstance(meta, dict) else {}


def _number(value, field, path):
  """One finite number >= 0 logged as `field` (an int, an integral float, or such a string);
  anything else (a list, a dict, text) is one line naming the field and the file: a log is
  data from any submitter of any round, so its types are checked, not assumed."""
  number = value
  if isinstance(value, str):
    try:
      number = float(value)
    except ValueError:
      number = None
  if isinstance(number, bool) or not isinstance(number, (int, float)) or \
      not math.isfinite(number) or number < 0:
    kind = type(value).__name__
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    raise UsageError(f"{path}: {field} is {shown} (a {kind}), not one number; allowed: one "
                     "number >= 0")
  return number


class IncompleteLog(UsageError):
  """A log without run_start or run_stop: in a result folder, a run that did not finish (the
  official summarizer drops it as failed); alone, bad input."""


def read_log(path, ruleset) -> tuple[Run, dict]:
  """A result log -> (Run, {global_batch_size, train_samples, train_samples_end, block_end,
  parsed}). Eval time: eval_start to eval_stop (or to its eval_accuracy where a log has no
  eval_stop)."""
  try:
    parsed = mlp_parser.parse_file(path, ruleset=ruleset)
    lines = parsed[0]
  except (OSError, UnicodeError, ValueError) as e:
    raise UsageError(f"{path}: not readable as an MLPerf log ({type(e).__name__}: "
                     f"{str(e).splitlines()[0] if str(e) else ''}); allowed: a :::MLLOG "
                     "result log") from None
  keys = {}
  start = stop = None
  evals, eval_s, open_eval, last_epoch, status, block_end = 0, 0.0, None, None, None, 0
  for line in lines:
    key = line.key
    stamp = _number(line.timestamp, f"{key}'s time_ms", path)
    if key in ("global_batch_size", "train_samples") and key not in keys:
      keys[key] = _number(_value(line), key, path)
    if key == "train_samples" and start is not None:
      # logged after run_start (NVIDIA's v1.0 BERT, at the end): the samples trained
      keys["train_samples_end"] = _number(_value(line), key, path)
    elif key == "run_start" and start is None:
      start = stamp
    elif key == "run_stop" and stop is None:
      stop, status = stamp, _metadata(line).get("status")
    elif key == "eval_start":
      open_eval = stamp
    elif key in ("eval_stop", "eval_accuracy") and open_eval is not None:
      eval_s += (stamp - open_eval) / 1000.0
      open_eval = None
      evals += 1
    if key == "eval_accuracy" and _metadata(line).get("epoch_num") is not None:
      last_epoch = _number(_metadata(line)["epoch_num"], "eval_accuracy's epoch_num", path)
    if key == "block_start":
      meta = _metadata(line)
      first = _number(meta.get("first_epoch_num") or 0, "block_start's first_epoch_num", path)
      count = _number(meta.get("epoch_count") or 0, "block_start's epoch_count", path)
      block_end = max(block_end, first + count)
  if start is None or stop is None:
    raise IncompleteLog(f"{path}: no run_start/run_stop; allowed: a complete MLPerf result log")
  if "global_batch_size" not in keys:
    raise UsageError(f"{path}: no global_batch_size; allowed: an MLPerf result log that logs it")
  if keys["global_batch_size"] < 1 or keys["global_batch_size"] != int(keys["global_batch_size"]):
    raise UsageError(f"{path}: global_batch_size is {keys['global_batch_size']!r}; allowed: "
                     "a whole number >= 1")
  keys["block_end"], keys["parsed"] = block_end, parsed
  return Run(minutes=(stop - start) / 60000.0, samples=float(last_epoch or 0), evals=evals,
             eval_s=eval_s, converged=status == "success", path=path), keys


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


def _official_minutes(path, ruleset, parsed) -> tuple[float | None, str]:
  """summarize.run_minutes (the round's compliance check, then run_start..run_stop): the
  official summarizer's reading of one log. The checker is mlperf_logging's code run on any
  submitter's log; where it fails on one, that run is not counted (as a run the official tool
  could not score), rather than ending the backtest."""
  try:
    return summarize.run_minutes(path, ruleset, parsed)
  except Exception as e:                        # pylint: disable=broad-except
    return None, f"the compliance checker failed on it ({type(e).__name__})"


def read_mlperf(bench_dir, ruleset=None) -> Measured:
  """<org>/results/<system>/<benchmark>/ with its result_*.txt and <org>/systems/<system>.json.
  Its score is the official summarizer's (summarize.summarize_mlperf): the olympic mean of the
  runs that pass the round's compliance check, the others counted as failed, times the folder's
  scaling.json."""
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
  benchmark = os.path.basename(bench_dir)
  unit = _sample_unit(benchmark)
  runs, keys = [], {}
  for path in files:
    try:
      run, found = read_log(path, ruleset)
    except IncompleteLog:
      runs.append(Run(minutes=math.nan, samples=0.0, evals=0, eval_s=0.0, converged=False,
                      counted=False, path=path))
      continue
    if ruleset == "0.7.0" and benchmark == "bert":
      # v0.7's BERT logs count steps (in epoch_num or in the blocks, one or the other)
      run.samples = max(run.samples, found["block_end"])
    elif unit == "samples" and run.samples < found["global_batch_size"]:
      # an epoch_num below one batch is no sample count (NVIDIA's v1.0 BERT logs 1 in every
      # eval): the samples trained are the train_samples it logs at the end, where it does
      run.samples = found.get("train_samples_end", run.samples)
    minutes, why = _official_minutes(path, ruleset, found["parsed"])
    run.counted = not why
    run.minutes = minutes if run.counted else run.minutes
    runs.append(run)
    keys = keys or {k: v for k, v in found.items() if k != "parsed"}
  if not keys:
    raise UsageError(f"{bench_dir}: none of its {len(files)} logs has run_start and run_stop; "
                     "allowed: a result folder with a complete MLPerf result log")
  gbs, epoch = int(keys["global_batch_size"]), int(keys.get("train_samples") or 0)
  # samples trained: epochs x an epoch, or BERT's samples (v0.7's BERT logs counted steps)
  per = epoch if unit == "epochs" else gbs if ruleset == "0.7.0" else 1
  for run in runs:
    run.samples *= per or 1
  scaling = summarize.scaling_factor(bench_dir)
  counted = [r.minutes for r in runs if r.counted]
  score, _ = summarize.olympic_minutes(counted, len(runs) - len(counted),
                                       summarize.drop_count(benchmark))
  return Measured(benchmark=benchmark, round=ruleset.rsplit(".", 1)[0],
                  org=os.path.basename(org_dir), system=system,
                  accelerator=desc["accelerator"], chips=desc["chips"], global_batch=gbs,
                  train_samples=epoch, runs=runs,
                  score_minutes=None if score is None else score * scaling,
                  machine=machine_of(desc["accelerator"], system), sample_unit=unit,
                  per_node=desc["per_node"], scaling=scaling, path=bench_dir)


SYSTEM_FIELDS = ("accelerator_model_name", "accelerators_per_node", "number_of_nodes")


def read_system_json(path) -> dict:
  """MLPerf's system description -> {accelerator, chips, nodes, per_node}; a missing field is
  one line naming it."""
  try:
    with open(path) as f:
      desc = json.load(f)
  except (OSError, UnicodeError, json.JSONDecodeError) as e:
    raise UsageError(f"{path}: not a readable JSON system description ({e})") from None
  if not isinstance(desc, dict):
    raise UsageError(f"{path}: a JSON {type(desc).__name__}, not an object; allowed: MLPerf's "
                     f"system description with {', '.join(SYSTEM_FIELDS)}")
  missing = [k for k in SYSTEM_FIELDS if str(desc.get(k, "")).strip() == ""]
  if missing:
    raise UsageError(f"{path}: missing {', '.join(missing)}; allowed: MLPerf's system "
                     f"description with {', '.join(SYSTEM_FIELDS)}")
  try:
    nodes, per = int(desc["number_of_nodes"]), int(desc["accelerators_per_node"])
  except (ValueError, TypeError):
    nodes = per = 0
  if nodes < 1 or per < 1:
    raise UsageError(f"{path}: number_of_nodes={desc['number_of_nodes']!r}, "
                     f"accelerators_per_node={desc['accelerators_per_node']!r}; allowed: "
                     "whole numbers >= 1")
  return {"accelerator": str(desc["accelerator_model_name"]), "chips": nodes * per,
          "nodes": nodes, "per_node": per, "system_name": str(desc.get("system_name", ""))}


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
    run.counted = True                  # a successful row: summarize scores the CSV's so
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
                  parameters=parameters, per_node=int(first["num_devices"]), path=path)


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
  """How the samples to converge move from the measured batch to `batch`: {ratio, source}.
  The measured runs' own samples are the base (a submitter's runs converge as its recipe does,
  which an RCP -- the reference's runs -- does not know); the RCPs serve only as the ratio
  RCP(batch) / RCP(measured batch), so at the measured batch the ratio is exactly 1. A one-line
  error when no RCP covers both batches."""
  unit, b_s = measured.sample_unit, measured.global_batch
  if batch == b_s:
    return {"ratio": 1.0, "source": f"the measured runs' own samples (batch {b_s}, theirs)"}
  if unit == "mini":
    return {"ratio": 1.0, "source": f"the measured runs' own samples (batch {b_s}; a mini "
                                    "preset has no RCP, and its samples are assumed not to "
                                    "change with the batch)"}
  ruleset = rcp_ruleset(measured.benchmark, f"{measured.round}.0") if measured.round else None
  if ruleset:
    points = rcp_points(measured.benchmark, ruleset)
    at_t, at_s = rcp_at(points, batch), rcp_at(points, b_s)
    if at_t is not None and at_s is not None:
      own = "" if ruleset.startswith(measured.round) else f" (round {measured.round} has none)"
      return {"ratio": at_t["mean"] / at_s["mean"],
              "source": f"the measured runs' samples x RCP({batch}) / RCP({b_s}) = "
                        f"{at_t['mean']:.4g} / {at_s['mean']:.4g} {unit} ({at_t['how']}; "
                        f"{at_s['how']}) at ruleset {ruleset}{own}"}
    if at_s is None:
      raise UsageError(f"--batch {batch}: the measured batch {b_s} is above the largest RCP "
                       f"of {measured.benchmark} ({points[-1]['bs']}, ruleset {ruleset}), so "
                       f"no RCP ratio moves its samples; allowed: --batch {b_s}")
  raise UsageError(f"--batch {batch}: no RCP of {measured.benchmark} covers it and the "
                   f"measured runs are at batch {b_s}; allowed: --batch {b_s}"
                   + _covered(measured))


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
  if target.chips == 1 or not target.topology:    # one chip, or no network known: none
    return lambda nbytes: 0.0
  # one per machine and topology: it remembers each size it timed (a schedule simulation),
  # and a backtest times the same source system for every target of its family
  key = (target.topology, repr(sorted(target.kwargs.items())))
  if key not in _ALL_REDUCE:
    _ALL_REDUCE[key] = step_lib._best_all_reduce(target.kwargs, target.topology)  # pylint: disable=protected-access
  return _ALL_REDUCE[key]


_ALL_REDUCE = {}


def exposed_all_reduce(params, compute_s, target: Target) -> tuple[float, float]:
  """(all-reduce seconds in all, seconds exposed after the backward pass) of a step whose
  compute takes compute_s (a third forward, two thirds backward)."""
  sizes = [params * GRADIENT_BYTES / SPLIT_TENSORS] * SPLIT_TENSORS
  ready = step_lib.buckets(sizes, step_lib.BUCKET_BYTES["jax"], compute_s * 2 / 3, compute_s / 3)
  seconds = all_reduce_seconds(target)
  return sum(seconds(b) for _, b in ready), step_lib.overlap(ready, seconds, compute_s)


def source_target(measured: Measured) -> Target:
  """The measured system itself as a target (its chips, nodes and preset); an accelerator
  without a preset gives a target that only the same system's prediction can use."""
  if measured.machine is None:
    return Target(measured.chips, None, "", {}, measured.accelerator,
                  f"{measured.accelerator} ({measured.chips} chips, no preset)")
  return make_target(measured.chips, measured.machine, None, measured.accelerator,
                     per_node=measured.per_node)


def _step_model(params, compute_s, b_s, b_t, speed, target) -> tuple[float, float, float]:
  """(compute, all-reduce in all, exposed) of a step at b_t examples a chip on `target`, from
  the compute `compute_s` at b_s: a fixed part and the rest per example, over the chip speed."""
  fixed = min(STEP_FIXED_S, compute_s / 2)
  compute = (fixed + (compute_s - fixed) * b_t / b_s) / speed
  total, exposed = exposed_all_reduce(params, compute, target)
  return compute, total, exposed


def _model_or_refuse(measured, target, runs, step_s) -> int:
  """The parameters a step's all-reduce moves, once every input the step model needs from a
  source on another system is known; else one line saying which is missing."""
  unknown = [r.path for r in runs if r.samples <= 0]
  if unknown:
    raise UsageError(f"{unknown[0]}: no samples trained (no epoch_num in its eval_accuracy "
                     "lines, no train_samples at its end); allowed: a log that states them, "
                     "or the measured system at its own batch")
  if measured.benchmark in NO_MODEL and not measured.parameters:
    raise UsageError(f"{measured.benchmark}: {NO_MODEL[measured.benchmark]}")
  params = measured.parameters or PARAMETERS.get(measured.benchmark)
  if params is None:
    raise UsageError(f"{measured.benchmark}: no parameter count (not one of this harness's "
                     f"workloads); allowed: {', '.join(sorted(PARAMETERS))}")
  if step_s is None and measured.machine != target.machine:
    # a CPU's or simulated device's step, or a chip without a preset, says nothing of how
    # fast the target's accelerator computes: no peak ratio exists to scale it by
    b_s = measured.per_chip
    if measured.machine is None:
      raise UsageError(
          f"{measured.path or measured.system}: measured on {measured.accelerator!r} (no "
          f"simulator preset), so its step says nothing of a {target.machine} chip; allowed: "
          f"--step-s SECONDS (the step measured on one {target.machine} chip at {b_s:g} "
          "examples), or a target of the same accelerator")
    if target.machine is None:
      raise UsageError(f"the target's accelerator has no preset (link figures alone), so a "
                       f"{measured.machine} step says nothing of its chip; allowed: --machine "
                       f"M, or --step-s SECONDS (the step measured on one of its chips at "
                       f"{b_s:g} examples)")
  return params


def predict(measured: Measured, target: Target, batch: int | None = None,
            step_s: float | None = None) -> dict:
  """The breakdown (module docstring) of `measured` on `target` at global batch `batch`.
  `step_s`: the step measured on one chip of the target's accelerator at the measured examples
  per chip, for a source whose own step says nothing about that chip (a CPU row)."""
  batch = batch or default_batch(measured, target.chips)
  if step_s is not None and not (math.isfinite(step_s) and step_s > 0):
    raise UsageError(f"--step-s {step_s} is out of range; allowed: seconds > 0")
  own = source_target(measured)
  # the measured system at its own batch: every factor below is 1 and no model is needed
  same = (step_s is None and target.chips == measured.chips and batch == measured.global_batch
          and target.machine == own.machine and target.topology == own.topology)
  runs, failed = measured.scored()
  b_s, b_t = measured.per_chip, batch / target.chips
  if not same:
    if batch < target.chips:      # (the measured system may itself split examples over chips)
      raise UsageError(f"--batch {batch} is below the {target.chips} chips; allowed: at least "
                       "one example a chip")
    params = _model_or_refuse(measured, target, runs, step_s)
  conv = convergence(measured, batch)
  # each run's steady step: its training time (evals out) over the steps it trained
  steps_run = [max(math.ceil(r.samples / measured.global_batch), 1) for r in runs]
  per_step = [(r.minutes * 60 - r.eval_s) / n for r, n in zip(runs, steps_run)]
  measured_step = statistics.median(per_step)
  eval_each = statistics.mean(r.eval_s / r.evals for r in runs if r.evals) \
      if any(r.evals for r in runs) else 0.0
  out = {"benchmark": measured.benchmark, "from": f"{measured.org} {measured.system}",
         "from_chips": measured.chips, "from_batch": measured.global_batch,
         "measured_minutes": measured.score_minutes, "to": target.source,
         "chips": target.chips, "batch": batch, "per_chip": b_t,
         "convergence": conv["source"], "samples_ratio": conv["ratio"],
         "sample_unit": measured.sample_unit, "same_system": same,
         "measured_step_s": measured_step, "given_step_s": step_s,
         "scaling_factor": measured.scaling, "runs": len(runs), "failed_runs": failed}
  if same:
    step_ratio = eval_ratio = 1.0
    out.update(parameters=measured.parameters or PARAMETERS.get(measured.benchmark),
               source_exposed_s=None, compute_s=None, all_reduce_s=None, exposed_s=None,
               step_fixed_s=None, chip_speed=1.0)
  else:
    # the source: its median step, or the step given for one chip of the target's kind
    if step_s is None:
      base, source, speed = measured_step, own, _chip_speed(measured, target)
    else:
      base, speed = step_s, 1.0
      source = dataclasses.replace(target, chips=1, topology="ring:1")
    source_exposed = exposed_all_reduce(params, base, source)[1]
    compute_s = max(base - source_exposed, base * 0.05)
    c_s, _, e_s = _step_model(params, compute_s, b_s, b_s, 1.0, source)
    c_t, all_reduce_t, e_t = _step_model(params, compute_s, b_s, b_t, speed, target)
    # the model's change from the source to the target, applied to the measured step: the
    # model reproduces its own source exactly, and the measured step's parts it does not hold
    # (the input pipeline, the optimizer) scale as the modelled ones do
    step_ratio = (c_t + e_t) / (c_s + e_s) * (base / measured_step)
    eval_fixed = min(EVAL_FIXED_S, eval_each / 2)
    eval_s = (eval_fixed + (eval_each - eval_fixed) * measured.chips / target.chips) / speed
    eval_ratio = eval_s / eval_each * (base / measured_step) if eval_each else 1.0
    out.update(parameters=params, source_exposed_s=source_exposed, compute_s=c_t,
               all_reduce_s=all_reduce_t, exposed_s=e_t, step_fixed_s=min(STEP_FIXED_S,
                                                                         compute_s / 2),
               chip_speed=speed)
  out["step_ratio"], out["eval_ratio"] = step_ratio, eval_ratio
  out["step_s"] = measured_step * step_ratio
  out["eval_s"] = eval_each * eval_ratio
  # every measured run carried to the target: its samples x the RCP ratio, its steps at the
  # target's batch, its own step and evals scaled; scored as the official summarizer scores
  per_run = []
  for run, step in zip(runs, per_step):
    samples = run.samples * conv["ratio"]
    steps = max(math.ceil(samples / batch), 1)
    evals = run.evals * conv["ratio"]
    each = run.eval_s / run.evals if run.evals else 0.0
    per_run.append({"samples": samples, "steps": steps, "evals": evals,
                    "minutes": (steps * step * step_ratio + evals * each * eval_ratio) / 60})
  minutes = [r["minutes"] for r in per_run]
  score, note = summarize.olympic_minutes(minutes, failed, summarize.drop_count(
      measured.benchmark))
  out["scoring"] = "the olympic mean of the runs carried over"
  if score is None:
    score, out["scoring"] = statistics.mean(minutes), f"the mean of the runs carried over ({note})"
  if measured.scaling != 1.0:
    out["scoring"] += f", x{measured.scaling:.6g} (the source's scaling.json)"
  out["runs_minutes"] = [m * measured.scaling for m in minutes]
  for key, pick in (("mean", statistics.mean), ("low", min), ("high", max)):
    out[f"samples_{key}"] = pick(r["samples"] for r in per_run)
    out[f"steps_{key}"] = math.ceil(out[f"samples_{key}"] / batch)
    out[f"evals_{key}"] = pick(r["evals"] for r in per_run)
  out["minutes_mean"] = out["predicted_minutes"] = score * measured.scaling
  out["minutes_low"], out["minutes_high"] = min(out["runs_minutes"]), max(out["runs_minutes"])
  return out


def _chip_speed(measured, target) -> float:
  """How much faster a target chip computes than a measured one: the ratio of the presets'
  bf16 peaks when the accelerators differ and both are known, else 1 (said in the output)."""
  if not target.machine or target.machine == measured.machine or not measured.machine:
    return 1.0
  a, b = machine_lib.PRESETS[measured.machine], machine_lib.PRESETS[target.machine]
  return b.peak_flops / a.peak_flops if a.peak_flops and b.peak_flops else 1.0


# ----------------------------------------------------------------------------- backtest

# What reading or predicting one folder may raise besides a UsageError where its data is of a
# kind no check above foresaw: that folder is refused with the error, the backtest goes on.
DATA_ERRORS = (ValueError, TypeError, KeyError, IndexError, ZeroDivisionError, OSError,
               AttributeError)


def _one_line(error, where) -> str:
  """A refusal's reason: the UsageError's line, or an unforeseen error's type and text after
  the folder it came from; always one line."""
  text = str(error) if isinstance(error, UsageError) else \
      f"{where}: {type(error).__name__}: {error}"
  return " ".join(text.split())


def _rounds(folders):
  """Every benchmark folder (one holding result_*.txt) under the folders (a round folder, an
  org, or the parent of rounds); a folder holding none is a one-line error naming it."""
  out = []
  for folder in folders:
    folder = os.path.abspath(folder)
    if not os.path.isdir(folder):
      raise UsageError(f"{folder!r}: no such folder; allowed: MLPerf result folders "
                       "(training_vX.Y, or their parent)")
    found = sorted(glob.glob(os.path.join(folder, "**", "result_*.txt"), recursive=True))
    if not found:
      raise UsageError(f"{folder}: holds no MLPerf result logs; allowed: a folder with "
                       "training_vX.Y/<org>/results/<system>/<benchmark>/result_*.txt (a "
                       "round folder, an org folder, or their parent)")
    for path in found:
      bench = os.path.dirname(path)
      if bench not in out:
        out.append(bench)
  return out


def families(folders, refused=None) -> dict:
  """{(round, org, benchmark, accelerator): [(chips, bench_dir, desc), ...]} for every
  benchmark folder; one whose system description is missing or unreadable is appended to
  `refused` as a backtest row."""
  out = {}
  for bench in _rounds(folders):
    system_dir = os.path.dirname(bench)
    org_dir = os.path.dirname(os.path.dirname(system_dir))
    round_dir = os.path.basename(os.path.dirname(org_dir))
    system = os.path.basename(system_dir)
    desc_path = os.path.join(org_dir, "systems", f"{system}.json")
    try:
      if not os.path.isfile(desc_path):
        raise UsageError(f"{bench}: no {desc_path}; allowed: the official layout with "
                         "<org>/systems/<system>.json")
      desc = read_system_json(desc_path)
    except (UsageError, *DATA_ERRORS) as e:
      if refused is not None:
        refused.append(_row(f"{round_dir.replace('training_', '')} {os.path.basename(org_dir)} "
                            f"{os.path.basename(bench)}", "-", system, _one_line(e, bench)))
      continue
    accel = machine_of(desc["accelerator"], system) or desc["accelerator"]
    key = (round_dir, os.path.basename(org_dir), os.path.basename(bench), accel)
    out.setdefault(key, []).append((desc["chips"], bench, desc))
  return {k: sorted(v, key=lambda x: (x[0], x[1])) for k, v in out.items()}


def _row(family, source, to, reason="") -> dict:
  return {"family": family, "from": source, "to": to, "predicted_minutes": None,
          "measured_minutes": None, "error": None, "reason": reason}


def backtest(folders) -> list[dict]:
  """Every family with two or more system sizes: each larger system predicted from the
  family's smallest readable one, at the larger one's own global batch, against its measured
  score. A folder that cannot be read or predicted is a row with its reason, never the end of
  the backtest."""
  rows = []
  found = families(folders, rows)
  for (round_dir, org, benchmark, accel), members in sorted(found.items()):
    if len({chips for chips, _, _ in members}) < 2:
      continue
    family = f"{round_dir.replace('training_', '')} {org} {benchmark} {accel}"
    readable = []
    for chips, bench, desc in members:
      name = f"{os.path.basename(os.path.dirname(bench))} ({chips} chips)"
      try:
        readable.append((chips, bench, desc, read_mlperf(bench), name))
      except (UsageError, *DATA_ERRORS) as e:
        rows.append(_row(family, "-", name, _one_line(e, bench)))
    sizes = sorted({m[0] for m in readable})
    if len(sizes) < 2:
      continue
    smallest = next(m for m in readable if m[0] == sizes[0])
    source = smallest[3]
    for chips, bench, desc, measured, name in readable:
      if chips == sizes[0]:
        continue
      row = _row(family, smallest[4], name)
      row["measured_minutes"] = measured.score_minutes
      try:
        if source.machine is None:
          raise UsageError(f"{smallest[1]}: accelerator {source.accelerator!r} has no "
                           f"simulator preset; presets: {', '.join(machine_lib.PRESETS)}")
        out = predict(source, target_from_system(desc), measured.global_batch)
        row["predicted_minutes"] = out["predicted_minutes"]
        row["batch"] = out["batch"]
        row["convergence"] = out["convergence"]
        if row["measured_minutes"]:
          row["error"] = row["predicted_minutes"] / row["measured_minutes"] - 1
      except (UsageError, *DATA_ERRORS) as e:
        # a refusal about the model (no preset, no parameter count) names the source folder
        reason = _one_line(e, smallest[1])
        row["reason"] = reason if smallest[1] in reason or os.sep in reason.split(":")[0] \
            else f"{smallest[1]}: {reason}"
      rows.append(row)
  return rows


def backtest_summary(rows) -> dict:
  errors = [abs(r["error"]) for r in rows if r["error"] is not None]
  return {"predicted": len(errors), "refused": sum(bool(r["reason"]) for r in rows),
          "unscored": sum(not r["reason"] and r["error"] is None for r in rows),
          "median_abs_error": statistics.median(errors) if errors else None,
          "worst_abs_error": max(errors) if errors else None}
