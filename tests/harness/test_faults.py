"""Runs that end by a fault are recorded, never lost: a signal, a lost peer, a row that could not
reach its CSV each end in one line, an aborted row (or a recovery row), a log closed with
`run_stop` aborted that the official checker reads, and the documented exit status."""
import os
import signal
import subprocess
import threading
import time

import pandas as pd
import pytest

from harness import compliance, driver, errors, faults, results, supervise
from tests.conftest import free_port, start_cli
from tests.harness.test_driver import ScriptedTrainer
from workloads.resnet import spec

# A ResNet mini run that goes on long after its first eval (16 epochs, target never reached).
LONG_MINI = ("run", "resnet50", "--seed", "1", "--set", "train.target=0.99")


def _wait_for(proc, text, timeout=240):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if text in proc.output_so_far():
      return
    if proc.returncode is not None:
      break
    time.sleep(0.2)
  raise AssertionError(f"never printed {text!r}:\n{proc.output_so_far()[-3000:]}")


def _events(log_path):
  import json  # pylint: disable=import-outside-toplevel
  return [json.loads(l[9:]) for l in open(log_path) if l.startswith(":::MLLOG")]


def _assert_closed_aborted_log(log_path):
  events = _events(log_path)
  assert events[-1]["key"] == "run_stop" and events[-1]["metadata"]["status"] == "aborted"
  passed, report = compliance.check(log_path)
  assert passed, report


# ----------------------------------------------------------------------------- words

def test_lost_peer_is_read_from_each_frameworks_words():
  """The texts are what JAX 0.10 and TF 2.21 printed when a peer was SIGKILLed here."""
  assert faults.lost_peer("Barrier failed because: task is set to ERROR: UNAVAILABLE: Task 3 "
                          "heartbeat timeout. This indicates that the remote task has "
                          "failed") == 3
  assert faults.lost_peer("absl::Status: UNAVAILABLE: Failed to send RPC to coordination "
                          "service. Either the leader task was preempted/died/restarted") == 0
  assert faults.lost_peer("Collective ops is aborted by: Error reported from /job:worker/"
                          "task:0: The following tasks are unhealthy (stopped sending "
                          "heartbeats):\n/job:worker/replica:0/task:2\nThe tasks have") == 2
  assert faults.lost_peer("F1128 08:21:28.799796   10295 client.h:80] Terminating process "
                          "because the JAX distributed service detected fatal errors. ... "
                          "absl::Status: UNAVAILABLE: The following tasks are unhealthy "
                          "(stopped sending heartbeats):\n1\nThe tasks have crashed.") == 1
  assert faults.lost_peer("Collective ops is aborted by: Socket closed\nAdditional GRPC error "
                          "information from remote target /job:worker/replica:0/task:1 while "
                          "calling /tensorflow.WorkerService/RecvBuf:") == 1
  assert faults.lost_peer("ValueError: a shape mismatch in task:1") is None
  assert (faults.lost_peer_line(1, ["node-a", "node-b"], 5)
          == "lost peer: process 1 (node-b) stopped answering for 5 s (the heartbeat)")


def test_exit_status_precedence():
  rows = driver.RunResults()
  assert rows.exit_status() == 0
  rows.rows_not_saved = 1
  assert rows.exit_status() == errors.EXIT_ROW_NOT_SAVED == 3
  rows.interrupted_by = signal.SIGTERM
  assert rows.exit_status() == 143


# ----------------------------------------------------------------------------- supervisor

class _FailingTrainer(ScriptedTrainer):
  """Trains a block, evaluates, then fails in the next block's training, as a collective does
  when a peer is gone."""

  def train(self, num_steps=None, *, samples=None):
    if self.evals:
      raise RuntimeError("INTERNAL: Error dispatching computation")
    return super().train(num_steps, samples=samples)


class _Relay:
  def __init__(self, text, hidden=1):
    self._text, self.hidden = text, hidden

  def text(self):
    return self._text


