"""`predict`: the time to train on a system you do not have, from one measured result, and its
backtest on the MLPerf results (docs/simulator.md#predict-time-to-train-at-scale).

A prediction carries each measured run to the target, every factor from a stated source:

  samples   the run's own samples trained x RCP(B_target) / RCP(B_source): the RCP (the
            reference's convergence points, interpolated as mlperf_logging's RCP checker
            interpolates) only as a ratio, so at the measured batch the samples are the run's
  steps     ceil(samples / B_target)
  step      the run's own steady step (its training time, evals excluded, over its steps) x
            model(target) / model(source): the model is the compute at b examples a chip (a
            fixed part, the floor -- where the source's step has room for it -- and the
            optimizer's update over the chip's HBM bandwidth, sharded over the replicas on a
            TPU; the rest per example, over the presets' bf16 peak ratio) plus the gradient
            all-reduce exposed after the backward pass (commsim/step.py's buckets, the fastest
            of the simulator's algorithms and, across nodes of NVIDIA GPUs, NCCL's tree:
            predict_collective.py; 2-byte elements on NVIDIA GPUs) and DLRM's all-to-alls (the
            share of vectors HugeCTR's hybrid embedding sends, where the figures state it); a
            layout (GPT-3) splits the work and the gradient over replicas; the benchmark's
            figures come from its workload's mlperf_figures.py or predict_figures.json; on the
            measured system it is 1. A source on a CPU, simulated devices or a chip without a
            preset needs the step measured on the target's chip (step_s) for any other
            accelerator
  evals     the run's evals x the samples ratio, each its own eval time scaled to the target's
            chips (all of it where the metric is reduced on the chips, less a fixed part where
            it runs on the hosts); an eval that brackets its training block is training time;
            an asynchronous eval's host part is training time, the last one's a tail carried
            as measured
  time      the olympic mean of the runs carried over (the runs the official summarizer does
            not count still count as failed), x the source's scaling.json: on the measured
            system at its batch it is the measured score; a range of the model's own error
            (the development backtest's 80% conformal quantile) with 2 standard errors of the
            runs', the RCP's and the RCP ratio's spread

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

from harness import predict_collective as collective, summarize
from harness.commsim import machine as machine_lib, step as step_lib, tables
from harness.errors import UsageError

# The part of an eval that does not shrink with the chips where its metric runs on the hosts
# (COCO/OpenImages mAP; an eval_on_device benchmark has none): one value for every such
# benchmark and machine, assumed (not fitted on any row).
EVAL_FIXED_S = 0.2
# Bytes a gradient element or an exchanged embedding element takes on the wire. NVIDIA's GPU
# recipes train in mixed precision and reduce in half precision (DeepLearningExamples' BERT
# --allreduce_post_accumulation_fp16, HugeCTR's fp16 embedding exchange under mixed
# precision, MXNet's fp16 gradients); the TPU references' XLA all-reduce sums float32.
GRADIENT_BYTES = 4                 # float32 (TPU, and any accelerator not named below)
HALF_PRECISION_WIRE = ("dgx-",)    # presets whose submitters' collectives move 2-byte values
NCCL_TREE = ("dgx-",)              # presets whose collectives are NCCL's (its tree across nodes)
# TensorCores a chip (Cloud TPU system architecture pages: v3 and v4 chips hold two, v4's as one
# "megacore" device; v5p two; v5e and v6e one); a GPU is one
TENSOR_CORES = {"tpu-v3": 2, "tpu-v4": 2, "tpu-v5p": 2}
SHARDED_UPDATE = ("tpu-",)         # presets whose compiler shards the weight update (layout)
SPLIT_TENSORS = 64                 # the gradient spread evenly over this many tensors (buckets)
EMBEDDING_BYTES = 4                # float32 pooled vectors in DLRM's all-to-all (the reference)

# Bytes of memory traffic a parameter costs the optimizer's update (float32 state): read the
# weight and its gradient and each slot, write the weight and each slot. Momentum SGD/LARS
# and Adagrad hold one slot (5 x 4 B), Adam and LAMB two (7 x 4 B). An update reads and
# writes each once: memory-bound, so its time is these bytes over the chip's HBM bandwidth.
OPTIMIZER_BYTES = {"sgd": 20, "nag": 20, "lars": 20, "sgd_with_momentum": 20, "adagrad": 20,
                   "adam": 28, "adamw": 28, "lamb": 28}
DEFAULT_OPTIMIZER_BYTES = 28       # an optimizer not named above: Adam's two slots (said so)

# The range a prediction states: this many standard errors of predicted - measured (about 95%
# of measured scores inside it, were the step model exact and the runs' times normal).
RANGE_SIGMAS = 2.0
# ... and the model's own error, which the runs' spreads do not hold: split conformal
# prediction (Vovk et al.; Lei et al. 2018, "Distribution-free predictive inference for
# regression"): the ceil((n + 1) x level)-th smallest |log(predicted / measured)| of the n
# pairs of the development backtest (../shared/mlperf_results + ../shared/mlperf_scaling),
# so that a new pair drawn like them falls inside with probability >= level. Fitted on the
# development data by construction (inside it, coverage is at least the level); the rounds
# kept aside are what test it. Recomputed by `predict --backtest ... --calibrate`, and
# tests/harness/test_predict.py fails when the model's errors move and this is not redone.
MODEL_ERROR_LEVEL = 0.8
MODEL_ERROR = 0.268

# A step's floor besides the optimizer's update: kernel launches, the host loop, batch-norm
# and loss reductions, which no figure here gives. Not from a spec: the value chosen among 1,
# 2 and 4 ms on the v0.7 Google TPU rows of the backtest (fitted on development data); without
# it the backtest's median |error| is 23.6% instead of 13.5% (docs/simulator.md). Dropped for a
# source whose measured compute is shorter than it and the update (source_fit).
LAUNCH_FLOOR_S = 0.004

FIGURES_FILE = os.path.join(os.path.dirname(__file__), "predict_figures.json")


@dataclasses.dataclass
class Run:
  minutes: float          # run_start .. run_stop (the official summarizer's reading)
  samples: float          # trained until the last eval (samples to converge when converged)
  evals: int
  eval_s: float           # all evals together (the part that holds training up)
  converged: bool         # run_stop's status is success
  counted: bool = True    # the official summarizer counts it (compliance check passed)
  path: str = ""
  # the last eval's metric computed on a host while training ran on, until its result stopped
  # the run (asynchronous evals: _host_parts); not training, not the evals' chip part
  tail_s: float = 0.0


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
  network: tuple | None = None   # (NICs a node, bytes/s each) from its system description
  optimizer: str = ""     # the log's opt_name
  grad_accum: int = 1     # the log's gradient_accumulation_steps
  epoch_note: str = ""    # how an epoch was read where the log's train_samples is no epoch

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


# ----------------------------------------------------------------------------- figures

def _round_key(text):
  return tuple(int(x) for x in str(text).split(".")[:2])


def _in_rounds(rounds, round_) -> bool:
  """A figure's (first, last) rounds (None: open) hold for `round_` ('' for this harness's CSV:
  the workload's own model, every figure holds)."""
  if not round_:
    return True
  first, last = rounds
  here = _round_key(round_)
  return (first is None or here >= _round_key(first)) and (last is None or
                                                           here <= _round_key(last))


