"""The supervisor: `run` as a parent process that starts the training as its child and records
the run whatever way the child ends.

Why: a framework may end a process itself. JAX's coordination service aborts every surviving
process (SIGABRT and a C++ stack dump) once a peer misses its heartbeat, before or while the
driver writes `run_stop` and the row; the kernel's OOM killer sends SIGKILL. Elastic launchers
(torchrun, tf.distribute's preemption handler) keep a parent for the same reason. The parent
imports neither framework, so it costs a Python start-up and nothing of the devices.

How:
- The child is this command line again, with SUPERVISED_ENV set and a progress file
  (faults.PROGRESS_ENV) the driver keeps: the run's row as it stands, whether the log holds
  `run_start`, whether the run was closed (its `run_stop` and row written).
- The child runs in its own session: a terminal's Ctrl-C reaches the parent only, which
  forwards each signal it gets (SIGTERM, SIGINT, SIGUSR1) to the child, once.
- The child ends with the parent: a supervisor killed by SIGKILL (which it cannot forward) has
  its child close the run at once and leave (faults.SignalWatch.orphaned; PR_SET_PDEATHSIG
  before the watch starts), so no training goes on as an orphan of init.
- The child's stderr passes through the parent line by line until a Python traceback or a C++
  fatal dump begins; from there it goes to `<log>.stderr.txt` beside the run's log, and the
  run's one line names that file.
- When the child ends without closing its run (killed, aborted by its framework, or an error
  the driver deferred: RunOptions.defer_errors), the parent closes the log with `run_stop`
  aborted and writes the row (process 0's parent only: the others write neither), with the
  reason: the lost peer the child's last words name, the signal that killed it, or its error.

One supervisor per task (srun) or per pod (Kubernetes): each is the `python run_benchmark.py
run` the scheduler starts. srun signals every process of a step, the child included; the child
counts a repeat within faults.REPEAT_S as the same signal. A pod's SIGTERM reaches its PID 1,
the parent, which forwards it.
"""
import collections
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from harness import errors, faults, results
from harness.mllog import RunLog, constants as C

SUPERVISED_ENV = "HARNESS_SUPERVISED"
_ENTRY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "run_benchmark.py")
# Where the child's stderr stops being shown on the terminal: a Python traceback, a C++ fatal
# log line (glog/absl: F + month and day) and the stack dump after it, a fatal Python error.
_DUMP_START = re.compile(r"^(Traceback \(most recent call last\)|F\d{4} |\*\*\* Check failure|"
                         r"Fatal Python error|terminate called)")
_KEPT_LINES = 20000


def is_child() -> bool:
  return os.environ.get(SUPERVISED_ENV) == "1"


def _die_with(parent: int):
  """The child's preexec_fn (after fork, before exec): SIGTERM when the parent dies (Linux's
  PR_SET_PDEATHSIG), so a killed supervisor does not leave its training running unsupervised;
  a parent already gone (killed between the fork and here) ends the child now. Once the run's
  SignalWatch starts, its thread watches the parent too (faults.SUPERVISOR_ENV): the
  frameworks' multi-process start-up takes SIGTERM's handler for a while, and a child in its
  step loop must close its run at once, not at the next boundary."""
  def preexec():
    try:
      ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
      pass
    if os.getppid() != parent:
      os._exit(faults.signal_exit_status(signal.SIGKILL))
  return preexec


class _StderrRelay(threading.Thread):
  """Copies the child's stderr to ours until a dump begins; keeps every line it read."""

  def __init__(self, stream):
    super().__init__(daemon=True, name="harness-stderr-relay")
    self.stream, self.lines, self.hidden = stream, collections.deque(maxlen=_KEPT_LINES), 0

  def run(self):
    for raw in iter(self.stream.readline, b""):
      line = raw.decode(errors="replace")
      self.lines.append(line)
      if not self.hidden and _DUMP_START.match(line):
        self.hidden = 1
      if self.hidden:
        self.hidden += 1
        continue
      sys.stderr.write(line)
      sys.stderr.flush()

  def text(self) -> str:
    return "".join(self.lines)


