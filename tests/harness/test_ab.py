"""`ab`: the baseline commit and the working tree on one machine in ABBA rounds, the same seeds
on both sides, the baseline's worktree removed however the A/B ends, and compare's gate."""
import glob
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from harness import ab, cli, results
from tests import fork_server
from tests.conftest import ROOT, clean_env


def _git(*args):
  return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


if _git("rev-parse", "HEAD").returncode != 0:
  pytest.skip("ab checks out REF with git: this copy of the project is not a git checkout",
              allow_module_level=True)


def _worktrees():
  listed = _git("worktree", "list", "--porcelain").stdout.splitlines()
  return [line.split(" ", 1)[1] for line in listed if line.startswith("worktree ")]


def test_the_schedule_is_abba_per_group_with_one_seed_per_round():
  steps = ab.schedule([("dlrm", "jax"), ("bert", "tf")], {"dlrm": 4, "bert": 2}, seed=100)
  for group in (("dlrm", "jax"), ("bert", "tf")):
    mine = [s for s in steps if (s.workload, s.framework) == group]
    rounds = 4 if group[0] == "dlrm" else 2
    assert "".join(s.side for s in mine) == "ABBAABBA"[:2 * rounds]
    assert [s.seed for s in mine if s.side == "A"] == list(range(100, 100 + rounds))
    assert [s.seed for s in mine if s.side == "B"] == list(range(100, 100 + rounds))
  assert [s.order for s in steps] == list(range(len(steps))) and len(steps) == 12
  # a round's pairs stay together: dlrm's round-2 pair is not split by bert's
  assert [(s.workload, s.side) for s in steps[:4]] == [
      ("dlrm", "A"), ("dlrm", "B"), ("bert", "A"), ("bert", "B")]
  # bert's two rounds done, dlrm's rounds 3 and 4 run on alone
  assert [(s.workload, s.side, s.round) for s in steps[-4:]] == [
      ("dlrm", "A", 2), ("dlrm", "B", 2), ("dlrm", "B", 3), ("dlrm", "A", 3)]


def test_a_b_of_head_against_the_working_tree(tmp_path, monkeypatch, capsys):
  """DLRM tiny in JAX to a target its first eval reaches, 2 rounds: the four runs ran A B B A
  (their rows' start times), A from a worktree of HEAD and B from the working tree, with seeds
  100 and 101 on both sides and the same samples to target seed by seed; the worktree is gone
  after; compare's verdict is read (2 runs a side cannot reach the level: too few runs, which
  passes without --require-all)."""
  launched = []

  def forked(argv, cwd, output):      # the runs forked from the tests' server: no imports
    launched.append((argv[0], cwd, os.path.isfile(argv[0])))
    proc = fork_server.start(argv, cwd, clean_env(few_steps=True), merge_stderr=True)
    text, _ = proc.communicate(timeout=300)
    with open(output, "w") as f:
      f.write(text)
    return proc.returncode

  monkeypatch.setattr(ab, "launch_process", forked)
  out = tmp_path / "ab"
  before = _worktrees()
  args = ["ab", "HEAD", "--workloads", "dlrm", "--frameworks", "jax", "--preset", "tiny",
          "--set", "train.target=0.01", "--rounds", "2", "--out", str(out)]
  assert cli.main(args) == 0
  printed = capsys.readouterr().out
  head = _git("rev-parse", "--short", "HEAD").stdout.strip()
  assert printed.startswith(f"A/B in {out}: A = REF HEAD ({head}), B = the working tree at "
                            f"{head}")
  assert "verdict: no regression" in printed

  base, new = results.read_csv(out / "base.csv"), results.read_csv(out / "new.csv")
  assert list(base["status"]) == list(new["status"]) == ["success", "success"]
  assert list(base["seed"]) == list(new["seed"]) == [100, 101]
  assert list(base["samples_to_converge"]) == list(new["samples_to_converge"])
  assert set(base["git_commit"]) == set(new["git_commit"]) == {head}
  rows = pd.concat([base.assign(side="A"), new.assign(side="B")])
  rows["when"] = pd.to_datetime(rows["started_at"])
  rows = rows.sort_values("when")
  assert rows["when"].is_monotonic_increasing and rows["when"].is_unique   # no ties
  assert "".join(rows["side"]) == "ABBA"
  assert list(rows["seed"]) == [100, 100, 101, 101]
  schedule = pd.read_csv(out / "schedule.csv")
  assert list(schedule["run_id"]) == list(rows["run_id"])       # the order run is the rows'
  assert list(schedule["exit_status"]) == [0, 0, 0, 0]

  sides = [cwd for _, cwd, _ in launched]
  worktree = sides[0]
  assert [s == worktree for s in sides] == [True, False, False, True]
  assert sides[1] == sides[2] == ROOT and os.path.basename(
      os.path.dirname(worktree)).startswith("harness-ab-")
  assert all(existed for _, _, existed in launched)              # A's script: the worktree's
  assert launched[0][0] == os.path.join(worktree, "run_benchmark.py")
  assert not os.path.exists(worktree) and not os.path.exists(os.path.dirname(worktree))
  assert _worktrees() == before

  from harness import compare            # compare's verdict, as the A/B printed it
  gated = compare.compare(str(out / "base.csv"), str(out / "new.csv"))
  assert list(gated["convergence"]) == ["same (2 seeds)"]
  assert gated["verdict"][0].startswith("too few runs (2 vs 2")
  assert gated["verdict"][0] in printed and "same (2 seeds)" in printed
  # an A/B into the same folder would mix two comparisons: refused before anything runs
  assert cli.main(args) == 2
  assert "already holds base.csv" in capsys.readouterr().err
  assert len(launched) == 4


