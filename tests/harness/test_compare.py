from harness import cli, compare, registry, results, rules
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


WORKLOADS = ("bert", "efficientnet", "resnet50", "ssd", "transformer")
RUNS = {w: rules.load(registry.get(w).mlperf_benchmark).runs_required for w in WORKLOADS}


def test_the_committed_baseline_holds_the_ruleset_s_runs_of_every_workload_and_framework():
  """5 runs per group, 10 for BERT and the Transformer (MLPerf's run counts: with fewer there
  is no olympic score to gate)."""
  assert RUNS == {"bert": 10, "efficientnet": 5, "resnet50": 5, "ssd": 5, "transformer": 10}
  frame = results.read_csv(BASELINE)
  counts = frame.groupby(["workload", "framework"]).size()
  assert set(counts.index) == {(w, f) for w in WORKLOADS for f in ("jax", "tf")}
  assert all(count == RUNS[w] for (w, _), count in counts.items()), counts
  assert set(frame["preset"]) == {"mini"} and set(frame["status"]) == {"success"}


def test_gate_on_the_committed_baseline_noise_only_passes(tmp_path):
  """Runs re-drawn within +-8% of the baseline's: no verdict is a regression, exit 0."""
  rng = np.random.default_rng(0)
  rows = len(results.read_csv(BASELINE))
  for trial in range(5):
    noisy = _scaled(tmp_path, f"noisy{trial}.csv", rng.uniform(0.92, 1.08, rows),
                    rng.uniform(0.92, 1.08, rows))
    table = compare.compare(BASELINE, noisy, 0.10)
    assert len(table) == 10 and not table["verdict"].str.startswith("regression").any(), table
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


def test_the_documented_ci_workflow_runs_real_commands():
  """docs/ci/regression.yml: every run_benchmark.py command parses with our CLI, and the
  compare step can fail the job (not continue-on-error)."""
  with open(WORKFLOW) as f:
    workflow = yaml.safe_load(f)
  steps = workflow["jobs"]["regression"]["steps"]
  commands = [shlex.split(line.strip())[2:] for step in steps
              for line in step.get("run", "").splitlines()
              if line.strip().startswith("python run_benchmark.py")]
  assert {c[0] for c in commands} == {"run", "compare", "report"}
  parser = cli.build_parser()
  runs = [parser.parse_args(c) for c in commands if c[0] == "run"]
  assert sorted((r.workload, r.framework, r.runs) for r in runs) == sorted(   # every group,
      (w, f, RUNS[w]) for w in WORKLOADS for f in ("jax", "tf"))    # its ruleset's run count
  assert any("--require-all" in c for c in commands)
  for command in commands:
    try:
      parser.parse_args(command)
    except UsageError as e:
      pytest.fail(f"{command}: {e}")
  gate = [s for s in steps if "compare" in s.get("run", "")][0]
  assert not gate.get("continue-on-error") and "if" not in gate