def _workload_figures():
  """FIGURES of every workload folder that has a mlperf_figures.py (found through the
  registry, as bench/gpu_models.py finds bare_step: no list here names a workload)."""
  import importlib                                # pylint: disable=import-outside-toplevel
  from harness import registry
  out = []
  for name in registry.names():
    module = registry.get(name).own_module("mlperf_figures")
    if module:
      out.append(dict(importlib.import_module(module).FIGURES, workload=name))
  return out


def figures(benchmark: str, round_: str = "") -> dict:
  """What predict needs of an MLPerf benchmark's model at a round: this harness's workload's
  mlperf_figures.py where one is that benchmark's model at that round, else the entry of
  harness/predict_figures.json. A benchmark with neither, or one the table refuses, is one line
  naming the reason."""
  for fig in _workload_figures():
    if fig["benchmark"] == benchmark and _in_rounds(fig["rounds"], round_):
      return fig
  with open(FIGURES_FILE) as f:
    table = json.load(f)["benchmarks"]
  for fig in table:
    if fig["benchmark"] != benchmark:
      continue
    if "refused" in fig:
      raise UsageError(f"{benchmark}: {fig['refused']}")
    if _in_rounds(fig["rounds"], round_):
      return fig
  known = sorted({f["benchmark"] for f in table if "refused" not in f}
                 | {f["benchmark"] for f in _workload_figures()})
  at = f" at round {round_}" if round_ else ""
  raise UsageError(f"{benchmark}: no parameter count{at} (neither a workload's "
                   f"mlperf_figures.py nor harness/predict_figures.json has it); allowed: "
                   f"{', '.join(known)}")


def _figures_or_none(benchmark, round_):
  try:
    return figures(benchmark, round_)
  except UsageError:
    return None


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


def _bracketing(evals_ms, block_ms) -> float:
  """Seconds of the evals logged inside a training block that span (nearly) all of it: such an
  eval brackets the block's training too (Google's v0.7 DLRM runs one device loop that trains
  the block and evaluates, its eval_start logged at block_start and eval_stop at block_stop),
  so its time is not separable from training and stays training time (the step carries it).
  An eval shorter than 90% of its block (Google's SSD logs one at the block's start) is an
  eval."""
  return sum(d for d in evals_ms if block_ms > 0 and d >= 0.9 * block_ms) / 1000.0


def read_log(path, ruleset) -> tuple[Run, dict]:
  """A result log -> (Run, {global_batch_size, train_samples, train_samples_end, block_end,
  parsed}). Eval time: eval_start to eval_stop (or to its eval_accuracy where a log has no
  eval_stop), less what ran on a host while training went on (_host_parts)."""
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
  block_at, block_evals, spans, epoch_starts = None, [], [], []
  for line in lines:
    key = line.key
    stamp = _number(line.timestamp, f"{key}'s time_ms", path)
    if key in ("global_batch_size", "train_samples", "gradient_accumulation_steps") \
        and key not in keys:
      keys[key] = _number(_value(line), key, path)
    if key == "opt_name" and key not in keys:
      keys[key] = str(_value(line)).lower()
    if key == "train_samples" and start is not None:
      # logged after run_start (NVIDIA's v1.0 BERT, at the end): the samples trained
      keys["train_samples_end"] = _number(_value(line), key, path)
    elif key == "run_start" and start is None:
      start = stamp
    elif key == "run_stop" and stop is None:
      stop, status = stamp, _metadata(line).get("status")
    elif key == "block_start":
      block_at, block_evals = stamp, []
    elif key == "block_stop" and block_at is not None:
      eval_s -= _bracketing(block_evals, stamp - block_at)
      block_at = None
    elif key == "eval_start":
      open_eval = stamp
    elif key == "epoch_start":
      epoch_starts.append(stamp)
    elif key in ("eval_stop", "eval_accuracy") and open_eval is not None:
      eval_s += (stamp - open_eval) / 1000.0
      spans.append((open_eval, stamp))
      if block_at is not None:
        block_evals.append(stamp - open_eval)
      open_eval = None
      evals += 1
    # where it was: epoch_num, or (the 5.1 rules' LLM benchmarks) samples_count
    at = next((k for k in ("epoch_num", "samples_count")
               if _metadata(line).get(k) is not None), None) if key == "eval_accuracy" else None
    if at:
      last_epoch = _number(_metadata(line)[at], f"eval_accuracy's {at}", path)
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
  overlapped, tail = _host_parts(spans, epoch_starts, stop)
  return Run(minutes=(stop - start) / 60000.0, samples=float(last_epoch or 0), evals=evals,
             eval_s=eval_s - overlapped, converged=status == "success", path=path,
             tail_s=tail), keys


