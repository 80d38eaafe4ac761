"""Two processes started the way a cluster scheduler starts them, on one machine: under a faked
srun step (the variables srun sets, one node at 127.0.0.1), with no --coordinator flags. The
pair ends in one row of a run over both processes' devices (the tiny ResNet to its epoch budget,
--cpu-devices 2 a process: the launch is under test; the mini run over several processes is
tests/parallel/test_jax_distributed.py's and test_tf_distributed.py's), process 0 alone writes
the log and the row (a log the checker passes), and every process says first how it found its
peers. JAX's pair equals one process over its 4 devices started beside it (the evals, epoch
by epoch): this was tests/resnet/test_resnet_end_to_end.py's pair launched with
--coordinator flags (23 CPU s), which the other multi-process tests launch that way."""
import json
import random
import socket

import pandas as pd
import pytest

from harness import compliance
from tests.conftest import start_cli
from tests.harness.test_cluster import slurm

COMMON = ("run", "resnet50", "--preset", "tiny", "--seed", "0", "--cpu-devices", "2")


def _free_slurm_job(count):
  """A job id whose SLURM port (JAX's choice: 61440 + id mod 4096) and the `count` ports from
  it are free on 127.0.0.1."""
  start = random.randrange(4096 - count)
  for offset in list(range(start, 4096 - count)) + list(range(start)):
    try:
      for i in range(count):
        with socket.socket() as s:
          s.bind(("127.0.0.1", 61440 + offset + i))
      return 4096 * 100 + offset
    except OSError:
      continue
  raise RuntimeError("no free SLURM port range on 127.0.0.1")


def _evals(log_path):
  """[(epoch, top-1)] of a log's eval_accuracy events."""
  with open(log_path) as f:
    events = [json.loads(line[len(":::MLLOG "):]) for line in f if line.startswith(":::MLLOG ")]
  return [(e["metadata"]["epoch_num"], e["value"]) for e in events if e["key"] == "eval_accuracy"]


def _pair(tmp_path, name, framework, flags, envs):
  """Two processes of one run: (result row, their outputs)."""
  procs = [start_cli(*COMMON, "--framework", framework, *flags[i],
                     "--results", str(tmp_path / f"{name}.csv"),
                     "--log-dir", str(tmp_path / f"{name}_logs{i}"), few_steps=True,
                     env=envs[i])
           for i in range(2)]
  outs = [p.communicate(timeout=300)[0] for p in procs]
  assert [p.returncode for p in procs] == [1, 1], outs    # tiny: the budget, not the target
  frame = pd.read_csv(tmp_path / f"{name}.csv")
  assert len(frame) == 1 and not (tmp_path / f"{name}_logs1").exists()
  return frame.iloc[0], outs


# TF's pair was here too: tests/parallel/test_slurm_cluster.py launches it under a real srun
# (two nodes, one task each, and one row, process 0's log, each task's cluster line); JAX's
# stays for what the real launch does not show: the pair equals one process over its devices.
@pytest.mark.parametrize("framework", ["jax"])
def test_an_srun_launch_ends_in_one_row_over_both_processes(tmp_path, framework):
  """One row, process 0's, of a run over every process's devices on data. The srun step is the
  launch whose discovery is the framework's own (JAX's SLURM cluster detection, TF's
  SlurmClusterResolver); a pod's variables, like the flags, end in the coordinator address
  and process index the other multi-process tests pass (tests/harness/test_cluster.py reads
  every environment), and its pair here (30 CPU s a framework) showed nothing more."""
  job = _free_slurm_job(2)
  one = None
  if framework == "jax":      # and one process over 4 devices beside them: the same run
    one = start_cli(*COMMON[:-1], "4", "--results", str(tmp_path / "one.csv"),
                    "--log-dir", str(tmp_path / "one_logs"), few_steps=True)
  row, outs = _pair(tmp_path, "slurm", framework, [(), ()],
                    [slurm(job=job, pid=i) for i in range(2)])
  # both processes' devices (TF's MultiWorkerMirroredStrategy: one CPU replica a worker)
  devices = {"jax": 4, "tf": 2}[framework]
  assert row["num_devices"] == devices and row["mesh"] == f"data={devices}", row
  assert row["status"] == "aborted" and row["samples_completed"] > 0, row
  assert row["metric_name"] == "top1_accuracy" and 0 <= row["final_metric"] <= 1, row
  assert compliance.check(row["log_path"])[0]
  if one is not None:
    out = one.communicate(timeout=300)[0]
    assert one.returncode == 1, out                       # tiny: the budget, not the target
    alone = pd.read_csv(tmp_path / "one.csv").iloc[0]
    assert alone["num_devices"] == 4 and alone["status"] == "aborted"
    evals = [_evals(path) for path in (row["log_path"], alone["log_path"])]
    assert [epoch for epoch, _ in evals[0]] == [epoch for epoch, _ in evals[1]] == [1, 2]
    assert [v for _, v in evals[0]] == pytest.approx([v for _, v in evals[1]])
    assert row["final_metric"] == pytest.approx(alone["final_metric"])
  for i, out in enumerate(outs):
    lines = out.splitlines()
    first = next(n for n, line in enumerate(lines) if line.startswith(("cluster:", "[")))
    assert lines[first].startswith(f"cluster: slurm, process {i} of 2"), out[:500]
