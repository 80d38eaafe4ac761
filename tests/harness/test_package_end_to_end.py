"""The documented three-command path to a submission: `run resnet50 --runs 5`, `package`,
`check` on the package: an open-division mini submission the official package checker passes."""
import pytest

pytestmark = pytest.mark.slow


def test_run_package_check(cli, tmp_path):
  csv, out = tmp_path / "results.csv", tmp_path / "package"
  proc = cli("run", "resnet50", "--runs", "5", "--seed", "0", "--results", str(csv),
             "--log-dir", str(tmp_path / "logs"), "--data-dir", str(tmp_path / "data"))
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  proc = cli("package", str(csv), "--submitter", "harness", "--system", "cpu", "--out", str(out))
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  assert "cpu/resnet: 5 runs (open division)" in proc.stdout
  proc = cli("check", str(out / "training_v4.0" / "harness"))
  assert proc.returncode == 0, proc.stdout
  assert proc.stdout.splitlines()[-1].startswith("package check: PASSED")
  proc = cli("summarize", str(csv), str(out / "training_v4.0"))
  scores = [line.split()[-1] for line in proc.stdout.splitlines()[1:]]
  assert len(scores) == 2 and scores[0] == scores[1], proc.stdout