def test_supervisor_records_a_run_its_child_could_not(tmp_path, capsys):
  """The child defers an error's row (a supervised multi-process run); its framework then
  aborts it, naming the lost peer: the parent closes the log, writes the row with the epochs,
  samples and metric the child reached, and exits EXIT_LOST_PEER."""
  cfg = spec.mini()
  cfg.train.global_batch_size = 64
  progress = str(tmp_path / "progress.json")
  csv = str(tmp_path / "r.csv")
  opts = driver.RunOptions(framework="jax", preset="mini", seed=1, results_path=csv,
                           log_dir=str(tmp_path / "logs"), progress_path=progress,
                           defer_errors=True)
  trainer = _FailingTrainer([0.4, 0.5])
  trainer.process_hosts = ["node-a", "node-b"]
  with pytest.raises(driver.Deferred):
    driver.run_all(spec.SPEC, cfg, opts, lambda seed: trainer)
  state = faults.read_progress(progress)
  assert state["deferred"] and not state["closed"] and not os.path.exists(csv)
  status = supervise._finish(-6, state, _Relay(  # pylint: disable=protected-access
      "F1126 client.h:80] Terminating process ... Task 1 heartbeat timeout.\n"))
  assert status == errors.EXIT_LOST_PEER
  row = pd.read_csv(csv).iloc[0]
  reason = "lost peer: process 1 (node-b) stopped answering for 30 s (the heartbeat)"
  assert row["status"] == "aborted" and row["abort_reason"] == reason
  assert row["final_metric"] == 0.4 and row["samples_completed"] == 640
  assert row["epochs_completed"] == 1.0 and pd.isna(row["epochs_to_converge"])
  _assert_closed_aborted_log(state["log_path"])
  line = capsys.readouterr().out.strip().splitlines()[-1]
  assert line.startswith(f"[{state['run_id']}] run_stop status=aborted ({reason}); row "
                         f"appended to {csv}; the training process's stderr: ")
  assert os.path.exists(os.path.splitext(state["log_path"])[0] + ".stderr.txt")


def test_supervisor_records_a_child_killed_during_init(tmp_path):
  """SIGKILL (the OOM killer) before run_start: the log gets init_stop, run_start, run_stop."""
  log = tmp_path / "run.log"
  from harness.mllog import RunLog, constants as C  # pylint: disable=import-outside-toplevel
  opened = RunLog(str(log))
  opened.event(C.CACHE_CLEAR, True)
  opened.start(C.INIT_START)
  opened.close()
  row = results.ResultRow(**{c: None for c in results.COLUMNS})
  row.run_id, row.status = "r1", "aborted"
  state = dict(run_id="r1", log_path=str(log), primary=True, run_started=False, closed=False,
               deferred=False, row_saved=True, results_path=str(tmp_path / "r.csv"),
               interrupted_by=None, hosts=None, heartbeat_s=30, row=row.__dict__)
  status = supervise._finish(-9, state, _Relay("", hidden=0))  # pylint: disable=protected-access
  assert status == 137
  keys = [(e["key"], e["event_type"]) for e in _events(log)]
  assert keys[-3:] == [("init_stop", "INTERVAL_END"), ("run_start", "INTERVAL_START"),
                       ("run_stop", "INTERVAL_END")]
  assert (pd.read_csv(tmp_path / "r.csv").iloc[0]["abort_reason"]
          == "the training process was killed by SIGKILL")


# ----------------------------------------------------------------------------- real processes

@pytest.mark.slow
@pytest.mark.parametrize("framework,signum", [("jax", signal.SIGTERM), ("tf", signal.SIGINT)])
def test_a_signal_after_the_first_eval_ends_in_an_aborted_row(tmp_path, framework, signum):
  csv, logs = tmp_path / "r.csv", tmp_path / "logs"
  proc = start_cli(*LONG_MINI, "--framework", framework, "--results", str(csv),
                   "--log-dir", str(logs))
  try:
    _wait_for(proc, "epoch 1/")
    os.kill(proc.pid, signum)
    proc.wait(timeout=120)
  finally:
    if proc.returncode is None:
      proc.kill()
  out = proc.output_so_far()
  assert proc.returncode == 128 + signum, out[-3000:]
  assert "Traceback" not in out
  name = signal.Signals(signum).name
  line = [l for l in out.splitlines() if "run_stop" in l][-1]
  assert f"run_stop status=aborted ({name} received after " in line and str(csv) in line
  row = pd.read_csv(csv).iloc[0]
  assert row["status"] == "aborted" and row["abort_reason"].startswith(f"{name} received")
  assert row["epochs_completed"] >= 1 and row["samples_completed"] >= 4096
  assert 0 < row["final_metric"] < 0.99           # the last eval's accuracy
  _assert_closed_aborted_log(row["log_path"])


