"""MLPerf olympic scoring, for result CSVs of ours and for official MLPerf result folders.

A run's time is run_stop - run_start. Of the converged runs, sorted, the `drop` fastest and
slowest are dropped and the rest averaged; non-converged runs count as dropped slowest ones, so
more than `drop` of them invalidate the score (drop is 1, and 4 for unet3d).
Our CSVs: the latest rules/*.yaml run count of runs, and a score needs that many.
MLPerf folders: exactly what mlperf_logging.result_summarizer computes for the folder's round
(see the section below), so the two agree on every round in ../shared/mlperf_results.
"""
import contextlib
import glob
import json
import logging
import os
import re

import pandas as pd
import yaml
from mlperf_logging import benchmark_meta
from mlperf_logging.compliance_checker import mlp_compliance, mlp_parser

from harness import results, rules
from harness.errors import UsageError

SUMMARY_COLUMNS = ["system", "system_name", "benchmark", "framework", "preset", "runs",
                   "converged", "score_min", "note"]


def olympic_minutes(minutes: list[float], failed: int, drop: int = 1
                    ) -> tuple[float | None, str]:
  """(score, note) for the converged runs' minutes and the count of non-converged runs."""
  if failed > drop:
    return None, f"{failed} runs did not converge or failed the check; at most {drop} allowed"
  scores = sorted(minutes)
  kept = scores[drop:len(scores) - (drop - failed)]
  if not kept:
    return None, (f"{len(scores)} converged runs are too few to drop the {drop} fastest and "
                  "slowest")
  return sum(kept) / len(kept), ""


def _row(system, system_name, benchmark, framework, preset, runs, converged, score, note):
  return dict(system=system, system_name=system_name, benchmark=benchmark, framework=framework,
              preset=preset, runs=runs, converged=converged, score_min=score, note=note)


def _score(system, system_name, benchmark, framework, preset, minutes, failed, required):
  total = len(minutes) + failed
  score, note = olympic_minutes(minutes, failed)
  if total < required:
    score, note = None, f"{total} runs; {benchmark} needs {required}"
  return _row(system, system_name, benchmark, framework, preset, total, len(minutes), score,
              note)


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
# Scored as mlperf_logging.result_summarizer scores them (training, strong scaling): every log is
# first run through the round's compliance checker and parsed with the round's ruleset; a log
# that fails either counts as a dropped run, like a non-converged one; the olympic average
# drops `drop` fastest and slowest; the result is multiplied by the benchmark folder's
# scaling.json (the RCP normalisation the review committee committed). The official tool does
# not require the run count, so a short folder keeps its score and only gets a note.

ROUND_FOLDER = re.compile(r"^training_v(\d+)\.(\d+)$")


def drop_count(benchmark: str) -> int:
  """Fastest and slowest runs the olympic average drops (result_summarizer and rcp_checker
  both use 4 for unet3d's 40 runs, 1 otherwise; benchmark_meta does not hold this rule)."""
  return 4 if benchmark == "unet3d" else 1


def known_rulesets() -> list[str]:
  return sorted(r for r in mlp_compliance.rule_choices()
                if os.path.isdir(os.path.join(os.path.dirname(mlp_compliance.__file__),
                                              f"training_{r}")))


def ruleset_of(path: str, ruleset: str | None = None) -> str:
  """The round's ruleset: the --ruleset given, else from a training_vX.Y folder on the path."""
  allowed = known_rulesets()
  if ruleset is not None:
    if ruleset not in allowed:
      raise UsageError(f"--ruleset {ruleset!r} is unknown; allowed: {', '.join(allowed)}")
    return ruleset
  for part in reversed(os.path.abspath(path).split(os.sep)):
    match = ROUND_FOLDER.match(part)
    if match and f"{match[1]}.{match[2]}.0" in allowed:
      return f"{match[1]}.{match[2]}.0"
  raise UsageError(f"{path!r}: the MLPerf round is not in its path (a training_vX.Y folder); "
                   f"pass --ruleset, allowed: {', '.join(allowed)}")


class _YamlWithLibyamlBaseLoader:
  """The `yaml` module as the compliance checker sees it while summarize runs it, except that
  its BaseLoader is libyaml's CBaseLoader. The checker re-reads its rules files for every log
  it checks, with PyYAML's pure-Python BaseLoader: that was half of a round's summary
  (`summarize` of v0.7's 295 logs: 11.1 -> 5.6 s of CPU, the same CSV). libyaml builds the same
  all-string tree from every rules file mlperf-logging ships (tests/harness/test_summarize.py
  compares them all) ten times faster."""
  BaseLoader = getattr(yaml, "CBaseLoader", yaml.BaseLoader)   # PyYAML built without libyaml

  def __getattr__(self, name):
    return getattr(yaml, name)


@contextlib.contextmanager
def _checker_reads_rules_with_libyaml():
  real, mlp_compliance.yaml = mlp_compliance.yaml, _YamlWithLibyamlBaseLoader()
  try:
    yield
  finally:
    mlp_compliance.yaml = real


def _check_parsed(checker, lines, failed, config) -> bool:
  """The checker's check_file on a log already parsed (its own calls after its parse_file, in
  its order): the log is read and parsed once, not once by the checker and once here."""
  if failed:
    checker.put_message("Log lines had parsing errors.")
  checker.check_loglines(lines, config)
  checker.log_messages()
  return not checker.has_messages()


