import glob
import os
import subprocess
import sys

import pandas as pd
import pytest

from harness import results, summarize
from tests.conftest import SHARED_RESULTS
from tests.harness.test_results import make_row


@pytest.mark.parametrize("minutes, failed, expected", [
    ([5, 1, 2, 3, 4], 0, 3.0),               # drop 1 and 5
    ([1, 2, 3, 4], 1, 3.0),                  # the failed run is the dropped slowest: drop 1 only
    ([1, 2, 3], 2, None),                    # two non-converged runs invalidate
])
def test_olympic_rules(minutes, failed, expected):
  score, note = summarize.olympic_minutes(minutes, failed)
  assert score == expected
  assert (note == "") == (expected is not None)


def test_summarize_our_csv_uses_rules_run_counts(tmp_path):
  path = str(tmp_path / "r.csv")
  for i, seconds in enumerate([600, 120, 180, 240, 300]):
    results.append_row(path, make_row(i, time_to_train_s=seconds, started_at=f"2026-01-0{i+1}"))
  results.append_row(path, make_row(9, framework="tf", time_to_train_s=100))
  table = summarize.summarize([path]).set_index("framework")
  assert table.loc["jax", "score_min"] == pytest.approx((180 + 240 + 300) / 3 / 60)
  assert pd.isna(table.loc["tf", "score_min"])
  assert "needs 5" in table.loc["tf", "note"]


def _official_scores(org_dir, tmp_path):
  """Runs the official summarizer and reads its CSV: {(system_folder, benchmark): minutes}."""
  out = tmp_path / os.path.basename(org_dir)
  subprocess.run([sys.executable, "-m", "mlperf_logging.result_summarizer", org_dir, "training",
                  "0.7.0", "--csv", str(out) + ".csv"], capture_output=True, cwd=tmp_path,
                 check=False, timeout=900)
  frame = pd.read_csv(str(out) + ".csv")
  scores = {}
  for _, row in frame.iterrows():
    folder = row["details_url"].rsplit("/", 1)[-1].removesuffix(".json")
    for bench in ("bert", "dlrm", "gnmt", "maskrcnn", "minigo", "resnet", "ssd", "transformer"):
      if bench in frame.columns and pd.notna(row[bench]):
        scores[(folder, bench)] = float(row[bench])
  return scores


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(SHARED_RESULTS), reason="../shared/mlperf_results missing")
def test_summary_of_mlperf_v07_logs_equals_the_official_summarizer(tmp_path):
  orgs = sorted(glob.glob(os.path.join(SHARED_RESULTS, "*")))
  for org in orgs:
    official = _official_scores(org, tmp_path)
    ours = summarize.summarize([org])
    mine = {(r.system, r.benchmark): r.score_min for r in ours.itertuples() if pd.notna(r.score_min)}
    assert official, f"the official summarizer scored nothing for {org}"
    assert set(mine) == set(official), org
    for key, value in official.items():
      assert mine[key] == pytest.approx(value, abs=1e-6), key


@pytest.mark.skipif(not os.path.isdir(SHARED_RESULTS), reason="../shared/mlperf_results missing")
def test_summarize_accepts_results_folder_and_single_system_folder():
  google = os.path.join(SHARED_RESULTS, "Google")
  whole = summarize.summarize([google]).set_index(["system", "benchmark"])
  from_results = summarize.summarize([os.path.join(google, "results")])
  assert len(from_results) == len(whole)
  one = summarize.summarize([os.path.join(google, "results", "tpu-v3-1024-TF")])
  row = one.set_index("benchmark").loc["maskrcnn"]
  assert row["converged"] == 4 and row["runs"] == 5        # one aborted run: counted as slowest
  assert row["score_min"] == whole.loc[("tpu-v3-1024-TF", "maskrcnn"), "score_min"]


def test_committed_baseline_scores_and_gates_itself():
  """results/baseline_cpu_mini.csv: 5 mini runs per framework measured on a 2-core CPU."""
  import csv
  from harness import compare
  from tests.conftest import ROOT
  path = os.path.join(ROOT, "results", "baseline_cpu_mini.csv")
  table = summarize.summarize([path]).set_index("framework")
  for framework in ("jax", "tf"):
    with open(path) as f:
      times = sorted(float(r["time_to_train_s"]) for r in csv.DictReader(f)
                     if r["framework"] == framework and r["status"] == "success")
    assert len(times) == 5
    assert table.loc[framework, "score_min"] == pytest.approx(sum(times[1:4]) / 3 / 60)
  assert not compare.is_regression(compare.compare(path, path, 0.05))


@pytest.mark.slow
def test_committed_baseline_logs_pass_the_official_checker():
  from harness import compliance
  from tests.conftest import ROOT
  frame = results.read_csv(os.path.join(ROOT, "results", "baseline_cpu_mini.csv"))
  for log in frame["log_path"]:
    passed, report = compliance.check(os.path.join(ROOT, log))
    assert passed, report
