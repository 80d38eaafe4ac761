"""Runs that end by a fault: a signal (a scheduler's preemption, Ctrl-C), a lost peer, and the
progress file a supervised run keeps so that its supervisor can record it (harness/supervise.py).

Signals. SIGTERM (a scheduler's preemption, SLURM's `--signal=TERM@60`), SIGINT (Ctrl-C) and
SIGUSR1 (`--signal=USR1@60`) ask the run to stop at the next step boundary. The handler only
records the signal; `check()` raises `Interrupted`, called by the trainer's own loops between
two steps and two eval batches (Trainer.stop_check: between two dispatched JAX steps, once the
dispatched ones have finished; when TF's in-graph loop of steps returns: such a loop cannot be
interrupted) and by the driver between its own phases. The handler never raises: raised from a
handler, the exception would leave at whatever bytecode the main thread was running, inside
tf.data's iterator or JAX's dispatch, and a JAX run so ended died by SIGABRT ("free(): invalid
next size") in about one of 30 preemptions, its row lost. The driver then writes `run_stop`
aborted and the row, and the command exits 128 + the signal's number. A second signal ends the run at once, from a thread that reads the
signal as soon as it arrives (Python's own handler waits for the main thread, which a compiled
loop may hold for minutes): it writes `run_stop` and the row and leaves with os._exit. A repeat
within REPEAT_S of the first counts as the same signal: srun delivers a signal to every process
of a step and the supervisor forwards it too.

The frameworks take SIGTERM for themselves once they start a multi-process run: JAX's
jax.distributed.initialize and TF's MultiWorkerMirroredStrategy install a C++ preemption
notifier as its handler, which swallows the signal (a two-process run went on to its target
after SIGTERM). `reclaim()`, called once the trainer is built, puts this watch's handlers back.

Orphans. A supervised child (harness/supervise.py) ends with its supervisor: the watch's own
thread sees the parent gone (os.getppid() no longer the SUPERVISOR_ENV pid, within
PARENT_POLL_S) and closes the run at once, as a second signal does, with the reason, so a
`kill -9` of the process a launcher sees does not leave the training running, unsupervised
and holding its peers in their collectives (the supervisor also sets PR_SET_PDEATHSIG, which
ends a child whose watch has not started yet).

Lost peers. A framework reports a peer that stopped answering in its own words (JAX's
coordination service, TF's collective health check); `lost_peer` reads the process index from
either, for the one line the run ends with.
"""
import contextlib
import json
import os
import re
import signal
import sys
import threading
import time

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
REPEAT_S = 1.0                  # a repeat of the first signal within this is the same signal
PROGRESS_ENV = "HARNESS_PROGRESS_FILE"     # set by the supervisor for its child
SUPERVISOR_ENV = "HARNESS_SUPERVISOR_PID"  # ... and its own pid: the child ends when it dies
PARENT_POLL_S = 0.2             # how often a supervised child looks whether its parent lives


def signal_name(signum: int) -> str:
  try:
    return signal.Signals(signum).name
  except ValueError:
    return f"signal {signum}"


def signal_exit_status(signum: int) -> int:
  """The status a shell reports for a process a signal ended: 128 + the signal's number."""
  return 128 + signum


class Interrupted(BaseException):
  """A signal asked the run to stop. A BaseException, as KeyboardInterrupt is: a trainer's
  `except Exception` must not swallow it."""

  def __init__(self, signum: int):
    super().__init__(signal_name(signum))
    self.signum = signum

  @property
  def reason(self) -> str:
    return f"{signal_name(self.signum)} received"