def _host_parts(spans, epoch_starts, stop) -> tuple[float, float]:
  """(seconds of the evals' spans that ran alongside training, the last one's host part) from
  the evals' (start, stop), the epochs' starts and run_stop, in ms. An eval whose next epoch
  starts before its eval_stop is asynchronous: its forward passes held training up until that
  epoch started; the rest (the metric on a host: NVIDIA's RetinaNet hands OpenImages mAP to an
  async executor on one rank, which logs eval_stop when it is done: its engine.py) ran while
  the next epoch trained, so it is training time, not eval time. The last one's result ends
  the run: its host part is time the run waits (the training meanwhile counts no samples), a
  part that does not shrink with the chips: the tail. From its eval_stop to run_stop (the code
  noticing the result: some iterations, or the rest of an epoch) stays training time."""
  overlapped = tail = 0.0
  for i, (begin, end) in enumerate(spans):
    resumed = next((t for t in epoch_starts if t > begin), None)
    if resumed is None or resumed >= end:
      continue
    if i == len(spans) - 1 and stop >= end:
      tail = (end - resumed) / 1000.0
    overlapped += (end - resumed) / 1000.0
  return overlapped, tail


def _epochs_trained(run, found, fig) -> float:
  """DLRM's epochs trained, which its logs' epoch_num does not state alike: NVIDIA's HugeCTR
  counts from 1 (1.05 at the first eval) and logs the samples trained as train_samples at
  run_stop; Google's v0.7 logs the eval's index (1, 2, ... 15), each eval `eval_every_epochs`
  after the last (the cadence NVIDIA's epoch_num steps by, 0.05). In epochs."""
  if found.get("train_samples_end"):
    return found["train_samples_end"] / fig["epoch_examples"]
  if run.samples == int(run.samples) and run.samples == run.evals:
    return run.evals * fig["eval_every_epochs"]
  return run.samples


def machine_of(accelerator: str, system: str) -> str | None:
  """The simulator preset of an accelerator (system descriptions name it loosely: v0.7's TPU
  v4 systems say 'TPU', the system name says v4). Longer names first: 'gaudi2' before
  'gaudi', 'h200' is no 'h100'."""
  text = f"{accelerator} {system}".lower().replace("-", " ").replace("_", " ")
  for preset, words in (("tpu-v3", ("tpu v3",)), ("tpu-v4", ("tpu v4",)),
                        ("tpu-v5e", ("tpu v5e", "tpu v5 lite")), ("tpu-v5p", ("tpu v5p",)),
                        ("tpu-v6e", ("tpu v6e", "trillium")), ("dgx-a100", ("a100",)),
                        ("dgx-h200", ("h200",)), ("dgx-h100", ("h100",)),
                        ("dgx-b200", ("b200",)), ("gaudi3", ("gaudi3", "gaudi 3")),
                        ("gaudi2", ("gaudi2", "gaudi 2")), ("gaudi", ("gaudi",))):
    if any(w in text for w in words):
      return preset
  return None


def _sample_unit(benchmark, round_=""):
  """What the benchmark's RCPs count: its figures say 'samples' (BERT), else epochs."""
  fig = _figures_or_none(benchmark, round_)
  return (fig or {}).get("sample_unit", "epochs")


# A NIC in a system description's host_networking: '8x ConnectX-6 IB HDR 200Gb/Sec'
_NIC = re.compile(r"(\d+)\s*x\s*[^,;]*?(\d+(?:\.\d+)?)\s*Gb", re.IGNORECASE)


def network_of(host_networking: str) -> tuple[int, float] | None:
  """(NICs a node, bytes/s a NIC per direction) that carry the accelerators' traffic, from a
  system description's host_networking: the 'Compute:' part where it names one (storage and
  management NICs carry none), else every NIC it lists; None where it names no count and
  speed."""
  text = str(host_networking or "")
  parts = re.split(r",|;", text)
  compute = [p for p in parts if "compute" in p.lower()]
  if not compute:
    compute = [p for p in parts if not re.search(r"storage|management", p, re.IGNORECASE)]
  found = [m for p in compute for m in [_NIC.search(p)] if m]
  if not found:
    return None
  nics = sum(int(m.group(1)) for m in found)
  gbps = min(float(m.group(2)) for m in found)
  return (nics, gbps * 1e9 / 8) if nics > 0 and gbps > 0 else None


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
  round_ = ruleset.rsplit(".", 1)[0]
  fig = _figures_or_none(benchmark, round_) or {}
  unit = fig.get("sample_unit", "epochs")
  runs, keys = [], {}
  for path in files:
    try:
      run, found = read_log(path, ruleset)
    except IncompleteLog:
      runs.append(Run(minutes=math.nan, samples=0.0, evals=0, eval_s=0.0, converged=False,
                      counted=False, path=path))
      continue
    if ruleset == "0.7.0" and unit == "samples":
      # v0.7's BERT logs count steps (in epoch_num or in the blocks, one or the other)
      run.samples = max(run.samples, found["block_end"])
    elif unit == "samples" and run.samples < found["global_batch_size"]:
      # an epoch_num below one batch is no sample count (NVIDIA's v1.0 BERT logs 1 in every
      # eval): the samples trained are the train_samples it logs at the end, where it does
      run.samples = found.get("train_samples_end", run.samples)
    elif fig.get("eval_every_epochs"):
      run.samples = _epochs_trained(run, found, fig) * fig["epoch_examples"]
    minutes, why = _official_minutes(path, ruleset, found["parsed"])
    run.counted = not why
    run.minutes = minutes if run.counted else run.minutes
    runs.append(run)
    keys = keys or {k: v for k, v in found.items() if k != "parsed"}
  if not keys:
    raise UsageError(f"{bench_dir}: none of its {len(files)} logs has run_start and run_stop; "
                     "allowed: a result folder with a complete MLPerf result log")
  gbs, epoch = int(keys["global_batch_size"]), int(keys.get("train_samples") or 0)
  epoch_note = ""
  if fig.get("eval_every_epochs"):
    # DLRM: the runs' samples are already counted above; an epoch is the dataset's
    epoch, epoch_note = int(fig["epoch_examples"]), fig["epoch_note"]
  full = fig.get("epoch_examples")
  if full and epoch and epoch != full and abs(epoch * gbs / full - 1) < 0.02:
    # NVIDIA's RetinaNet logs the steps of an epoch as train_samples (4,572 at batch 256 =
    # 1,170,301 images): an epoch is the dataset's images, as the benchmark's figures say
    epoch_note = (f"train_samples {epoch} x batch {gbs} is the {full:,} images of an epoch: "
                  "the log counts steps there")
    epoch = int(full)
  # samples trained: epochs x an epoch, or BERT's samples (v0.7's BERT logs counted steps);
  # GPT-3's logs count tokens where the RCPs count sequences
  per = epoch if unit == "epochs" else gbs if ruleset == "0.7.0" else 1
  if fig.get("eval_every_epochs"):
    per = 1                                      # counted in samples by _epochs_trained
  if fig.get("log_counts") == "tokens":
    per = 1.0 / fig["sequence_length"]
  for run in runs:
    run.samples *= per or 1
  scaling = summarize.scaling_factor(bench_dir)
  counted = [r.minutes for r in runs if r.counted]
  score, _ = summarize.olympic_minutes(counted, len(runs) - len(counted),
                                       summarize.drop_count(benchmark))
  return Measured(benchmark=benchmark, round=round_,
                  org=os.path.basename(org_dir), system=system,
                  accelerator=desc["accelerator"], chips=desc["chips"], global_batch=gbs,
                  train_samples=epoch, runs=runs,
                  score_minutes=None if score is None else score * scaling,
                  machine=machine_of(desc["accelerator"], system), sample_unit=unit,
                  per_node=desc["per_node"], scaling=scaling, path=bench_dir,
                  network=desc.get("network"), optimizer=keys.get("opt_name", ""),
                  grad_accum=int(keys.get("gradient_accumulation_steps") or 1),
                  epoch_note=epoch_note)


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
          "nodes": nodes, "per_node": per, "system_name": str(desc.get("system_name", "")),
          "network": network_of(desc.get("host_networking", ""))}


