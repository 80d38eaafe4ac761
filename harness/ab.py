"""`ab`: the baseline commit against the working tree on one machine, interleaved.

Across machines a speed gate measures the machines; on one machine over half an hour it still
measures the machine's drift (a neighbour's load, thermal state, the page cache) unless both
sides share it. So both sides run here, one run at a time, in ABBA rounds per group (workload,
framework): round r runs A then B when r is even, B then A when it is odd, so the sequence is
A B B A A B B A ... and a linear drift adds as much to one side as to the other. Round r of both
sides uses seed SEED + r: with fixed seeds samples to target are deterministic, and compare
checks convergence run by run.

The baseline side (A) runs from a `git worktree` of REF in a temporary folder, with this
interpreter (the same venv), its own run_benchmark.py and harness; the new side (B) runs from
the working tree as it is, uncommitted changes included. Every run is a process of its own, as
in the CI (a run's first-in-process costs, compiles and caches, fall on every run alike). The
worktree is removed when the A/B ends, however it ends (an error, Ctrl-C, SIGTERM).

Writes OUT/base.csv and OUT/new.csv (the two sides' rows), OUT/schedule.csv (the order the runs
ran in, with each run's exit status and run_id), OUT/logs/{base,new}/ (the MLPerf logs) and
OUT/output/ (each run's stdout and stderr); the two CSVs are then gated by compare.
"""
import contextlib
import csv
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from harness import faults
from harness.errors import EXIT_USAGE, UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIDES = {"A": "base", "B": "new"}
STOP_WAIT_S = 120        # a stopped run's time to record its row before it is killed
SCHEDULE_COLUMNS = ["order", "round", "side", "workload", "framework", "seed", "exit_status",
                    "run_id"]


@dataclasses.dataclass(frozen=True)
class Step:
  order: int
  round: int
  side: str              # "A" (base, REF) or "B" (new, the working tree)
  workload: str
  framework: str
  seed: int


def schedule(groups: list, rounds: dict, seed: int) -> list[Step]:
  """The runs in the order they run: round by round, each group's pair A B (even rounds) or B A
  (odd rounds); a group with fewer rounds (`rounds[workload]`) drops out when they are done."""
  steps = []
  for r in range(max(rounds[w] for w, _ in groups)):
    order = ("A", "B") if r % 2 == 0 else ("B", "A")
    for workload, framework in groups:
      if r < rounds[workload]:
        for side in order:
          steps.append(Step(len(steps), r, side, workload, framework, seed + r))
  return steps


# ------------------------------------------------------------------------------------ git

def _git(*args, cwd=ROOT):
  return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def resolve(ref: str) -> tuple[str, str]:
  """(full sha, short sha) of REF in this checkout; UsageError naming it if it is not a
  commit here (or there is no git)."""
  try:
    top = _git("rev-parse", "--show-toplevel")
  except OSError:
    raise UsageError("ab needs git to check out REF; allowed: a git checkout with git on "
                     "PATH") from None
  if top.returncode != 0:
    raise UsageError(f"ab: {ROOT!r} is not a git checkout; allowed: run it in a clone")
  found = _git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
  if found.returncode != 0 or not found.stdout.strip():
    raise UsageError(f"unknown REF {ref!r}; allowed: a commit, branch or tag of this "
                     "repository (e.g. HEAD~1, origin/main, a sha)")
  sha = found.stdout.strip()
  return sha, _git("rev-parse", "--short", sha).stdout.strip()


def working_tree() -> str:
  """The new side's description: its commit, and whether it has uncommitted changes."""
  head = _git("rev-parse", "--short", "HEAD").stdout.strip()
  dirty = _git("status", "--porcelain", "--untracked-files=no").stdout.strip()
  return f"the working tree at {head}" + (" with uncommitted changes" if dirty else "")