# TF's pair was here too (22 CPU s): tests/parallel/test_slurm_cluster.py kills one TF task
# under a real srun, and its survivor ends the same way (exit 4, the row and the line naming
# process 1, a closed log); JAX's stays (the coordination service's own words for the peer).
@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax"])
def test_a_lost_peer_ends_the_survivor_with_its_row(tmp_path, framework):
  """Process 1 (its supervisor and its training) SIGKILLed after process 0's first eval: the
  survivor ends within the heartbeat (5 s) plus a margin, in one line naming process 1, with
  the row and a closed log, and exits EXIT_LOST_PEER."""
  csv, port, heartbeat = tmp_path / "r.csv", free_port(2), 5
  procs = [start_cli(*LONG_MINI, "--framework", framework, "--cpu-devices", "1",
                     "--num-processes", "2", "--process-id", str(i),
                     "--coordinator", f"127.0.0.1:{port}", "--heartbeat-timeout", str(heartbeat),
                     "--results", str(csv), "--log-dir", str(tmp_path / f"logs{i}"))
           for i in range(2)]
  try:
    _wait_for(procs[0], "epoch 1/")
    children = subprocess.run(["pgrep", "-P", str(procs[1].pid)], capture_output=True,
                              text=True).stdout.split()
    for pid in [*map(int, children), procs[1].pid]:
      os.kill(pid, signal.SIGKILL)
    killed = time.time()
    procs[0].wait(timeout=heartbeat + 60)
    took = time.time() - killed
  finally:
    for proc in procs:
      if proc.returncode is None:
        proc.kill()
  out = procs[0].output_so_far()
  assert procs[0].returncode == errors.EXIT_LOST_PEER, out[-3000:]
  assert took < heartbeat + 30, took
  assert "Traceback" not in out and "Check failure" not in out
  reason = f"lost peer: process 1 ({os.uname().nodename if framework == 'jax' else '127.0.0.1'})"
  line = [l for l in out.splitlines() if "run_stop" in l][-1]
  assert f"run_stop status=aborted ({reason} stopped answering" in line, out[-2000:]
  row = pd.read_csv(csv).iloc[0]
  assert row["status"] == "aborted" and row["abort_reason"].startswith(reason)
  assert row["epochs_completed"] >= 1 and row["final_metric"] > 0
  _assert_closed_aborted_log(row["log_path"])


def _mount_full_tmpfs(path):
  """A 64 KiB tmpfs at `path`, filled; None where mounting is not permitted (not root, or a
  container without CAP_SYS_ADMIN)."""
  path.mkdir()
  mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)],
                           capture_output=True, text=True)
  if mounted.returncode:
    return None
  try:
    with open(path / "filler", "wb") as f:
      while True:
        f.write(b"x" * 4096)
        f.flush()
  except OSError:
    pass
  return path


@pytest.mark.slow
def test_a_row_that_cannot_reach_a_full_disk_exits_3(tmp_path):
  full = _mount_full_tmpfs(tmp_path / "full")
  try:
    if full is None:
      pytest.skip("mounting a tmpfs is not permitted here (needs root / CAP_SYS_ADMIN); "
                  "test_a_row_that_cannot_be_written_exits_3 covers the path in-process")
    csv = full / "r.csv"
    proc = start_cli("run", "resnet50", "--preset", "tiny", "--steps", "2", "--seed", "1",
                     "--results", str(csv), "--log-dir", str(tmp_path / "logs"),
                     few_steps=True)
    proc.wait(timeout=300)
    out = proc.output_so_far()
    assert proc.returncode == errors.EXIT_ROW_NOT_SAVED, out[-3000:]
    line = [l for l in out.splitlines() if "run_stop" in l][-1]
    assert f"cannot append to {csv} (No space left on device); row saved to " in line
    recovery = line.rsplit("row saved to ", 1)[1]
    assert pd.read_csv(recovery).iloc[0]["workload"] == "resnet50"
    assert "Traceback" not in out
  finally:
    if full is not None:
      subprocess.run(["umount", str(full)], check=False)


def test_a_row_that_cannot_be_written_exits_3(tmp_path):
  """The same through a path that fails at the append (the file turned into a folder)."""
  target = tmp_path / "r.csv"
  cfg = spec.mini()
  cfg.train.global_batch_size = 64
  opts = driver.RunOptions(framework="jax", preset="mini", seed=1, results_path=str(target),
                           log_dir=str(tmp_path / "logs"))
  results.check_writable(str(target))
  target.unlink()
  target.mkdir()
  rows = driver.run_all(spec.SPEC, cfg, opts, lambda seed: ScriptedTrainer([0.95]))
  assert rows.rows_not_saved == 1 and rows.exit_status() == 3
  assert os.path.exists(rows[0].log_path[:-len(".log")] + ".result.csv")


