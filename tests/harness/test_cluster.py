"""How a run finds its peers (harness/cluster.py): srun's, TF_CONFIG's and a Kubernetes pod's
variables, the flags' precedence, one-line errors (exit 2, before any framework loads) for a
partial or contradictory environment, the line `describe` and the run print; and the cluster
files in docs/cluster/ (their commands parse with the CLI's own argparse, the TF JobSet's
TF_CONFIG is one the harness reads)."""
import json
import os
import re
import shlex
import subprocess

import pytest
import yaml

from harness import cli as cli_lib
from harness import cluster
from harness.errors import UsageError
from tests.conftest import ROOT


def slurm(job=409_700, pid=0, tasks=2, nodes=1, **more):
  """The variables srun sets in one task of a one-node step (a subset: what is read)."""
  env = {"SLURM_JOB_ID": str(job), "SLURM_STEP_NODELIST": "127.0.0.1",
         "SLURM_NTASKS": str(tasks), "SLURM_STEP_NUM_TASKS": str(tasks),
         "SLURM_PROCID": str(pid), "SLURM_LOCALID": str(pid), "SLURM_NODEID": "0",
         "SLURM_STEP_TASKS_PER_NODE": str(tasks), "SLURM_STEP_NUM_NODES": "1",
         "SLURM_JOB_NUM_NODES": str(nodes)}
  return {**env, **more}


def tf_config(port, index, workers=2):
  return {"TF_CONFIG": json.dumps({"cluster": {"worker": [f"127.0.0.1:{port + i}"
                                                          for i in range(workers)]},
                                   "task": {"type": "worker", "index": index}})}


def kubernetes(port, index, count=2):
  return {cluster.K8S_INDEX: str(index), cluster.K8S_COUNT: str(count),
          cluster.K8S_COORDINATOR: f"127.0.0.1:{port}"}


def test_each_environment_gives_the_process_count_id_and_coordinator():
  found = cluster.detect(slurm(job=409_700 + 5, pid=1))
  assert (found.source, found.num_processes, found.process_id, found.coordinator) == (
      "slurm", 2, 1, "")
  assert found.slurm_port == 61440 + (409_705 % 4096)        # JAX's SlurmCluster's choice
  found = cluster.detect(tf_config(2222, 1, workers=3))
  assert (found.source, found.num_processes, found.process_id, found.coordinator) == (
      "tf_config", 3, 1, "127.0.0.1:2222")
  chief = json.dumps({"cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"]},
                      "task": {"type": "worker", "index": 1}})
  assert (cluster.detect({"TF_CONFIG": chief}).process_id,
          cluster.detect({"TF_CONFIG": chief}).num_processes) == (2, 3)
  found = cluster.detect(kubernetes(1234, 1))
  assert (found.source, found.num_processes, found.process_id, found.coordinator) == (
      "kubernetes", 2, 1, "127.0.0.1:1234")
  assert cluster.detect({}).source == "single"
  # slurm before TF_CONFIG before the pod index
  assert cluster.detect({**kubernetes(1, 0), **tf_config(5, 0), **slurm()}).source == "slurm"
  assert cluster.detect({**kubernetes(1, 0), **tf_config(5, 0)}).source == "tf_config"
  # an allocation's shell (salloc, the batch script) with one task is one process
  assert cluster.detect({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}
                        ).source == "single"
  assert cluster.detect(slurm(tasks=1)).num_processes == 1


@pytest.mark.parametrize("env,variable", [
    (slurm(tasks=1, nodes=2), "SLURM_NTASKS=1 on a 2-node allocation"),
    (slurm(pid=2), "SLURM_PROCID='2' is out of range; allowed: 0..1"),
    (slurm(SLURM_STEP_NUM_TASKS="4"), "SLURM_STEP_NUM_TASKS=4 contradicts SLURM_NTASKS=2"),
    ({k: v for k, v in slurm().items() if k != "SLURM_STEP_NODELIST"},
     "SLURM_STEP_NODELIST is not set, but SLURM_NTASKS=2"),
    ({k: v for k, v in slurm().items() if k != "SLURM_STEP_TASKS_PER_NODE"},
     "SLURM_STEP_TASKS_PER_NODE is not set"),
    (slurm(SLURM_JOB_ID="x1"), "SLURM_JOB_ID='x1' is out of range"),
    (tf_config(1, 2), "TF_CONFIG task index 2 is out of range for 2 worker task(s); allowed: 0..1"),
    ({"TF_CONFIG": "{not json"}, "TF_CONFIG='{not json' is not a TF_CONFIG"),
    ({"TF_CONFIG": json.dumps({"cluster": {"ps": ["a:1"], "worker": ["b:1"]},
                               "task": {"type": "worker", "index": 0}})},
     "TF_CONFIG task type 'ps' is not run here"),
    (kubernetes(1, 2), "JOB_COMPLETION_INDEX='2' is out of range; allowed: 0..1"),
    ({cluster.K8S_INDEX: "0"}, "HARNESS_NUM_PROCESSES is not set, but JOB_COMPLETION_INDEX=0"),
    ({cluster.K8S_INDEX: "0", cluster.K8S_COUNT: "2"}, "JAX_COORDINATOR_ADDRESS is not set"),
])
def test_a_partial_or_contradictory_environment_names_the_variable(env, variable):
  with pytest.raises(UsageError) as error:
    cluster.detect(env)
  assert variable in str(error.value) and "\n" not in str(error.value)