@contextlib.contextmanager
def checkout(sha: str):
  """A worktree of sha in a new temporary folder, removed (and unregistered) on leaving,
  whatever ends the block; yields the project's folder in it (the repository's root, or the
  folder the project has in it)."""
  parent = tempfile.mkdtemp(prefix="harness-ab-")
  path = os.path.join(parent, "base")
  try:
    made = _git("worktree", "add", "--detach", "--quiet", path, sha)
    if made.returncode != 0:
      raise UsageError(f"git worktree add of {sha[:12]} failed: "
                       f"{(made.stderr.strip().splitlines() or ['no message'])[-1]}")
    yield os.path.normpath(os.path.join(path, _git("rev-parse", "--show-prefix").stdout.strip()))
  finally:
    # A second Ctrl-C must not cut the removal short: the signals wait until it is done.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
      if os.path.isdir(path):
        _git("worktree", "remove", "--force", path)
      shutil.rmtree(parent, ignore_errors=True)
      # still registered (the folder went another way): drop the registration
      listed = _git("worktree", "list", "--porcelain").stdout.splitlines()
      if f"worktree {os.path.realpath(path)}" in listed:
        _git("worktree", "prune")
    finally:
      signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


# ------------------------------------------------------------------------------- the runs

class Stopped(BaseException):
  """SIGINT or SIGTERM reached the A/B: a BaseException, as KeyboardInterrupt is."""

  def __init__(self, signum):
    super().__init__(faults.signal_name(signum))
    self.signum = signum


_HELD = {"depth": 0, "signum": None}   # signals held while a run's process is being started


@contextlib.contextmanager
def stop_on_signals():
  """SIGINT and SIGTERM raise Stopped in the main thread (so `finally` blocks run, the
  worktree's removal among them); the previous handlers come back after."""
  def handler(signum, _frame):
    if _HELD["depth"]:
      _HELD["signum"] = _HELD["signum"] or signum
      return
    raise Stopped(signum)
  previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    yield
  finally:
    for s, h in previous.items():
      signal.signal(s, h)


@contextlib.contextmanager
def _held_signals():
  """Stopped waits until the block is done, then is raised: raised inside Popen, after the
  fork, it would leave the run going on alone, unknown to anyone. (Blocking the signals with
  pthread_sigmask instead would hand the run a blocked SIGINT: a child inherits the mask.)"""
  _HELD["depth"] += 1
  try:
    yield
  finally:
    _HELD["depth"] -= 1
  if not _HELD["depth"] and _HELD["signum"]:
    signum, _HELD["signum"] = _HELD["signum"], None
    raise Stopped(signum)


def launch_process(argv: list, cwd: str, output: str) -> int:
  """`python ARGV` (ARGV[0] a script) in CWD with this interpreter, stdout and stderr to OUTPUT;
  its exit status. In a session of its own: a Ctrl-C at the terminal reaches the A/B alone,
  which passes one SIGINT on (a run's first signal makes it stop at its next step and record
  its row; a second would end it at once), waits STOP_WAIT_S, then kills it."""
  with open(output, "w") as out:
    proc = None
    try:
      with _held_signals():
        proc = subprocess.Popen([sys.executable, *argv], cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
      return proc.wait()
    except BaseException:
      if proc is None:                    # Popen itself failed: there is no run to stop
        raise
      with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGINT)
      try:
        proc.wait(STOP_WAIT_S)
      except BaseException:               # it did not stop in time, or a second Ctrl-C
        with contextlib.suppress(ProcessLookupError):
          os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
      raise


@dataclasses.dataclass
class Plan:
  ref: str
  sha: str
  short: str
  groups: list               # [(workload, framework)]
  rounds: dict               # workload -> rounds (runs per side)
  seed: int
  out: str
  run_args: list             # passed to every `run`: --preset, --steps, --set, ...

  @property
  def base_csv(self):
    return os.path.join(self.out, "base.csv")

  @property
  def new_csv(self):
    return os.path.join(self.out, "new.csv")


def check_out_dir(out: str) -> bool:
  """OUT must be a folder without the CSVs an A/B writes (rows of another A/B appended to them
  would mix two comparisons), and writable: made now, the last check before the runs (as
  run's --results). Returns whether it was made here (to remove it if the A/B writes nothing)."""
  if os.path.exists(out) and not os.path.isdir(out):
    raise UsageError(f"--out {out!r} is a file; allowed: a folder")
  for name in ("base.csv", "new.csv", "schedule.csv"):
    if os.path.exists(os.path.join(out, name)):
      raise UsageError(f"--out {out!r} already holds {name}; allowed: a new folder, or one "
                       "without base.csv, new.csv and schedule.csv")
  made = not os.path.exists(out)
  try:
    os.makedirs(out, exist_ok=True)
    # os.access is not enough (root may write anywhere, /proc included): a file made and
    # removed again is the question the runs will ask
    tempfile.TemporaryFile(dir=out).close()
  except OSError as e:
    raise UsageError(f"--out {out!r} cannot be written ({e.strerror}); allowed: a folder "
                     "path in a writable folder") from None
  return made