class SignalWatch:
  """The signal handlers of one `run` command (installed only in the main thread, where Python
  allows them; elsewhere a no-op). `received` is the first signal's number; `on_second` is
  called (from the watcher thread) with it when another signal arrives: the driver sets it to
  the current run's emergency close, which does not return."""

  def __init__(self):
    self.received = None
    self.on_second = None               # on_second(signum, reason=None, status=None)
    self._first_at = None
    self._lock = threading.Lock()
    self._saved = None

  # ---------------------------------------------------------------- install / restore
  def __enter__(self):
    if threading.current_thread() is not threading.main_thread():
      return self
    read, write = os.pipe()
    os.set_blocking(write, False)
    self._saved = ({s: signal.getsignal(s) for s in HANDLED_SIGNALS},
                   signal.set_wakeup_fd(write, warn_on_full_buffer=False), read, write)
    for signum in HANDLED_SIGNALS:
      signal.signal(signum, self._handler)
    threading.Thread(target=self._watch, args=(read,), daemon=True,
                     name="harness-signal-watch").start()
    supervisor = os.environ.get(SUPERVISOR_ENV, "")
    if supervisor.isdigit():
      threading.Thread(target=self._watch_parent, args=(int(supervisor),), daemon=True,
                       name="harness-parent-watch").start()
    return self

  def reclaim(self):
    """Installs this watch's handlers again: a framework's multi-process start-up replaced
    SIGTERM's with its own (see the module's docstring)."""
    if self._saved is None or threading.current_thread() is not threading.main_thread():
      return
    for signum in HANDLED_SIGNALS:
      signal.signal(signum, self._handler)

  def _watch_parent(self, supervisor: int):
    """A supervised child's thread: ends the process once its supervisor is gone."""
    while self._saved is not None:
      if os.getppid() != supervisor:
        self.orphaned(supervisor)
        return
      time.sleep(PARENT_POLL_S)

  def orphaned(self, supervisor: int):
    """The supervisor died (SIGKILL: nothing reached us): close the current run at once, as a
    second signal does, or leave at once if no run is open. Does not return."""
    reason = f"its supervisor (pid {supervisor}) was killed: the training ended at once"
    status = signal_exit_status(signal.SIGKILL)
    with self._lock:
      if self.received is None:
        self.received, self._first_at = signal.SIGTERM, float("-inf")
    if self.on_second is not None:
      self.on_second(self.received, reason=reason, status=status)
    print(f"run_benchmark.py: {reason}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(status)

  def __exit__(self, *exc):
    if self._saved is None:
      return False
    handlers, old_fd, _, write = self._saved
    signal.set_wakeup_fd(old_fd)
    for signum, handler in handlers.items():
      signal.signal(signum, handler)
    os.close(write)                    # the watcher's read returns b"" and it ends
    self._saved = None
    return False

  # ---------------------------------------------------------------- the two paths
  def _handler(self, signum, frame):
    """Python's handler, in the main thread: records the graceful stop, which `check` raises at
    the next boundary (never here: see the module's docstring)."""
    del frame
    with self._lock:                   # the watcher thread may not have seen it yet
      if self.received is None:
        self.received, self._first_at = signum, time.monotonic()

  def _watch(self, read):
    """The watcher thread: sees each signal as the C-level handler writes it to the wakeup
    fd, also while the main thread is held by compiled code."""
    try:
      while True:
        data = os.read(read, 64)
        if not data:
          return
        for signum in data:
          if self._record(signum) and self.on_second is not None:
            self.on_second(self.received)
    except OSError:
      return
    finally:
      with contextlib.suppress(OSError):
        os.close(read)

  def _record(self, signum) -> bool:
    """Records a delivery; True when it is a second signal (not the first, nor its repeat)."""
    with self._lock:
      now = time.monotonic()
      if self.received is None:
        self.received, self._first_at = signum, now
        return False
      if now - self._first_at < REPEAT_S:
        return False
      self._first_at = float("-inf")    # a repeat window only follows the first signal
      return True

  def check(self):
    """Raises Interrupted if a signal has asked the run to stop (the driver's boundaries and,
    as Trainer.stop_check, the trainer's)."""
    if self.received is not None:
      raise Interrupted(self.received)


# ----------------------------------------------------------------------------- lost peers

# What each framework says when a peer stops answering, and the process index it names.
_LOST_PEER = (
    # JAX's coordination service, at a surviving task: the dead one's heartbeat timed out
    (re.compile(r"Task (\d+) heartbeat timeout"), None),
    # ... at a task that lost the service itself: the leader, process 0, is gone
    (re.compile(r"Failed to send RPC to coordination service|leader task was "
                r"preempted/died"), 0),
    # ... or its error poll: "The following tasks are unhealthy (stopped sending heartbeats):
    # 1" (JAX 0.10, the dead task's index alone on the next line)
    (re.compile(r"JAX distributed service detected fatal errors[^\n]*unhealthy \(stopped "
                r"sending heartbeats\):\s*\n?\s*(\d+)\s*$", re.M), None),
    # TF's collective health check (MultiWorkerMirroredStrategy)
    (re.compile(r"unhealthy \(stopped sending heartbeats\):\s*/job:[\w-]+/replica:\d+/"
                r"task:(\d+)"), None),
    # ... or a collective whose peer's socket closed (a killed process on a live host)
    (re.compile(r"Collective ops is aborted by:[^\n]*\n[^\n]*remote target /job:[\w-]+/"
                r"replica:\d+/task:(\d+)"), None),
)


def lost_peer(text: str) -> int | None:
  """The index of the process a framework's error text says was lost, or None."""
  for pattern, fixed in _LOST_PEER:
    found = pattern.search(text or "")
    if found:
      return fixed if fixed is not None else int(found.group(1))
  return None


def lost_peer_line(index: int, hosts=None, heartbeat_s=None) -> str:
  host = hosts[index] if hosts and 0 <= index < len(hosts) and hosts[index] else "host unknown"
  within = f" for {heartbeat_s} s (the heartbeat)" if heartbeat_s else ""
  return f"lost peer: process {index} ({host}) stopped answering{within}"


# ----------------------------------------------------------------------------- progress

def write_progress(path: str, state: dict) -> None:
  """The run's state for its supervisor, replaced whole (a reader sees the old or the new)."""
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    json.dump(state, f)
  os.replace(tmp, path)


def read_progress(path: str) -> dict | None:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None
