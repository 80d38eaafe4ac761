from harness import cli, compare, config, registry, results, rules
from tests.harness.test_results import make_row


def _csv(tmp_path, name, rows):
  path = str(tmp_path / name)
  for row in rows:
    results.append_row(path, row)
  return path


def test_compare_verdicts_and_exit_codes(tmp_path):
  base = _csv(tmp_path, "base.csv", [make_row(i, time_to_train_s=100.0) for i in range(3)])
  same = _csv(tmp_path, "same.csv", [make_row(i, time_to_train_s=102.0) for i in range(3)])
  slow = _csv(tmp_path, "slow.csv", [make_row(i, time_to_train_s=130.0) for i in range(3)])
  fast = _csv(tmp_path, "fast.csv", [make_row(i, time_to_train_s=70.0, throughput=1500.0)
                                     for i in range(3)])
  assert cli.main(["compare", base, same]) == 0
  assert cli.main(["compare", base, slow]) == 1
  assert cli.main(["compare", base, slow, "--threshold", "0.5"]) == 0
  assert cli.main(["compare", base, fast]) == 0
  assert compare.compare(base, fast, 0.05)["verdict"].tolist() == ["improvement"]


def test_throughput_regression_and_failed_runs_and_missing_keys(tmp_path):
  base = _csv(tmp_path, "base.csv", [make_row(i) for i in range(3)] +
              [make_row(9, framework="tf")])
  slower = _csv(tmp_path, "tp.csv", [make_row(i, throughput=800.0) for i in range(3)] +
                [make_row(9, framework="tf")])
  table = compare.compare(base, slower, 0.05).set_index("framework")
  assert table.loc["jax", "verdict"] == "regression (throughput)"
  assert table.loc["jax", "throughput_ratio"] == 0.8
  failed = _csv(tmp_path, "failed.csv", [make_row(i, status="aborted", time_to_train_s=None)
                                         for i in range(3)] + [make_row(9, framework="tf")])
  assert compare.compare(base, failed, 0.05).set_index("framework").loc["jax", "verdict"] == \
      "regression (no successful run)"
  missing = _csv(tmp_path, "missing.csv", [make_row(i) for i in range(3)])
  table = compare.compare(base, missing, 0.05).set_index("framework")
  assert table.loc["tf", "verdict"] == "missing"
  assert cli.main(["compare", base, missing]) == 0
  assert cli.main(["compare", base, missing, "--require-all"]) == 1


def test_noise_aware_verdict(tmp_path):
  """A 10% slower median is not a regression when the runs themselves spread by +-25%."""
  base = _csv(tmp_path, "base.csv", [make_row(i, time_to_train_s=t) for i, t in
                                     enumerate([75.0, 100.0, 125.0])])
  new = _csv(tmp_path, "new.csv", [make_row(i, time_to_train_s=t) for i, t in
                                   enumerate([85.0, 110.0, 135.0])])
  assert compare.compare(base, new, 0.05)["verdict"].tolist() == ["ok"]


# ----------------------------------------------------------------------------- the CI gate

import os
import shlex

import numpy as np
import pytest
import yaml

from harness.errors import UsageError
from tests.conftest import ROOT

BASELINE = os.path.join(ROOT, "results", "baseline_cpu_mini.csv")
WORKFLOW = os.path.join(ROOT, "docs", "ci", "regression.yml")


def _scaled(tmp_path, name, ttt_factors, tp_factors=None):
  """The committed baseline with each run's time-to-train (and throughput) scaled."""
  frame = results.read_csv(BASELINE)
  frame["time_to_train_s"] = frame["time_to_train_s"] * ttt_factors
  if tp_factors is not None:
    frame["throughput"] = frame["throughput"] * tp_factors
  path = str(tmp_path / name)
  frame[results.COLUMNS].to_csv(path, index=False)
  return path


# Every registered workload, in both frameworks (tests/test_contract.py holds each workload to
# both), with its rules/<benchmark>.yaml run count (checked against mlperf_logging's own table in
# tests/harness/test_framework_neutral_core.py).
WORKLOADS = tuple(registry.names())
FRAMEWORKS = config.FRAMEWORKS
GROUPS = {(w, f) for w in WORKLOADS for f in FRAMEWORKS}
RUNS = {w: rules.load(registry.get(w).mlperf_benchmark).runs_required for w in WORKLOADS}


def test_the_committed_baseline_holds_the_ruleset_s_runs_of_every_workload_and_framework():
  """Each registered workload x framework has exactly its ruleset's run count (MLPerf's: 5, 10
  for BERT and the Transformer; with fewer there is no olympic score to gate), all mini runs
  that succeeded; no group of a workload the registry does not list."""
  assert {"resnet50", "bert"} <= set(WORKLOADS) and min(RUNS.values()) >= 3
  frame = results.read_csv(BASELINE)
  counts = frame.groupby(["workload", "framework"]).size()
  assert set(counts.index) == GROUPS
  assert all(count == RUNS[w] for (w, _), count in counts.items()), counts
  assert set(frame["preset"]) == {"mini"} and set(frame["status"]) == {"success"}
  benchmarks = frame.groupby("workload")["mlperf_benchmark"].unique()
  assert all(list(benchmarks[w]) == [registry.get(w).mlperf_benchmark] for w in WORKLOADS)