def test_a_second_signal_is_one_that_is_not_a_repeat_of_the_first(monkeypatch):
  """srun signals every process of a step and the supervisor forwards: the same SIGTERM twice
  within REPEAT_S is one signal; another after it ends the run at once."""
  clock = [100.0]
  monkeypatch.setattr(faults.time, "monotonic", lambda: clock[0])
  watch = faults.SignalWatch()
  assert not watch._record(signal.SIGTERM)          # pylint: disable=protected-access
  clock[0] += faults.REPEAT_S / 2
  assert not watch._record(signal.SIGTERM)          # pylint: disable=protected-access
  with pytest.raises(faults.Interrupted, match="SIGTERM"):
    watch.check()
  clock[0] += faults.REPEAT_S
  assert watch._record(signal.SIGINT)               # pylint: disable=protected-access
  assert watch.received == signal.SIGTERM           # the status stays the first signal's


class _PreemptedInsideALibraryCall(ScriptedTrainer):
  """In its second block, SIGTERM reaches the process while the trainer is inside a library
  call (here a loop of Python bytecodes, as tf.data's iterator and JAX's dispatch are)."""
  library_call_completed = None

  def train(self, num_steps=None, *, samples=None):
    if self.evals == 1 and self.library_call_completed is None:
      self.library_call_completed = False
      os.kill(os.getpid(), signal.SIGTERM)      # Python runs the handler at the next bytecode
      for _ in range(1000):
        pass
      self.library_call_completed = True
      self.stop_check()                         # the trainer's own step boundary
    return super().train(num_steps, samples=samples)


def _run_watched(tmp_path, trainer):
  """The scripted mini run under the command's signal watch, as `run` drives it."""
  cfg = spec.mini()
  cfg.train.global_batch_size = 64
  with faults.SignalWatch() as watch:
    opts = driver.RunOptions(framework="jax", preset="mini", seed=7, signals=watch,
                             results_path=str(tmp_path / "r.csv"),
                             log_dir=str(tmp_path / "logs"))
    return driver.run_all(spec.SPEC, cfg, opts, lambda seed: trainer)


def test_a_signal_stops_the_run_only_at_the_trainer_s_step_boundary(tmp_path):
  """The handler records; Trainer.stop_check raises. A handler that raised would leave the
  trainer from inside whatever library call the main thread was in (a preempted JAX run so
  ended died by SIGABRT, its row lost): deterministic here, the signal sent from inside."""
  assert threading.current_thread() is threading.main_thread()   # where handlers install
  trainer = _PreemptedInsideALibraryCall([0.5, 0.6, 0.7])
  rows = _run_watched(tmp_path, trainer)
  assert trainer.library_call_completed is True
  assert rows.exit_status() == 128 + signal.SIGTERM
  row = pd.read_csv(tmp_path / "r.csv").iloc[0]
  assert row["status"] == "aborted" and row["abort_reason"].startswith("SIGTERM received after")
  _assert_closed_aborted_log(row["log_path"])


class _BehindItsPeer(ScriptedTrainer):
  """A process a step behind its peer when the scheduler's signal reaches both: the peer stops
  at its boundary and leaves; this one, inside its next step's collective, gets the signal
  there and then the framework's error for the peer it waits for."""

  def train(self, num_steps=None, *, samples=None):
    if self.evals == 1:
      os.kill(os.getpid(), signal.SIGUSR1)      # recorded; the step goes on (no boundary yet)
      for _ in range(1000):
        pass
      raise RuntimeError("collective: peer task 1 stopped sending heartbeats")
    return super().train(num_steps, samples=samples)


def test_an_error_after_a_signal_ends_the_run_as_preempted(tmp_path):
  """The run was preempted, and the error is what its stopped peer left it in: the row, the
  one line and the exit status name the signal, the error after it (a two-process run under
  scancel --signal=USR1 ended "lost peer" when its processes stopped a step apart)."""
  trainer = _BehindItsPeer([0.5, 0.6, 0.7])
  rows = _run_watched(tmp_path, trainer)
  assert rows.exit_status() == 128 + signal.SIGUSR1
  row = pd.read_csv(tmp_path / "r.csv").iloc[0]
  assert row["status"] == "aborted"
  assert row["abort_reason"].startswith("SIGUSR1 received after 640 samples; then: RuntimeError")
  assert "stopped sending heartbeats" in row["abort_reason"]
  _assert_closed_aborted_log(row["log_path"])
