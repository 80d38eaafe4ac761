"""The documented path to a submission after `run resnet50 --runs 5`: `package`, then `check` on
the package: an open-division mini submission the official package checker passes, and
`summarize` scoring the package as it scores the rows. The five runs are the committed
baseline's JAX ResNet-50 runs (results/baseline_cpu_mini.csv, made by that command; their logs
in results/baseline_logs/): running five more here showed nothing the baseline's do not."""
import os

import pandas as pd
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def test_package_check_and_summarize_five_runs(cli, tmp_path):
  baseline = os.path.join(ROOT, "results", "baseline_cpu_mini.csv")
  rows = pd.read_csv(baseline)
  rows = rows[(rows["workload"] == "resnet50") & (rows["framework"] == "jax")]
  rows = rows.sort_values("started_at").tail(5).copy()    # the ruleset's 5, the latest
  assert len(rows) == 5 and (rows["status"] == "success").all()
  rows["log_path"] = [os.path.join(ROOT, p) for p in rows["log_path"]]   # relative to the root
  csv, out = tmp_path / "results.csv", tmp_path / "package"
  rows.to_csv(csv, index=False)
  proc = cli("package", str(csv), "--submitter", "harness", "--system", "cpu", "--out", str(out))
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  assert "cpu/resnet: 5 runs (open division)" in proc.stdout
  proc = cli("check", str(out / "training_v4.0" / "harness"))
  assert proc.returncode == 0, proc.stdout
  assert proc.stdout.splitlines()[-1].startswith("package check: PASSED")
  proc = cli("summarize", str(csv), str(out / "training_v4.0"))
  scores = [line.split()[-1] for line in proc.stdout.splitlines()[1:]]
  assert len(scores) == 2 and scores[0] == scores[1], proc.stdout