def test_gate_on_the_committed_baseline_noise_only_passes(tmp_path):
  """Runs re-drawn within +-8% of the baseline's: no verdict is a regression, exit 0."""
  rng = np.random.default_rng(0)
  rows = len(results.read_csv(BASELINE))
  for trial in range(5):
    noisy = _scaled(tmp_path, f"noisy{trial}.csv", rng.uniform(0.92, 1.08, rows),
                    rng.uniform(0.92, 1.08, rows))
    table = compare.compare(BASELINE, noisy, 0.10)
    assert set(zip(table["workload"], table["framework"])) == GROUPS and len(table) == len(GROUPS)
    assert not table["verdict"].str.startswith("regression").any(), table
    assert cli.main(["compare", BASELINE, noisy, "--threshold", "0.10", "--require-all"]) == 0


@pytest.mark.parametrize("workload", WORKLOADS)
def test_gate_on_the_committed_baseline_planted_regressions_fail(tmp_path, workload):
  """One workload's one framework 60% slower to train (more than its own spread), or its other
  framework with 40% less throughput: that group fails the gate, every other passes."""
  frame = results.read_csv(BASELINE)
  mine = (frame["workload"] == workload).to_numpy()
  jax_rows = mine & (frame["framework"] == "jax").to_numpy()
  tf_rows = mine & (frame["framework"] == "tf").to_numpy()
  slow = _scaled(tmp_path, "slow.csv", np.where(jax_rows, 1.6, 1.0))
  table = compare.compare(BASELINE, slow, 0.10).set_index(["workload", "framework"])
  assert table.loc[(workload, "jax"), "verdict"] == "regression (time-to-train)"
  assert (table.drop(index=(workload, "jax"))["verdict"] == "ok").all(), table
  assert cli.main(["compare", BASELINE, slow, "--threshold", "0.10"]) == 1
  starved = _scaled(tmp_path, "tp.csv", 1.0, np.where(tf_rows, 0.6, 1.0))
  table = compare.compare(BASELINE, starved, 0.10).set_index(["workload", "framework"])
  assert table.loc[(workload, "tf"), "verdict"] == "regression (throughput)"
  assert (table.drop(index=(workload, "tf"))["verdict"] == "ok").all(), table
  assert cli.main(["compare", BASELINE, starved, "--threshold", "0.10"]) == 1


def _ci_runs(script, tmp_path):
  """The run commands a workflow step's bash script makes: it runs here with `python` a shim
  that records `python run_benchmark.py run ...` (argv after the script) and hands every other
  call (`list --names`, the run count) to this interpreter."""
  import json
  import subprocess
  import sys
  shim, record = tmp_path / "bin", tmp_path / "runs.jsonl"
  shim.mkdir()
  (shim / "python").write_text(
      f"#!{sys.executable}\n"
      "import json, os, sys\n"
      "args = sys.argv[1:]\n"
      "if args[:2] == ['run_benchmark.py', 'run']:\n"
      f"  open({str(record)!r}, 'a').write(json.dumps(args[1:]) + '\\n')\n"
      "  sys.exit(0)\n"
      f"os.execv({sys.executable!r}, [{sys.executable!r}] + args)\n")
  (shim / "python").chmod(0o755)
  env = dict(os.environ, PATH=f"{shim}{os.pathsep}{os.environ['PATH']}")
  proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=ROOT, env=env,
                        capture_output=True, text=True)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def test_the_documented_ci_workflow_runs_real_commands(tmp_path):
  """docs/ci/regression.yml: its runs step, executed (GitHub's bash -e -o pipefail) with the run
  commands recorded, runs every baseline group (each registered workload in both frameworks)
  with its ruleset's run count; every run_benchmark.py command parses with our CLI, and the
  compare step can fail the job (not continue-on-error)."""
  with open(WORKFLOW) as f:
    workflow = yaml.safe_load(f)
  steps = workflow["jobs"]["regression"]["steps"]
  literal = [shlex.split(line.strip())[2:] for step in steps
             for line in step.get("run", "").splitlines()
             if line.strip().startswith("python run_benchmark.py") and "$" not in line]
  runs_step = [s for s in steps if "run_benchmark.py run " in s.get("run", "")]
  assert len(runs_step) == 1
  made = _ci_runs(runs_step[0]["run"], tmp_path)
  commands = literal + made
  assert {c[0] for c in commands} == {"run", "compare", "report"}
  parser = cli.build_parser()
  runs = [parser.parse_args(c) for c in commands if c[0] == "run"]
  assert sorted((r.workload, r.framework, r.runs) for r in runs) == sorted(   # every group,
      (w, f, RUNS[w]) for w, f in GROUPS)                                      # its run count
  assert all(r.results == "results/new.csv" and r.seed == 100 for r in runs)
  assert any("--require-all" in c for c in commands)
  for command in commands:
    try:
      parser.parse_args(command)
    except UsageError as e:
      pytest.fail(f"{command}: {e}")
  gate = [s for s in steps if "compare" in s.get("run", "")][0]
  assert not gate.get("continue-on-error") and "if" not in gate
