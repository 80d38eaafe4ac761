"""Runs the official mlperf_logging compliance checker on a log, with the ruleset that
rules/<benchmark>.yaml pins (or its custom rule file, for benchmarks MLPerf has no rules for)."""
import json
import os
import subprocess
import sys
import tempfile

from harness import rules
from harness.errors import UsageError


def benchmark_of(log_path: str) -> str:
  """The submission_benchmark logged in an MLPerf log."""
  try:
    with open(log_path, encoding="latin-1") as f:
      for line in f:
        if line.startswith(":::MLLOG ") and '"submission_benchmark"' in line:
          return json.loads(line[len(":::MLLOG "):])["value"]
  except OSError as e:
    raise UsageError(f"{log_path!r} cannot be read ({e.strerror}); allowed: an MLPerf log "
                     "file") from None
  raise UsageError(f"{log_path!r} has no submission_benchmark line; allowed: an MLPerf log "
                   "written by run_benchmark.py or an MLPerf submission")


def check(log_path: str, ruleset: str | None = None) -> tuple[bool, str]:
  """(passed, the checker's report). Uses the rules/ ruleset unless one is given."""
  if not os.path.isfile(log_path):
    raise UsageError(f"{log_path!r}: no such log file")
  bench_rules = rules.load(benchmark_of(log_path))
  command = [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
             "--ruleset", ruleset or bench_rules.ruleset]
  if bench_rules.checker_config and not ruleset:
    command += ["--config", bench_rules.checker_config]   # must be absolute (checker quirk)
  with tempfile.TemporaryDirectory() as tmp:
    report_path = os.path.join(tmp, "checker.log")
    proc = subprocess.run(command + ["--log_output", report_path, os.path.abspath(log_path)],
                          capture_output=True, text=True, cwd=tmp)
    report = proc.stdout + proc.stderr
    if os.path.exists(report_path):
      with open(report_path) as f:
        report = f.read() or report
  passed = proc.returncode == 0 and "SUCCESS" in report
  return passed, report.strip()