def test_ctrl_c_stops_the_runs_and_removes_the_worktree(tmp_path):
  """The real command, its runs real processes: SIGINT once the first (baseline) run has
  started: exit 130, one line on stderr, the worktree and its registration gone."""
  tmp = tmp_path / "tmp"
  tmp.mkdir()
  out = tmp_path / "ab"
  before = _worktrees()
  proc = subprocess.Popen(
      [sys.executable, "run_benchmark.py", "ab", "HEAD", "--workloads", "dlrm", "--frameworks",
       "jax", "--preset", "tiny", "--rounds", "1", "--out", str(out)], cwd=ROOT,
      env=dict(clean_env(), TMPDIR=str(tmp)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True)
  deadline = time.monotonic() + 120
  while not glob.glob(str(out / "output" / "000_A_*")) and proc.poll() is None:
    assert time.monotonic() < deadline, "the first run never started"
    time.sleep(0.1)
  assert glob.glob(str(tmp / "harness-ab-*" / "base" / "run_benchmark.py"))  # the worktree
  proc.send_signal(signal.SIGINT)
  stdout, stderr = proc.communicate(timeout=180)
  assert proc.returncode == 128 + signal.SIGINT, stdout + stderr
  lines = stderr.strip().splitlines()
  assert len(lines) == 1 and "SIGINT received: the A/B stopped, its worktree removed" in lines[0]
  assert "Traceback" not in stderr
  assert not glob.glob(str(tmp / "harness-ab-*"))
  assert _worktrees() == before


def test_a_failing_run_still_removes_the_worktree(tmp_path, monkeypatch):
  """An error inside the A/B (here the launcher's) leaves no worktree behind either."""
  seen = []

  def broken(argv, cwd, output):
    seen.append(cwd)
    raise OSError("no such interpreter")

  monkeypatch.setattr(ab, "launch_process", broken)
  before = _worktrees()
  with pytest.raises(OSError, match="no such interpreter"):
    cli.main(["ab", "HEAD", "--workloads", "dlrm", "--frameworks", "jax", "--preset", "tiny",
              "--rounds", "1", "--out", str(tmp_path / "ab")])
  assert len(seen) == 1 and seen[0] != ROOT and not os.path.exists(seen[0])
  assert _worktrees() == before