def test_the_command_line_refuses_a_bad_environment_in_one_line_before_loading_a_framework(
    cli, tmp_path):
  results = tmp_path / "r.csv"
  proc = cli("run", "resnet50", "--seed", "0", "--results", str(results),
             env=slurm(tasks=1, nodes=2))
  assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
  assert "SLURM_NTASKS=1 on a 2-node allocation" in proc.stderr and not results.exists()
  proc = cli("run", "resnet50", "--framework", "tf", "--seed", "0", env=kubernetes(1, 0))
  assert proc.returncode == 2 and "TensorFlow finds its workers by TF_CONFIG" in proc.stderr


def test_flags_win_over_the_environment_and_describe_says_how_the_cluster_was_found(cli):
  parser = cli_lib.build_parser()
  args = parser.parse_args(["run", "resnet50", "--coordinator", "127.0.0.1:5",
                            "--num-processes", "2", "--process-id", "1"])
  os.environ.update(tf_config(9, 0))
  try:
    found = cli_lib._cluster(args)           # pylint: disable=protected-access
  finally:
    del os.environ["TF_CONFIG"]
  assert (found.source, found.process_id, found.coordinator) == ("flags", 1, "127.0.0.1:5")
  proc = cli("describe", "resnet50", "--preset", "tiny", env=slurm(pid=1))
  assert proc.returncode == 0, proc.stderr
  line = next(l for l in proc.stdout.splitlines() if l.startswith("cluster:"))
  assert "slurm, process 1 of 2" in line and "SLURM_JOB_ID=409700" in line


def _srun_line(path):
  """The first `srun ...` command of a file, backslash continuations joined."""
  with open(path) as f:
    text = f.read().replace("\\\n", " ")
  return " ".join(next(line for line in text.splitlines()
                       if line.strip().startswith("srun ")).split())


def _cluster_commands():
  """The run_benchmark.py commands of docs/cluster/: the sbatch's srun line and each JobSet's."""
  srun = _srun_line(os.path.join(ROOT, "docs", "cluster", "slurm.sbatch"))
  docs = list(yaml.safe_load_all(open(os.path.join(ROOT, "docs", "cluster", "jobset.yaml"))))
  pods = [d["spec"]["replicatedJobs"][0]["template"]["spec"] for d in docs]
  containers = [pod["template"]["spec"]["containers"][0] for pod in pods]
  return srun, docs, pods, containers


def test_the_cluster_files_parse_and_start_what_the_harness_reads(tmp_path):
  srun, docs, pods, containers = _cluster_commands()
  subprocess.run(["bash", "-n", os.path.join(ROOT, "docs", "cluster", "slurm.sbatch")],
                 check=True)
  assert srun == _srun_line(os.path.join(ROOT, "README.md"))     # the README's command
  parser = cli_lib.build_parser()
  example = {"WORKLOAD": "bert", "FRAMEWORK": "tf", "PRESET": "reference", "DATA_DIR": "/d",
             "SLURM_JOB_ID": "42", "RESULTS": "results/slurm-42.csv",
             "LOG_DIR": "logs/slurm-42", "RUN_ARGS": "--heartbeat-timeout 10"}
  words = shlex.split(re.sub(r"\$(\w+)", lambda m: example[m.group(1)], srun))
  assert words[:3] == ["srun", "python", "run_benchmark.py"]
  args = parser.parse_args(words[3:])
  assert (args.command, args.workload, args.framework, args.seed) == ("run", "bert", "tf", 42)
  assert (args.log_dir, args.heartbeat_timeout) == ("logs/slurm-42", 10)
  assert not {"--coordinator", "--num-processes", "--process-id"} & set(words)
  assert [d["kind"] for d in docs] == ["JobSet", "JobSet"]
  assert all(p["completionMode"] == "Indexed" and p["completions"] == p["parallelism"] == 2
             for p in pods)
  jax_pod, tf_pod = containers
  assert jax_pod["command"][:2] == ["python", "run_benchmark.py"]
  assert parser.parse_args(jax_pod["command"][2:]).framework == "jax"
  env = {e["name"]: e["value"] for e in jax_pod["env"]}
  found = cluster.detect({**env, cluster.K8S_INDEX: "1"})
  assert (found.source, found.num_processes, found.process_id) == ("kubernetes", 2, 1)
  host = found.coordinator.split(".")[0]       # pod 0 of the JobSet through its service
  assert host == f"{docs[0]['metadata']['name']}-workers-0-0"
  export, run = tf_pod["args"][0].split(" && exec ")
  assert parser.parse_args(shlex.split(run)[2:]).framework == "tf"
  shown = subprocess.run(["sh", "-c", export + ' && printf %s "$TF_CONFIG"'], check=True,
                         capture_output=True, text=True, env={cluster.K8S_INDEX: "1"}).stdout
  found = cluster.detect({"TF_CONFIG": shown})
  assert (found.source, found.num_processes, found.process_id) == ("tf_config", 2, 1)
  assert found.coordinator.startswith(f"{docs[1]['metadata']['name']}-workers-0-0.")
