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
  # How far the run got, whatever its status: an aborted run's progress (a preempted run's
  # epochs and samples trained; final_metric is its last eval). Last: rows of older versions
  # are constructed and read without them.
  epochs_completed: float | None = None
  samples_completed: int | None = None


COLUMNS = [f.name for f in dataclasses.fields(ResultRow)]
# Read as text whatever they look like: a short commit of digits and one "e" ("93e5818") would
# otherwise parse as a float (inf), one of digits only would lose its leading zeros.
TEXT_COLUMNS = [f.name for f in dataclasses.fields(ResultRow) if f.type is str]


def _encode(values: list) -> bytes:
  buffer = io.StringIO()
  csv.writer(buffer, lineterminator="\n").writerow(["" if v is None else v for v in values])
  return buffer.getvalue().encode()


# The columns without which a CSV is not a result CSV of this harness (any version).
CORE_COLUMNS = ["workload", "framework", "preset", "status", "time_to_train_s"]


def check_writable(path: str, require_our_header: bool = True) -> None:
  """Fails (UsageError) before a run starts if the row could not be appended to `path`: the
  file is created (or opened for appending) now, so a run never trains for a file it cannot
  write. A result CSV of an older version (other columns) gets the missing columns first."""
  if os.path.isdir(path):
    raise UsageError(f"--results {path!r} is a directory; allowed: a CSV file path")
  if require_our_header and os.path.exists(path):
    header = _read_header(path)
    if header is not None and not set(CORE_COLUMNS) <= set(header):
      raise UsageError(f"--results {path!r} has other columns than a result CSV of this "
                       "harness; allowed: a new file or one written by run_benchmark.py")
  try:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
  except OSError as e:
    raise UsageError(f"--results {path!r} cannot be written ({e.strerror}); allowed: a CSV "
                     "path in a writable folder") from None
  if require_our_header:
    upgrade_header(path)


def upgrade_header(path: str) -> list[str]:
  """Adds the columns this version writes to an older result CSV (rows keep their values,
  new columns are empty); the file is replaced whole under the append lock. Returns the
  columns added."""
  fd = os.open(path, os.O_RDWR)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    header = _read_header(path)
    if header is None or header == COLUMNS or set(COLUMNS) <= set(header):
      return []
    import pandas as pd       # only to upgrade an older CSV: a run into a new one needs none
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    added = [c for c in COLUMNS if c not in frame.columns]
    for column in added:
      frame[column] = ""
    frame = frame[COLUMNS + [c for c in header if c not in COLUMNS]]
    tmp = f"{path}.upgrade-{os.getpid()}"
    frame.to_csv(tmp, index=False, lineterminator="\n")
    os.replace(tmp, path)
    print(f"{path}: added the columns of this harness version ({', '.join(added)}); "
          f"{len(frame)} rows kept", flush=True)
    return added
  finally:
    os.close(fd)


def _read_header(path):
  with open(path, newline="") as f:
    first = f.readline()
  return next(csv.reader([first])) if first.strip() else None


def append_row(path: str, row: ResultRow) -> None:
  """Appends one row in the column order of the file's own header (ours for a new file)."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  while True:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    if os.path.exists(path) and os.fstat(fd).st_ino == os.stat(path).st_ino:
      break
    os.close(fd)        # upgrade_header replaced the file while we waited: open the new one
  try:
    new_file = os.fstat(fd).st_size == 0
    header = COLUMNS if new_file else (_read_header(path) or COLUMNS)
    values = [getattr(row, c, None) for c in header]
    os.write(fd, (_encode(COLUMNS) if new_file else b"") + _encode(values))
    os.fsync(fd)
  finally:
    os.close(fd)          # closing releases the lock


def save_row(path: str, row: ResultRow, log_path: str) -> tuple[bool, str]:
  """Appends the row to `path`; if that fails, to a recovery CSV beside the run's log (or, if
  even that fails, prints it). Returns (whether the row reached `path`, one line saying where
  it went): a row that did not makes the command exit EXIT_ROW_NOT_SAVED."""
  try:
    append_row(path, row)
    return True, f"row appended to {path}"
  except OSError as e:
    reason = f"cannot append to {path} ({e.strerror or e})"
  recovery = os.path.splitext(log_path)[0] + ".result.csv"
  try:
    append_row(recovery, row)
    return False, f"{reason}; row saved to {recovery}"
  except OSError:
    line = _encode([getattr(row, c) for c in COLUMNS]).decode().strip()
    return False, f"{reason}, nor to {recovery}; the row: {line}"


def read_csv(path: str) -> "pd.DataFrame":
  """Reads a result CSV of ours; UsageError naming the file if it cannot be read."""
  import pandas as pd
  try:
    frame = pd.read_csv(path, dtype=dict.fromkeys(TEXT_COLUMNS, str))
  except FileNotFoundError:
    raise UsageError(f"{path!r}: no such file; allowed: a result CSV written by "
                     "run_benchmark.py") from None
  except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
    raise UsageError(f"{path!r} is not a readable result CSV ({type(e).__name__})") from None
  missing = [c for c in CORE_COLUMNS if c not in frame.columns]
  if missing:
    raise UsageError(f"{path!r} is not a result CSV of this harness: missing columns "
                     f"{', '.join(missing)}")
  return _fill_older_columns(frame)


def _fill_older_columns(frame):
  """A CSV of an older version lacks some columns: the ones summaries group by are derived
  (system from host, the MLPerf benchmark from the workload's spec), the rest are empty."""
  if "system" not in frame.columns:
    frame["system"] = frame["host"] if "host" in frame.columns else ""
  if "mlperf_benchmark" not in frame.columns:
    from harness import registry                    # neutral: specs import no framework
    frame["mlperf_benchmark"] = [registry.get(w).mlperf_benchmark for w in frame["workload"]]
  for column in COLUMNS:
    if column not in frame.columns:
      frame[column] = None
  return frame