def run_minutes(log_path: str, ruleset: str, parsed=None) -> tuple[float | None, str]:
  """(minutes from run_start to run_stop, "" or why the run does not count) of an MLPerf log,
  after the round's compliance check, as the official summarizer reads it. `parsed`: the
  log's mlp_parser.parse_file(log_path, ruleset=ruleset), where the caller has already read
  it (predict does: parsing is a third of a backtest)."""
  previous = logging.root.manager.disable
  logging.disable(logging.CRITICAL)          # the checker logs every finding to the root logger
  try:
    lines, failed = parsed or mlp_parser.parse_file(log_path, ruleset=ruleset)
    checker = mlp_compliance.make_checker(usage="training", ruleset=ruleset, quiet=True,
                                          werror=False)   # fresh per log: it keeps state
    with _checker_reads_rules_with_libyaml():
      valid = _check_parsed(checker, lines, failed, f"training_{ruleset}/common.yaml")
  finally:
    logging.disable(previous)
  if not valid:
    return None, "compliance check failed"
  if failed:
    return None, "parse error"
  start = stop = None
  for line in lines:                # the official order: the run_start seen before run_stop
    if line.key == "run_start":
      start = line.timestamp
    if line.key == "run_stop":
      stop = line.timestamp
    if start is not None and stop is not None:
      break
  if start is None or stop is None:
    return None, "no run_start/run_stop"
  return (float(stop) - float(start)) / 60000.0, ""


def scaling_factor(bench_dir: str) -> float:
  """The RCP normalisation committed as scaling.json (1.0 when there is none)."""
  path = os.path.join(bench_dir, "scaling.json")
  if not os.path.isfile(path):
    return 1.0
  with open(path) as f:
    return float(json.load(f)["scaling_factor"])


def _system_dirs(path):
  """[(system folder, systems/*.json or None)] for a round folder of org folders, an org
  folder, a results/ folder, or one system folder (`<system>/<benchmark>/result_*.txt`)."""
  path = os.path.abspath(path)
  orgs = [d for d in sorted(glob.glob(os.path.join(path, "*")))
          if os.path.isdir(os.path.join(d, "results")) and os.path.isdir(os.path.join(d, "systems"))]
  if orgs:                                        # a round folder: training_vX.Y/<org>/...
    return [pair for org in orgs for pair in _system_dirs(org)]
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


def ruleset_benchmarks(ruleset: str) -> list[str]:
  """The benchmarks the round's compliance rules cover (its closed_<benchmark>.yaml files)."""
  folder = os.path.join(os.path.dirname(mlp_compliance.__file__), f"training_{ruleset}")
  names = (os.path.basename(p)[len("closed_"):-len(".yaml")]
           for p in glob.glob(os.path.join(folder, "closed_*.yaml")))
  return sorted(n for n in names if n != "common")


def summarize_mlperf(path: str, ruleset: str | None = None,
                     skipped: list[str] | None = None) -> list[dict]:
  """Rows of the benchmarks the ruleset covers; one line per benchmark folder it does not
  cover is appended to `skipped` (the checker has no rules to read its logs with)."""
  systems = _system_dirs(path)
  ruleset = ruleset_of(path, ruleset)
  covered = ruleset_benchmarks(ruleset)
  counts = benchmark_meta.get_result_file_counts("training")   # the official run counts
  rows = []
  for system_dir, desc in systems:
    system = os.path.basename(system_dir)
    desc = desc or {}
    for bench_dir in sorted(glob.glob(os.path.join(system_dir, "*"))):
      files = glob.glob(os.path.join(bench_dir, "result_*.txt"))
      if not files:
        continue
      benchmark = os.path.basename(bench_dir)
      benchmark = "maskrcnn" if benchmark == "mask" else benchmark
      if benchmark not in covered:
        if skipped is not None:
          skipped.append(f"skipped {system}/{benchmark}: ruleset {ruleset} has no rules for "
                         f"{benchmark} (it covers {', '.join(covered)})")
        continue
      minutes, dropped = [], []
      for log in sorted(files):
        value, why = run_minutes(log, ruleset)
        if why:
          dropped.append(why)
        else:
          minutes.append(value)
      drop = drop_count(benchmark)
      score, note = olympic_minutes(minutes, len(dropped), drop)
      if score is not None:
        score *= scaling_factor(bench_dir)
      notes = [note] if note else []
      for why in sorted(set(dropped)):
        notes.append(f"{dropped.count(why)} dropped: {why}")
      required = counts.get(benchmark, 0)
      if len(files) < required:          # the official tool scores it anyway; say so
        notes.append(f"{len(files)} runs; {benchmark} needs {required}")
      if scaling_factor(bench_dir) != 1.0:
        notes.append(f"x{scaling_factor(bench_dir):.6g} (scaling.json)")
      rows.append(_row(system, desc.get("system_name", system), benchmark,
                       desc.get("framework", ""), desc.get("division", ""), len(files),
                       len(minutes), score, "; ".join(notes)))
  return rows


def summarize(paths: list[str], ruleset: str | None = None) -> pd.DataFrame:
  """One row per (system, benchmark); `ruleset` overrides the round of MLPerf folders. The
  benchmark folders the ruleset does not cover are named in the frame's attrs["skipped"];
  if nothing is covered, a one-line error."""
  rows, skipped = [], []
  for path in paths:
    if os.path.isfile(path):
      rows += summarize_csv(path)
    elif os.path.isdir(path):
      rows += summarize_mlperf(path, ruleset, skipped)
    else:
      raise UsageError(f"{path!r}: no such file or folder; allowed: a result CSV or an MLPerf "
                       "results folder")
  if skipped and not rows:
    raise UsageError(f"--ruleset {ruleset} covers none of the benchmarks in {' '.join(paths)} "
                     f"({len(skipped)} skipped); allowed: a ruleset with rules for them, or "
                     "none (the round's own, from the training_vX.Y folder)")
  frame = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
  frame.attrs["skipped"] = skipped
  return frame
