"""A result row's MLPerf log: where it is, and its eval curve (report, compare, bench scripts)."""
import json
import os


def resolve_log(log_path, csv_path):
  """A row's log_path is relative to where the run started: try there, then beside the CSV's
  folder and its parent (a committed results/ folder); last, the file's name in a logs/ folder
  beside the CSV (the CI's pages, where the logs are copied: an `ab` run's path is absolute)."""
  if not isinstance(log_path, str) or not log_path:
    return None
  csv_dir = os.path.dirname(os.path.abspath(csv_path))
  if os.path.isabs(log_path):
    candidates = [log_path]
  else:
    candidates = [os.path.join(base, log_path)
                  for base in (os.getcwd(), csv_dir, os.path.dirname(csv_dir))]
  candidates.append(os.path.join(csv_dir, "logs", os.path.basename(log_path)))
  return next((path for path in candidates if os.path.isfile(path)), None)


def eval_curve(log_path):
  """[(epoch_num, eval_accuracy as logged)] from an MLPerf log."""
  points = []
  with open(log_path, encoding="latin-1") as f:
    for line in f:
      if line.startswith(":::MLLOG ") and '"eval_accuracy"' in line:
        event = json.loads(line[len(":::MLLOG "):])
        points.append((event["metadata"].get("epoch_num"), float(event["value"])))
  return points


def first_parting(base_log, new_log):
  """Where two runs' eval curves first differ: (eval index from 1, epoch_num, base value, new
  value), one side's value None where its curve ended first; None if the curves are equal.
  Values are compared as logged: with the same seed and versions a deterministic run logs the
  same digits, so any difference is a change of numerics."""
  base, new = eval_curve(base_log), eval_curve(new_log)
  for i in range(max(len(base), len(new))):
    b = base[i] if i < len(base) else (None, None)
    n = new[i] if i < len(new) else (None, None)
    if b != n:
      return i + 1, b[0] if b[0] is not None else n[0], b[1], n[1]
  return None
