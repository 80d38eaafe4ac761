"""Result rows and the result CSV: one row per run, appended atomically.

Atomic append: the row (and the header, for a new file) is encoded first and written with a
single os.write on an O_APPEND descriptor while holding an exclusive flock. A killed run
therefore leaves either the whole line or nothing, and concurrent writers never interleave.
"""
import csv
import dataclasses
import fcntl
import io
import os

import pandas as pd

from harness.errors import UsageError


@dataclasses.dataclass
class ResultRow:
  run_id: str
  started_at: str                 # UTC ISO 8601
  system: str
  workload: str
  mlperf_benchmark: str
  framework: str
  preset: str
  status: str                     # success | aborted
  abort_reason: str
  time_to_train_s: float | None   # run_stop - run_start (None for synthetic runs)
  init_s: float
  epochs_to_converge: float | None
  samples_to_converge: int | None
  final_metric: float | None
  metric_name: str
  target: float | None
  global_batch_size: int
  num_devices: int
  device_kind: str
  mesh: str
  seed: int
  throughput: float | None        # training samples/s over the timed blocks
  mfu: float | None
  host: str
  git_commit: str
  versions: str
  log_path: str


COLUMNS = [f.name for f in dataclasses.fields(ResultRow)]


def _encode(values: list) -> bytes:
  buffer = io.StringIO()
  csv.writer(buffer, lineterminator="\n").writerow(["" if v is None else v for v in values])
  return buffer.getvalue().encode()


def check_writable(path: str, require_our_header: bool = True) -> None:
  """Fails (UsageError) before a run starts if the row could not be appended to `path`."""
  parent = os.path.dirname(os.path.abspath(path))
  if os.path.isdir(path):
    raise UsageError(f"--results {path!r} is a directory; allowed: a CSV file path")
  if os.path.exists(path):
    if not os.access(path, os.W_OK):
      raise UsageError(f"--results {path!r} cannot be written (permission denied)")
    header = _read_header(path) if require_our_header else None
    if header is not None and header != COLUMNS:
      raise UsageError(f"--results {path!r} has other columns than a result CSV of this "
                       "harness; allowed: a new file or one written by run_benchmark.py")
    return
  existing = parent
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing) or not os.access(existing, os.W_OK):
    raise UsageError(f"--results {path!r} cannot be created: {existing!r} is not a "
                     "writable directory")


def _read_header(path):
  with open(path, newline="") as f:
    first = f.readline()
  return next(csv.reader([first])) if first.strip() else None


def append_row(path: str, row: ResultRow) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  values = [getattr(row, c) for c in COLUMNS]
  fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    new_file = os.fstat(fd).st_size == 0
    os.write(fd, (_encode(COLUMNS) if new_file else b"") + _encode(values))
    os.fsync(fd)
  finally:
    os.close(fd)          # closing releases the lock


def read_csv(path: str) -> pd.DataFrame:
  """Reads a result CSV of ours; UsageError naming the file if it cannot be read."""
  try:
    frame = pd.read_csv(path)
  except FileNotFoundError:
    raise UsageError(f"{path!r}: no such file; allowed: a result CSV written by "
                     "run_benchmark.py") from None
  except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
    raise UsageError(f"{path!r} is not a readable result CSV ({type(e).__name__})") from None
  missing = [c for c in ("workload", "framework", "preset", "status", "time_to_train_s")
             if c not in frame.columns]
  if missing:
    raise UsageError(f"{path!r} is not a result CSV of this harness: missing columns "
                     f"{', '.join(missing)}")
  return frame