def _rows(path):
  if not os.path.exists(path):
    return []
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def _base_workloads(worktree):
  """The workloads REF's `list --names` names, or None where REF's CLI has no such flag."""
  proc = subprocess.run([sys.executable, "run_benchmark.py", "list", "--names"], cwd=worktree,
                        capture_output=True, text=True, timeout=300)
  return set(proc.stdout.split()) if proc.returncode == 0 else None


def run(plan: Plan, launch=None, echo=print) -> int:
  """Runs the schedule (the baseline side from a worktree of plan.sha, removed after); returns
  the number of runs that ended without a row. UsageError when REF lacks a workload, or refuses
  a run as bad input (exit 2: its one line); Stopped on SIGINT/SIGTERM. `launch(argv, cwd,
  output) -> exit status` starts one run (default: launch_process, looked up at the call)."""
  launch = launch or launch_process
  out = os.path.abspath(plan.out)
  for folder in ("logs/base", "logs/new", "output"):
    os.makedirs(os.path.join(out, folder), exist_ok=True)
  steps = schedule(plan.groups, plan.rounds, plan.seed)
  lost = 0
  with checkout(plan.sha) as worktree:
    names = _base_workloads(worktree)
    missing = sorted({w for w, _ in plan.groups} - names) if names is not None else []
    if missing:
      raise UsageError(f"REF {plan.ref} ({plan.short}) has no workload "
                       f"{', '.join(map(repr, missing))}; allowed there: "
                       f"{', '.join(sorted(names))}")
    with open(os.path.join(out, "schedule.csv"), "w", newline="") as sched:
      writer = csv.writer(sched)
      writer.writerow(SCHEDULE_COLUMNS)
      for step in steps:
        side = SIDES[step.side]
        csv_path = os.path.join(out, f"{side}.csv")
        cwd = worktree if step.side == "A" else ROOT
        argv = [os.path.join(cwd, "run_benchmark.py"), "run", step.workload, "--framework",
                step.framework, "--runs", "1", "--seed", str(step.seed), "--results", csv_path,
                "--log-dir", os.path.join(out, "logs", side), *plan.run_args]
        output = os.path.join(out, "output", f"{step.order:03d}_{step.side}_{step.workload}_"
                                             f"{step.framework}_{step.seed}.txt")
        before = len(_rows(csv_path))
        status = launch(argv, cwd, output)
        rows = _rows(csv_path)
        row = rows[-1] if len(rows) > before else None
        writer.writerow([step.order, step.round, step.side, step.workload, step.framework,
                         step.seed, status, row["run_id"] if row else ""])
        sched.flush()
        if status == EXIT_USAGE and row is None:
          raise UsageError(f"the {side} side ({_side_name(plan, step.side)}) refused `run "
                           f"{step.workload} --framework {step.framework}`: "
                           f"{_last_line(output)}")
        if row is None:
          lost += 1
        echo(_line(step, len(steps), row, status, output))
  return lost


def _side_name(plan, side):
  return f"REF {plan.ref} at {plan.short}" if side == "A" else "the working tree"


def _last_line(path):
  with open(path, errors="replace") as f:
    lines = [line.strip() for line in f if line.strip()]
  return lines[-1] if lines else "no output"


def _line(step, total, row, status, output):
  head = (f"[{step.order + 1}/{total}] round {step.round + 1} {step.side} "
          f"({SIDES[step.side]}) {step.workload} {step.framework} seed {step.seed}: ")
  if row is None:
    return head + f"no row recorded (exit status {status}); output: {output}"
  text = row["status"]
  if row.get("time_to_train_s"):
    text += f", time to train {float(row['time_to_train_s']):.1f} s"
  if row.get("throughput"):
    text += f", {float(row['throughput']):.1f} samples/s"
  if row.get("abort_reason"):
    text += f" ({row['abort_reason']})"
  return head + text