def read_harness_csv(path) -> Measured:
  """This harness's result CSV: its successful rows of one workload x framework x preset x
  device count, their logs (the log_path column)."""
  from harness import registry, results
  frame = results.read_csv(path)
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
                  parameters=parameters, per_node=int(first["num_devices"]), path=path,
                  optimizer=keys.get("opt_name", ""))


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
                   "stdev": float(np.std(epochs)), "runs": max(len(epochs) - 2 * drop, 1)})
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
            "stdev": float(np.interp(bs, [lo["bs"], hi["bs"]], [lo["stdev"], hi["stdev"]])),
            "runs": min(lo["runs"], hi["runs"])}
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
      # the ratio of two RCP means is itself uncertain: each mean's standard error (its
      # runs' stdev over the square root of the runs its olympic mean keeps), relative
      ratio_spread = math.hypot(*(p["stdev"] / p["mean"] / math.sqrt(p["runs"])
                                  for p in (at_t, at_s)))
      return {"ratio": at_t["mean"] / at_s["mean"], "spread": at_t["stdev"] / at_t["mean"],
              "ratio_spread": ratio_spread,
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
                     per_node=desc["per_node"], network=desc.get("network"))


def _network_kwargs(kwargs, network, per_node) -> str:
  """Set the network figures of a GPU system from its description's NICs (count and speed):
  K NICs for G GPUs a node. K < G with K dividing G: G/K GPUs share each NIC (the simulator's
  shared rails); any other ratio (K >= G, or K not dividing G): each GPU its own rail of
  K x speed / G, the node's network bandwidth spread evenly. Returns what was applied."""
  nics, speed = network
  if nics < per_node and per_node % nics == 0:
    kwargs.update(nics_per_node=nics, network_bandwidth=speed)
    return f"{nics} NICs of {speed * 8 / 1e9:g} Gb/s a node, {per_node // nics} GPUs a NIC"
  kwargs.update(nics_per_node=0, network_bandwidth=speed * nics / per_node)
  return (f"{nics} NICs of {speed * 8 / 1e9:g} Gb/s a node: {speed * nics / per_node / 1e9:.4g}"
          f" GB/s a GPU")


def make_target(chips, machine, topology=None, accelerator="", per_node=8, link=None,
                network=None) -> Target:
  """The simulator's machine for `chips` chips of a preset (its topology kind, the squarest
  torus or nodes of `per_node`), or of the given link figures (`link`: Machine keywords).
  `network` (NICs a node, bytes/s each: the system description's) replaces a GPU preset's
  network figures; chips whose scale-out ports are on the chip (TPU ICI, Gaudi's RoCE) keep
  the preset's."""
  if chips < 1:
    raise UsageError(f"--chips {chips} is out of range; allowed: >= 1")
  note = ""
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
    if network and kind == "multinode" and machine.startswith("dgx-") and per_node:
      note = ", " + _network_kwargs(kwargs, network, per_node)
    elif kind == "multinode" and per_node and kwargs["nics_per_node"] and (
        per_node % kwargs["nics_per_node"] or kwargs["nics_per_node"] > per_node):
      # the preset's NIC count does not fit this node size: its network spread evenly
      note = ", " + _network_kwargs(kwargs, (kwargs["nics_per_node"],
                                             kwargs["network_bandwidth"]), per_node)
  else:
    kind, shape, kwargs = link.pop("kind"), (0, 0), link
  if topology is None:
    per_node = shape[-1] if kind == "multinode" and per_node is None else per_node
    topology = ("multinode:1x%d" % chips if kind == "multinode" and chips <= per_node else
                tables.scaling_shape(kind, chips, per_node, len(shape)))
  return Target(chips, machine, topology, kwargs, accelerator,
                f"{machine or 'given links'} {topology}{note}")


def wire_bytes(machine, reference_bytes) -> int:
  """Bytes an element of a gradient or an exchanged vector takes on `machine`: 2 where the
  submitters' recipes reduce in half precision (HALF_PRECISION_WIRE), else the reference's."""
  return 2 if (machine or "").startswith(HALF_PRECISION_WIRE) else reference_bytes


