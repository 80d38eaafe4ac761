"""`check` on an MLPerf submission or results folder: mlperf_logging's package_checker with the
round's ruleset (system descriptions, run counts, per-log compliance, seeds, and the RCP check
for closed-division benchmarks that have RCPs), boiled down to one verdict per file.

The package checker's RCP step rewrites or deletes scaling.json in the folder it checks, so it
runs on a copy; the user's folder is only read.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from mlperf_logging.rcp_checker import rcp_checker

from harness import summarize
from harness.errors import UsageError

_DIR = re.compile(r"Running compliance checks in dir (.+)$")
_FILE = re.compile(r"Running compliance on file: (.+)$")
_RCP = re.compile(r"RCP Test (Passed|Failed): (.*)$")


def rcp_batch_sizes(benchmark: str, ruleset: str) -> list[int]:
  """Global batch sizes with a reference convergence point in mlperf_logging for this round
  (empty: no RCPs, e.g. before 1.0.0 or for a benchmark the round has none for)."""
  path = os.path.join(os.path.dirname(rcp_checker.__file__), f"training_{ruleset}",
                      f"rcps_{benchmark}.json")
  if not os.path.isfile(path):
    return []
  with open(path) as f:
    return sorted({int(record["BS"]) for record in json.load(f).values()})


def _org_folder(path):
  path = os.path.abspath(path)
  if os.path.basename(path) == "results" and os.path.isdir(
      os.path.join(os.path.dirname(path), "systems")):
    path = os.path.dirname(path)
  if not (os.path.isdir(os.path.join(path, "results")) and
          os.path.isdir(os.path.join(path, "systems"))):
    raise UsageError(f"{path!r} is not a submission folder; allowed: an MLPerf log, or a folder "
                     "with results/<system>/<benchmark>/result_*.txt and systems/<system>.json "
                     "(or its results/ folder)")
  return path


def _verdicts(report):
  """Per benchmark folder and per log file: (name, [findings]) from the checker's own log."""
  files, dirs, package = {}, {}, []
  current_file = current_dir = None
  for line in report.splitlines():
    level, _, text = line.partition(" - ")
    text = text.strip()
    if match := _DIR.search(text):
      current_dir, current_file = match[1], None
      dirs[current_dir] = []
    elif match := _FILE.search(text):
      current_file = match[1]
      files[current_file] = []
    elif text.startswith("Running Seed Checker") or text.startswith("Running RCP Checker"):
      current_file = None                   # what follows is about the benchmark folder
    elif match := _RCP.search(text):
      dirs.setdefault(current_dir, []).append(f"RCP {match[1].lower()}: {match[2]}")
    elif "do not comply" in text or "does not comply" in text:   # the folder's tally
      dirs.setdefault(current_dir, []).append(f"{level.lower()}: {text}")
    elif level in ("WARNING", "ERROR") and text:
      target = (files[current_file] if current_file else
                dirs.setdefault(current_dir, []) if current_dir else package)
      target.append(f"{level.lower()}: {text}")
  return files, {k: v for k, v in dirs.items() if k}, package


def check_package(path: str, ruleset: str | None = None) -> tuple[bool, list[str]]:
  """(passed, report lines): one line per log and per benchmark folder, then the verdict."""
  org = _org_folder(path)
  ruleset = summarize.ruleset_of(path, ruleset)
  with tempfile.TemporaryDirectory() as tmp:
    copy = os.path.join(tmp, os.path.basename(org))
    for part in ("results", "systems"):
      shutil.copytree(os.path.join(org, part), os.path.join(copy, part))
    log = os.path.join(tmp, "package_checker.log")
    proc = subprocess.run([sys.executable, "-m", "mlperf_logging.package_checker", copy,
                           "training", ruleset, "--log_output", log],
                          capture_output=True, text=True, cwd=tmp)
    report = open(log).read() if os.path.exists(log) else proc.stdout + proc.stderr
    report = report.replace(copy + os.sep, "")      # paths relative to the user's folder
    files, dirs, package = _verdicts(report)
  passed = proc.returncode == 0 and "PACKAGE CHECKER FOUND NO ERRORS" in report
  short = lambda findings: [f if len(f) <= 160 else f[:157] + "..." for f in findings]
  files = {k: short(v) for k, v in files.items()}
  dirs = {k: short(v) for k, v in dirs.items()}
  lines = [f"folder {org}, ruleset {ruleset}:"]
  for name in sorted(files):
    # The verdict is the compliance checker's own (its log shows findings, not validity).
    valid = summarize.run_minutes(os.path.join(org, name), ruleset)[1] in (
        "", "no run_start/run_stop")
    findings = files[name]
    lines.append(f"{'PASS' if valid else 'FAIL'}  {name}"
                 + (f"  ({'; '.join(findings)})" if findings else ""))
  for name in sorted(dirs):
    errors = [f for f in dirs[name] if f.startswith(("error", "RCP failed"))]
    lines.append(f"{'FAIL' if errors else 'PASS'}  {name}/  ({'; '.join(dirs[name]) or 'ok'})")
  for finding in package:
    lines.append(f"      {finding}")
  if not files and not dirs:
    lines += [l for l in report.splitlines() if l.startswith(("ERROR", "WARNING"))] or \
        [report.strip()[-2000:]]
  lines.append(f"package check: {'PASSED' if passed else 'FAILED'} ({org}, ruleset {ruleset})")
  return passed, lines
