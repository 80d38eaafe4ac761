"""MLPerf olympic scoring, for result CSVs of ours and for official MLPerf result folders.

Scoring follows mlperf_logging.result_summarizer (training): a run's time is
run_stop - run_start; of the converged runs, sorted, the fastest and the slowest are dropped
and the rest averaged. One non-converged run may count as the dropped slowest (then only the
fastest converged run is dropped); two or more invalidate the score. A score also needs the
benchmark's required run count (rules/*.yaml for ours, mlperf_logging.benchmark_meta for
MLPerf folders), where the official tool averages whatever files exist.
"""
import glob
import json
import os

import pandas as pd
from mlperf_logging import benchmark_meta
from mlperf_logging.compliance_checker import mlp_parser

from harness import results, rules
from harness.errors import UsageError

SUMMARY_COLUMNS = ["system", "system_name", "benchmark", "framework", "preset", "runs",
                   "converged", "score_min", "note"]


def olympic_minutes(minutes: list[float], failed: int) -> tuple[float | None, str]:
  """(score, note) for the converged runs' minutes and the count of non-converged runs."""
  if failed > 1:
    return None, f"{failed} runs did not converge; at most 1 is allowed"
  scores = sorted(minutes)
  kept = scores[1:len(scores) - (1 - failed)]
  if not kept:
    return None, f"{len(scores)} converged runs are too few to drop the fastest and slowest"
  return sum(kept) / len(kept), ""


def _score(system, system_name, benchmark, framework, preset, minutes, failed, required):
  total = len(minutes) + failed
  score, note = olympic_minutes(minutes, failed)
  if total < required:
    score, note = None, f"{total} runs; {benchmark} needs {required}"
  return dict(system=system, system_name=system_name, benchmark=benchmark, framework=framework,
              preset=preset, runs=total, converged=len(minutes), score_min=score, note=note)


# ----------------------------------------------------------------------------- our CSVs

def summarize_csv(path: str) -> list[dict]:
  frame = results.read_csv(path)
  frame = frame[frame["preset"] != "synthetic"]            # throughput runs have no target
  rows = []
  for (system, benchmark, framework, preset), group in frame.groupby(
      ["system", "mlperf_benchmark", "framework", "preset"], sort=True):
    required = rules.load(benchmark).runs_required
    group = group.sort_values("started_at").tail(required)  # the latest `required` runs
    ok = group[group["status"] == "success"]
    rows.append(_score(system, system, benchmark, framework, preset,
                       list(ok["time_to_train_s"] / 60.0), len(group) - len(ok), required))
  return rows


# ----------------------------------------------------------------------------- MLPerf folders

def run_minutes(log_path: str, ruleset: str = "0.7.0") -> tuple[float | None, bool]:
  """(minutes from the first run_start to the first run_stop, converged?) of an MLPerf log."""
  lines, _ = mlp_parser.parse_file(log_path, ruleset=ruleset)
  start = next((l for l in lines if l.key == "run_start"), None)
  stop = next((l for l in lines if l.key == "run_stop"), None)
  if start is None or stop is None:
    return None, False
  status = (stop.value.get("metadata") or {}).get("status")
  return (stop.timestamp - start.timestamp) / 60000.0, status == "success"


def _system_dirs(path):
  """[(system folder, systems/*.json or None)] for an org folder, a results/ folder, or one
  system folder (`<system>/<benchmark>/result_*.txt`)."""
  path = os.path.abspath(path)
  if os.path.isdir(os.path.join(path, "results")):
    results_dir = os.path.join(path, "results")
  elif glob.glob(os.path.join(path, "*", "*", "result_*.txt")):
    results_dir = path
  elif glob.glob(os.path.join(path, "*", "result_*.txt")):
    return [(path, _system_json(os.path.dirname(os.path.dirname(path)), os.path.basename(path)))]
  else:
    raise UsageError(f"{path!r} holds no MLPerf results; allowed: a result CSV, a submission "
                     "folder with results/ and systems/, or <system>/<benchmark>/result_*.txt")
  org = os.path.dirname(results_dir)
  return [(d, _system_json(org, os.path.basename(d)))
          for d in sorted(glob.glob(os.path.join(results_dir, "*"))) if os.path.isdir(d)]


def _system_json(org, system):
  path = os.path.join(org, "systems", f"{system}.json")
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  return None


def summarize_mlperf(path: str, usage="training") -> list[dict]:
  rows = []
  counts = benchmark_meta._ALL_RESULT_FILE_COUNTS[usage]  # the official run-count table
  for system_dir, desc in _system_dirs(path):
    system = os.path.basename(system_dir)
    desc = desc or {}
    for bench_dir in sorted(glob.glob(os.path.join(system_dir, "*"))):
      files = glob.glob(os.path.join(bench_dir, "result_*.txt"))
      if not files:
        continue
      benchmark = os.path.basename(bench_dir)
      benchmark = "maskrcnn" if benchmark == "mask" else benchmark
      minutes, failed = [], 0
      for log in files:
        value, converged = run_minutes(log)
        if converged:
          minutes.append(value)
        else:
          failed += 1
      rows.append(_score(system, desc.get("system_name", system), benchmark,
                         desc.get("framework", ""), desc.get("division", ""), minutes, failed,
                         counts.get(benchmark, 0)))
  return rows


def summarize(paths: list[str]) -> pd.DataFrame:
  rows = []
  for path in paths:
    if os.path.isfile(path):
      rows += summarize_csv(path)
    elif os.path.isdir(path):
      rows += summarize_mlperf(path)
    else:
      raise UsageError(f"{path!r}: no such file or folder; allowed: a result CSV or an MLPerf "
                       "results folder")
  return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