def all_reduce_seconds(target: Target):
  """nbytes -> seconds of the fastest all-reduce on the target: the simulator's algorithms,
  and across two or more nodes of NVIDIA GPUs also NCCL's tree (predict_collective), as NCCL
  picks (Gaudi's HCCL and TPUs' ICI have no such tree here)."""
  if target.chips == 1 or not target.topology:    # one chip, or no network known: none
    return lambda nbytes: 0.0
  # one per machine and topology: it remembers each size it timed (a schedule simulation),
  # and a backtest times the same source system for every target of its family
  key = (target.topology, repr(sorted(target.kwargs.items())))
  if key not in _ALL_REDUCE:
    simulated = step_lib._best_all_reduce(target.kwargs, target.topology)  # pylint: disable=protected-access
    kind, shape = machine_lib.parse_topology(target.topology)
    if kind == "multinode" and shape[0] > 1 and (target.machine or "").startswith(NCCL_TREE):
      nodes, gpus = shape
      _ALL_REDUCE[key] = lambda nbytes: min(simulated(nbytes), collective.tree_all_reduce_seconds(
          target.kwargs, nodes, gpus, nbytes))
    else:
      _ALL_REDUCE[key] = simulated
  return _ALL_REDUCE[key]


_ALL_REDUCE = {}
_ALL_TO_ALL = {}


def exposed_all_reduce(params, compute_s, target: Target) -> tuple[float, float]:
  """(all-reduce seconds in all, seconds exposed after the backward pass) of a step whose
  compute takes compute_s (a third forward, two thirds backward)."""
  sizes = [params * wire_bytes(target.machine, GRADIENT_BYTES) / SPLIT_TENSORS] * SPLIT_TENSORS
  ready = step_lib.buckets(sizes, step_lib.BUCKET_BYTES["jax"], compute_s * 2 / 3, compute_s / 3)
  seconds = all_reduce_seconds(target)
  return sum(seconds(b) for _, b in ready), step_lib.overlap(ready, seconds, compute_s)


def all_to_all_bytes(fig, per_chip, machine=None, share=1.0) -> float:
  """The bytes one chip's vector holds in one of DLRM's all-to-alls: its examples' pooled
  vectors, one a table (features) of embedding_dim floats. Each chip computes every example's
  vectors of the tables it holds and sends each peer its examples' ones: per chip that is its
  own examples' vectors of every table, whichever tables it holds (tables split evenly); x
  `share`, the part of them that travels at all (infrequent_share)."""
  emb = fig["embedding"]
  return per_chip * emb["features"] * emb["dim"] * wire_bytes(machine, EMBEDDING_BYTES) * share


def infrequent_share(fig, round_, target) -> float:
  """The share of DLRM's looked-up vectors that travel in its all-to-alls. HugeCTR's hybrid
  embedding keeps the frequent rows on every GPU (their gradients join the dense all-reduce)
  and sends only the infrequent rows' vectors; where the benchmark's figures give the mean share
  the submitter's own configuration states (`hybrid_embedding`: its rounds, NVIDIA GPUs across
  two or more nodes, where HugeCTR exchanges them hierarchically over InfiniBand and NVLink),
  that share; else 1, every vector (one node states none; the reference sends every one)."""
  hybrid = fig.get("hybrid_embedding")
  if not hybrid or not target.topology or not _in_rounds(hybrid["rounds"], round_) \
      or not (target.machine or "").startswith(NCCL_TREE):
    return 1.0
  kind, shape = machine_lib.parse_topology(target.topology)
  return hybrid["infrequent_share"] if kind == "multinode" and shape[0] > 1 else 1.0


def all_to_all_seconds(nbytes, target: Target) -> float:
  """One all-to-all of `nbytes` a chip on the target (the simulator's direct schedule, the
  preset's efficiency terms), 0 on one chip."""
  if target.chips == 1 or not target.topology:
    return 0.0
  key = (target.topology, repr(sorted(target.kwargs.items())), nbytes)
  if key not in _ALL_TO_ALL:
    machine = machine_lib.Machine(target.topology, **target.kwargs)
    _ALL_TO_ALL[key] = tables.simulate(machine, "all-to-all", "direct", nbytes)["time_s"]
  return _ALL_TO_ALL[key]


def update_seconds(params, optimizer, machine) -> float:
  """The optimizer's update of `params` parameters on one chip of a preset: its bytes
  (OPTIMIZER_BYTES) over the chip's memory bandwidth; 0 where the preset gives none."""
  preset = machine_lib.PRESETS.get(machine or "")
  if not preset or not preset.memory_bandwidth:
    return 0.0
  per = OPTIMIZER_BYTES.get(optimizer, DEFAULT_OPTIMIZER_BYTES)
  return params * per / preset.memory_bandwidth


def source_target(measured: Measured) -> Target:
  """The measured system itself as a target (its chips, nodes, NICs and preset); an
  accelerator without a preset gives a target that only the same system's prediction can
  use."""
  if measured.machine is None:
    return Target(measured.chips, None, "", {}, measured.accelerator,
                  f"{measured.accelerator} ({measured.chips} chips, no preset)")
  return make_target(measured.chips, measured.machine, None, measured.accelerator,
                     per_node=measured.per_node, network=measured.network)


@dataclasses.dataclass
class Layout:
  """How a step's work splits over the chips: `data` replicas each all-reduce the gradient of
  `params` parameters (the model's share a replica's chip holds), `work` examples a chip
  computes a step, including a pipeline's idle share; the optimizer updates `update_params`
  a chip."""
  data: int
  params: float
  work: float
  update_params: float
  note: str = ""