def run(argv: list[str]) -> int:
  """Runs `run_benchmark.py ARGV` as a supervised child; returns the command's exit status."""
  tmp = tempfile.mkdtemp(prefix="harness-supervisor-")
  progress_path = os.path.join(tmp, "progress.json")
  env = dict(os.environ, **{SUPERVISED_ENV: "1", faults.PROGRESS_ENV: progress_path,
                            faults.SUPERVISOR_ENV: str(os.getpid())})
  sys.stdout.flush()
  child = subprocess.Popen([sys.executable, _ENTRY, *argv], env=env, stderr=subprocess.PIPE,
                           start_new_session=True, preexec_fn=_die_with(os.getpid()))
  relay = _StderrRelay(child.stderr)
  relay.start()
  forward = lambda signum, frame: _forward(child, signum)
  saved = {}
  if threading.current_thread() is threading.main_thread():
    saved = {s: signal.signal(s, forward) for s in faults.HANDLED_SIGNALS}
  try:
    returncode = child.wait()
    relay.join()
  finally:
    for signum, handler in saved.items():
      signal.signal(signum, handler)
  try:
    return _finish(returncode, faults.read_progress(progress_path), relay)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def _forward(child, signum):
  if child.poll() is None:
    try:
      os.kill(child.pid, signum)
    except ProcessLookupError:
      pass


def _save_stderr(relay, near: str) -> str:
  """The child's stderr beside `near` (the run's log), if part of it was not shown."""
  if not relay.hidden:
    return ""
  path = os.path.splitext(near)[0] + ".stderr.txt"
  try:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
      f.write(relay.text())
    return path
  except OSError:
    return ""


def _how_it_ended(returncode) -> str:
  if returncode < 0:
    return f"killed by {faults.signal_name(-returncode)}"
  return f"exited with status {returncode}"


def _finish(returncode, progress, relay) -> int:
  text = relay.text()
  if progress is None:                 # ended before a run began: a usage error it printed,
    if returncode >= 0 and not relay.hidden:   # or a failure building its trainer
      return returncode
    where = _save_stderr(relay, os.path.join("logs", f"run_benchmark-{os.getpid()}.log"))
    print(f"run_benchmark.py: the training process {_how_it_ended(returncode)} before its run "
          "began" + (f"; its stderr: {where}" if where else ""), file=sys.stderr, flush=True)
    return (faults.signal_exit_status(-returncode) if returncode < 0
            else returncode or errors.EXIT_ABORTED)
  row = progress["row"]
  if progress["closed"]:               # the child recorded its run itself
    if returncode >= 0:
      return returncode
    # then died on its way out (a framework's shutdown with a peer gone): its rows stand
    if progress.get("interrupted_by"):
      return faults.signal_exit_status(progress["interrupted_by"])
    if not progress.get("row_saved", True):
      return errors.EXIT_ROW_NOT_SAVED
    return 0 if row["status"] == C.SUCCESS else errors.EXIT_ABORTED
  lost = faults.lost_peer(text + "\n" + (row.get("abort_reason") or ""))
  if progress.get("interrupted_by"):        # a signal first: a preempted peer's end follows
    signum = progress["interrupted_by"]
    reason = f"{faults.signal_name(signum)} received"
    if (row.get("abort_reason") or "").startswith(reason):
      reason = row["abort_reason"]     # the child's words: how far it got, what followed
    status = faults.signal_exit_status(signum)
  elif lost is not None:
    reason = faults.lost_peer_line(lost, progress.get("hosts"), progress.get("heartbeat_s"))
    status = errors.EXIT_LOST_PEER
  elif progress.get("deferred"):
    reason, status = row["abort_reason"], errors.EXIT_ABORTED
  elif returncode < 0:
    reason = f"the training process was {_how_it_ended(returncode)}"
    status = faults.signal_exit_status(-returncode)
  else:
    reason = f"the training process {_how_it_ended(returncode)} before closing its run"
    status = returncode or errors.EXIT_ABORTED
  where = _save_stderr(relay, progress["log_path"])
  saved = ""
  if progress["primary"]:
    _close_log(progress["log_path"], progress["run_started"])
    row.update(status=C.ABORTED, abort_reason=reason[:300], time_to_train_s=None,
               epochs_to_converge=None, samples_to_converge=None)
    known = set(results.COLUMNS)
    reached, saved = results.save_row(progress["results_path"],
                                      results.ResultRow(**{k: v for k, v in row.items()
                                                           if k in known}),
                                      progress["log_path"])
    if not reached and status == errors.EXIT_ABORTED:
      status = errors.EXIT_ROW_NOT_SAVED
  print(f"[{progress['run_id']}] run_stop status=aborted ({reason})"
        + (f"; {saved}" if saved else "")
        + (f"; the training process's stderr: {where}" if where else ""), flush=True)
  return status


def _close_log(path, run_started):
  """Appends what the child could not: `run_stop` aborted (after `init_stop` and `run_start`
  if it died during init), as the driver closes a run."""
  try:
    log = RunLog(path, append=True)
  except OSError:
    return
  try:
    if not run_started:
      log.end(C.INIT_STOP)
      log.start(C.RUN_START)
    log.end(C.RUN_STOP, status=C.ABORTED)
  finally:
    log.close()
