from harness import cli, compare, results
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