def layout(measured: Measured, fig: dict, chips: int, batch: int, target: Target) -> Layout:
  """Data-parallel (every chip a replica) unless the benchmark's figures give a tensor and
  pipeline layout (GPT-3): then the data replicas follow from the log's gradient accumulation
  (the micro-batches a replica runs a step, at the reference's micro-batch), the rest is tensor
  x pipeline, the pipeline's bubble (stages - 1) / micro-batches is idle work, and the optimizer
  is sharded over the replicas (the references' distributed optimizer)."""
  lay = fig.get("layout")
  if not lay:
    # XLA on TPU shards the weight update over the data replicas (each updates 1/chips of
    # the weights between a reduce-scatter and an all-gather: Xu et al. 2020, arXiv
    # 2004.13336, used in Google's MLPerf submissions); the GPU recipes update every weight
    sharded = (target.machine or "").startswith(SHARDED_UPDATE)
    # a chip of several TensorCores splits its examples between them: below one example a
    # core, a core idles (or splits an image spatially), so the chip's step is that of one
    # example a core
    work = max(batch / chips, TENSOR_CORES.get(target.machine or "", 1))
    return Layout(chips, fig["parameters"], work,
                  fig["parameters"] / chips if sharded else fig["parameters"],
                  "the weight update sharded over the replicas (XLA)" if sharded else "")
  gpu = (target.machine or measured.machine or "").startswith("dgx-")
  ref = lay["gpu" if gpu else "tpu"]
  micro = ref["micro_batch"]
  model = ref["tensor"] * ref["pipeline"]
  if gpu and measured.grad_accum > 1:
    # the source's log states its micro-batches a step: its replicas follow, and its
    # tensor x pipeline size is kept on the target (the same submitter's recipe)
    replicas_s = measured.global_batch // (measured.grad_accum * micro)
    if replicas_s >= 1 and measured.chips % replicas_s == 0:
      model = measured.chips // replicas_s
    note = (f"tensor x pipeline {model} from the log's gradient_accumulation_steps "
            f"{measured.grad_accum} at micro-batch {micro} (the reference's)")
  else:
    note = f"the reference layout: tensor {ref['tensor']} x pipeline {ref['pipeline']}"
  if chips % model:
    raise UsageError(f"{chips} chips do not split into model groups of {model} "
                     f"({note}); allowed: a multiple of {model} chips")
  data = chips // model
  tensor = min(ref["tensor"], model)
  pipeline = max(model // tensor, 1)
  micro_batches = max(batch / (data * micro), 1.0)
  bubble = 1 + (pipeline - 1) / micro_batches
  return Layout(data, fig["parameters"] / model, batch / chips * bubble,
                fig["parameters"] / chips,
                f"{note}; data {data}, pipeline {pipeline}: bubble x{bubble:.4g}")


def data_target(target: Target, lay: Layout) -> Target:
  """The machine a layout's gradient all-reduce runs on: the whole target when every chip is
  a replica; else one chip of each model group, each with its own share of the network (a
  GPU's own rail; a TPU replica's chips spread over the torus: its default shape)."""
  if lay.data == target.chips or target.machine is None:
    return target
  if lay.data == 1:
    return dataclasses.replace(target, chips=1, topology="")
  preset = machine_lib.PRESETS[target.machine]
  kind, _ = machine_lib.parse_topology(preset.topology)
  kwargs = dict(target.kwargs)
  if kind == "multinode":
    kwargs["nics_per_node"] = 0
    return dataclasses.replace(target, chips=lay.data, topology=f"multinode:{lay.data}x1",
                               kwargs=kwargs)
  return make_target(lay.data, target.machine, None, target.accelerator)


@dataclasses.dataclass
class StepParts:
  update: float            # the fixed part: the floor and the optimizer's update
  compute: float           # the fixed part + the examples' compute
  all_reduce: float        # the gradient all-reduce in all
  exposed: float           # of it, what ends after the backward pass
  all_to_all: float        # DLRM's two all-to-alls of pooled vectors (not overlapped)

  @property
  def step(self):
    return self.compute + self.exposed + self.all_to_all


def step_parts(measured, fig, fit, batch, target, speed) -> StepParts:
  """The modelled step of `batch` on `target`: the update, the examples' compute (a chip's
  work x the source's seconds an example, over the chip speed), the gradient all-reduce the
  simulator exposes after the backward pass, DLRM's all-to-alls. On the source's own system
  it is the source's step as source_fit took it apart."""
  lay = layout(measured, fig, target.chips, batch, target)
  update = (fit["floor_s"] + update_seconds(lay.update_params, measured.optimizer,
                                            target.machine)) * fit["update_scale"]
  compute = update + fit["per_example_s"] * lay.work / speed
  total, exposed = exposed_all_reduce(lay.params, compute, data_target(target, lay))
  a2a = 0.0
  if fig.get("embedding"):
    a2a = 2 * all_to_all_seconds(all_to_all_bytes(fig, batch / target.chips, target.machine,
                                                  infrequent_share(fig, measured.round, target)),
                                 target)
  return StepParts(update, compute, total, exposed, a2a)


def source_fit(measured, fig, base, source) -> dict:
  """What the source's measured step says, one point: less its all-to-alls and the
  all-reduce the simulator exposes there, less the update, the rest is per example (the
  assumption one size makes: no other fixed part); the achieved fraction of the roofline is
  the benchmark's FLOPs at the source's examples over the peak, over that rest."""
  lay = layout(measured, fig, source.chips, measured.global_batch, source)
  optimizer = update_seconds(lay.update_params, measured.optimizer, source.machine)
  a2a = 0.0
  if fig.get("embedding"):
    a2a = 2 * all_to_all_seconds(all_to_all_bytes(fig, measured.per_chip, source.machine,
                                                  infrequent_share(fig, measured.round, source)),
                                 source)
  # the compute is what is left of the step once the exposed communication is out; the
  # exposed part depends on the compute, so take it at the step less the all-to-alls
  # (exposure only grows as compute shrinks: this errs towards a larger compute)
  exposed = exposed_all_reduce(lay.params, max(base - a2a, base * 0.05),
                               data_target(source, lay))[1]
  compute = max(base - a2a - exposed, base * 0.05)
  # a measured compute shorter than the floor and the update leaves no time for the examples:
  # this step runs without the floor (HugeCTR captures the whole iteration in one CUDA graph,
  # its release notes say), so its fixed part is the update alone, here and on the target
  floor = LAUNCH_FLOOR_S if LAUNCH_FLOOR_S + optimizer < compute else 0.0
  update = floor + optimizer
  # an update the spec figures make longer than half the measured compute is not what ran
  # (the submitter shards or fuses it): it is capped there, and the cap kept on the target
  capped = update > compute / 2
  scale = min(1.0, compute / 2 / update) if update else 1.0
  update *= scale
  per_example = (compute - update) / lay.work
  preset = machine_lib.PRESETS.get(source.machine or "")
  flops = fig.get("train_flops_per_example")
  achieved = (flops * lay.work / (preset.peak_flops * (compute - update))
              if flops and preset and preset.peak_flops else None)
  return {"per_example_s": per_example, "compute_s": compute, "update_s": update,
          "update_capped": capped, "update_scale": scale, "floor_s": floor,
          "exposed_s": exposed, "all_to_all_s": a2a,
          "achieved_fraction": achieved, "layout": lay.note}


def _model_or_refuse(measured, target, runs, step_s) -> dict:
  """The benchmark's figures, once every input the step model needs from a source on another
  system is known; else one line saying which is missing."""
  unknown = [r.path for r in runs if r.samples <= 0]
  if unknown:
    raise UsageError(f"{unknown[0]}: no samples trained (no epoch_num in its eval_accuracy "
                     "lines, no train_samples at its end); allowed: a log that states them, "
                     "or the measured system at its own batch")
  if measured.parameters:           # this harness's CSV: its own model's count
    fig = dict(_figures_or_none(measured.benchmark, measured.round) or {},
               parameters=measured.parameters, layout=None, embedding=None)
    fig.setdefault("source", "the row's model, counted by its framework")
  else:
    fig = figures(measured.benchmark, measured.round)
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
    if not _chip_speed(measured, target):
      raise UsageError(f"{measured.machine} or {target.machine} has no published bf16 peak, so "
                       "no ratio moves a step between them; allowed: --step-s SECONDS (the "
                       f"step measured on one {target.machine} chip at {b_s:g} examples)")
  return fig


def _spread(values) -> float:
  """Relative standard deviation (population) of positive values; 0 for fewer than two."""
  values = [v for v in values if v and v == v]
  if len(values) < 2:
    return 0.0
  return float(np.std(values) / np.mean(values))


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
          and target.machine == own.machine and target.topology == own.topology
          and target.kwargs == own.kwargs)
  runs, failed = measured.scored()
  b_s, b_t = measured.per_chip, batch / target.chips
  if not same:
    if batch < target.chips:      # (the measured system may itself split examples over chips)
      raise UsageError(f"--batch {batch} is below the {target.chips} chips; allowed: at least "
                       "one example a chip")
    fig = _model_or_refuse(measured, target, runs, step_s)
  conv = convergence(measured, batch)
  # each run's steady step: its training time (evals out) over the steps it trained
  steps_run = [max(math.ceil(r.samples / measured.global_batch), 1) for r in runs]
  per_step = [(r.minutes * 60 - r.eval_s - r.tail_s) / n for r, n in zip(runs, steps_run)]
  measured_step = statistics.median(per_step)
  eval_each = statistics.mean(r.eval_s / r.evals for r in runs if r.evals) \
      if any(r.evals for r in runs) else 0.0
  out = {"benchmark": measured.benchmark, "from": f"{measured.org} {measured.system}",
         "from_chips": measured.chips, "from_batch": measured.global_batch,
         "measured_minutes": measured.score_minutes, "to": target.source,
         "chips": target.chips, "batch": batch, "per_chip": b_t,
         "convergence": conv["source"], "samples_ratio": conv["ratio"],
         "rcp_spread": conv.get("spread", 0.0),
         "rcp_ratio_spread": conv.get("ratio_spread", 0.0),
         "sample_unit": measured.sample_unit, "same_system": same,
         "measured_step_s": measured_step, "given_step_s": step_s,
         "scaling_factor": measured.scaling, "runs": len(runs), "failed_runs": failed,
         "epoch_note": measured.epoch_note}
  if same:
    step_ratio = eval_ratio = 1.0
    fig = _figures_or_none(measured.benchmark, measured.round) or {}
    out.update(parameters=measured.parameters or fig.get("parameters"),
               figures_source=fig.get("source"), source_exposed_s=None, compute_s=None,
               all_reduce_s=None, exposed_s=None, all_to_all_s=None, fixed_s=None,
               achieved_fraction=None, layout=None, chip_speed=1.0)
  else:
    # the source: its median step, or the step given for one chip of the target's kind
    if step_s is None:
      base, source, speed = measured_step, own, _chip_speed(measured, target)
    else:
      base, speed = step_s, 1.0
      source = dataclasses.replace(target, chips=1, topology="ring:1")
    fit = source_fit(measured, fig, base, source)
    src = step_parts(measured, fig, fit, measured.global_batch, source, 1.0)
    tgt = step_parts(measured, fig, fit, batch, target, speed)
    # the model's change from the source to the target, applied to the measured step: the
    # model reproduces its own source exactly, and the measured step's parts it does not hold
    # (the input pipeline, for one) scale as the modelled ones do
    step_ratio = tgt.step / src.step * (base / measured_step)
    # an eval whose metric is a sum over the examples reduced on the chips (accuracy, a loss:
    # a few numbers all-reduced) is forward passes over a fixed eval set split over the chips:
    # no fixed part; one that needs every output at once (DLRM's AUC ranks every score; COCO
    # and OpenImages mAP run on the hosts) keeps EVAL_FIXED_S
    eval_fixed = 0.0 if fig.get("eval_on_device") else min(EVAL_FIXED_S, eval_each / 2)
    eval_s = (eval_fixed + (eval_each - eval_fixed) * measured.chips / target.chips) / speed
    eval_ratio = eval_s / eval_each * (base / measured_step) if eval_each else 1.0
    out.update(parameters=fig["parameters"], figures_source=fig.get("source"),
               all_reduced_parameters=layout(measured, fig, target.chips, batch,
                                             target).params,
               source_exposed_s=fit["exposed_s"], compute_s=tgt.compute,
               all_reduce_s=tgt.all_reduce, exposed_s=tgt.exposed, all_to_all_s=tgt.all_to_all,
               fixed_s=tgt.update, source_fixed_s=fit["update_s"],
               optimizer_update_s=update_seconds(
                   layout(measured, fig, target.chips, batch, target).update_params,
                   measured.optimizer, target.machine) * fit["update_scale"],
               update_capped=fit["update_capped"], achieved_fraction=fit["achieved_fraction"],
               layout=fit["layout"] or None, chip_speed=speed,
               all_to_all_share=infrequent_share(fig, measured.round, target)
               if fig.get("embedding") else None,
               gradient_bytes=wire_bytes(target.machine, GRADIENT_BYTES),
               floor_s=fit["floor_s"] * fit["update_scale"])
  out["step_ratio"], out["eval_ratio"] = step_ratio, eval_ratio
  out["step_s"] = measured_step * step_ratio
  out["eval_s"] = eval_each * eval_ratio
  # the last asynchronous eval's host part (_host_parts) runs on one host over the whole eval
  # set: carried as measured, whatever the chips
  out["tail_s"] = statistics.mean(r.tail_s for r in runs)
  # every measured run carried to the target: its samples x the RCP ratio, its steps at the
  # target's batch, its own step and evals scaled, its tail; scored as the official summarizer
  # scores
  per_run = []
  for run, step in zip(runs, per_step):
    samples = run.samples * conv["ratio"]
    steps = max(math.ceil(samples / batch), 1)
    evals = run.evals * conv["ratio"]
    each = run.eval_s / run.evals if run.evals else 0.0
    per_run.append({"samples": samples, "steps": steps, "evals": evals,
                    "minutes": (steps * step * step_ratio + evals * each * eval_ratio
                                + run.tail_s) / 60})
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
  out.update(prediction_range(out, len(runs), summarize.drop_count(measured.benchmark)))
  return out


def prediction_range(out, runs, drop) -> dict:
  """The range a measured score should fall in: the prediction x/÷ exp(h), h combining the
  model's own error (MODEL_ERROR, as a log ratio; none on the source's own system, which is
  its measured score) with RANGE_SIGMAS standard errors of (predicted - measured) were the
  model exact (as log1p of that relative half-width). Both are means of runs whose time
  varies as their samples to converge do: the source's own runs give their spread (carried
  over, their relative standard deviation), the target's runs the RCP's at the target's
  batch (when the batch moves; else the same as the source's), each over the runs a score
  averages (the olympic mean drops `drop` of each end); and, when the batch moves, the RCP
  ratio's own standard error (each RCP mean's, relative: convergence's ratio_spread)."""
  counted = max(runs - 2 * drop, 1)
  source = _spread(out["runs_minutes"]) / math.sqrt(counted)
  target = (out["rcp_spread"] if out["samples_ratio"] != 1.0 else
            _spread(out["runs_minutes"])) / math.sqrt(counted)
  runs_half = RANGE_SIGMAS * math.hypot(source, target, out.get("rcp_ratio_spread", 0.0))
  model = 0.0 if out.get("same_system") else MODEL_ERROR
  half = math.hypot(math.log1p(runs_half), model)
  return {"range_low": out["predicted_minutes"] * math.exp(-half),
          "range_high": out["predicted_minutes"] * math.exp(half),
          "range_relative": math.expm1(half), "range_runs": runs_half, "range_model": model}


def conformal_model_error(rows, level=MODEL_ERROR_LEVEL) -> float:
  """MODEL_ERROR from backtest rows: the ceil((n + 1) x level)-th smallest |log(predicted /
  measured)| of the n scored pairs (their largest where that rank is beyond n)."""
  errors = sorted(abs(math.log1p(r["error"])) for r in rows if r["error"] is not None)
  if not errors:
    raise UsageError("--calibrate: no scored pair in the backtest; allowed: folders holding "
                     "MLPerf scaling families with measured scores")
  return errors[min(math.ceil((len(errors) + 1) * level), len(errors)) - 1]


def _chip_speed(measured, target) -> float:
  """How much faster a target chip computes than a measured one: the ratio of the presets'
  bf16 peaks when the accelerators differ and both are known, 1 when the same, 0 where a
  preset has no published peak (refused)."""
  if not target.machine or target.machine == measured.machine or not measured.machine:
    return 1.0
  a, b = machine_lib.PRESETS[measured.machine], machine_lib.PRESETS[target.machine]
  return b.peak_flops / a.peak_flops if a.peak_flops and b.peak_flops else 0.0


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


# A backtest row's fields (--json prints them in this order)
BACKTEST_KEYS = ("family", "from", "to", "predicted_minutes", "measured_minutes", "error",
                 "range_low", "range_high", "inside_range", "reason")


def _row(family, source, to, reason="") -> dict:
  return {"family": family, "from": source, "to": to, "predicted_minutes": None,
          "measured_minutes": None, "error": None, "range_low": None, "range_high": None,
          "inside_range": None, "reason": reason, "accelerator": family.split()[-1],
          "benchmark": family.split()[-2] if len(family.split()) >= 2 else ""}


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
        row["range_low"], row["range_high"] = out["range_low"], out["range_high"]
        if row["measured_minutes"]:
          row["error"] = row["predicted_minutes"] / row["measured_minutes"] - 1
          row["inside_range"] = bool(out["range_low"] <= row["measured_minutes"]
                                     <= out["range_high"])
      except (UsageError, *DATA_ERRORS) as e:
        # a refusal about the model (no preset, no parameter count) names the source folder
        reason = _one_line(e, smallest[1])
        row["reason"] = reason if smallest[1] in reason or os.sep in reason.split(":")[0] \
            else f"{smallest[1]}: {reason}"
      rows.append(row)
  return rows


def backtest_summary(rows) -> dict:
  errors = [abs(r["error"]) for r in rows if r["error"] is not None]
  inside = sum(bool(r.get("inside_range")) for r in rows if r["error"] is not None)
  return {"predicted": len(errors), "refused": sum(bool(r["reason"]) for r in rows),
          "unscored": sum(not r["reason"] and r["error"] is None for r in rows),
          "median_abs_error": statistics.median(errors) if errors else None,
          "worst_abs_error": max(errors) if errors else None,
          "inside": inside, "inside_share": inside / len(errors) if errors else None}


def backtest_groups(rows) -> list[dict]:
  """The backtest's scored rows by accelerator and benchmark: count, median and worst
  |error|, the share whose measured score is inside the stated range."""
  groups = {}
  for r in rows:
    if r["error"] is not None:
      groups.setdefault((r["accelerator"], r["benchmark"]), []).append(r)
  out = []
  for (accel, bench), members in sorted(groups.items()):
    errors = [abs(r["error"]) for r in members]
    out.append({"accelerator": accel, "benchmark": bench, "pairs": len(members),
                "median_abs_error": statistics.median(errors), "worst_abs_error": max(errors),
                "inside_share": sum(bool(r["inside_range"]) for r in members) / len(members)})
  return out
