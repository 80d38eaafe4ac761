"""`predict`: the breakdown's arithmetic against a hand computation (Google's v0.7 ResNet-50,
TPU v3 16 -> 4,096 chips), the RCP interpolation against mlperf_logging's own RCP checker,
the backtest's rows on a small copy of the MLPerf results, and bad input (one line, exit 2)."""
import json
import math
import os
import shutil
import statistics

import numpy as np
import pytest
from mlperf_logging.rcp_checker import rcp_checker

from harness import cli, predict

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "mlperf_results")
V07 = os.path.join(SHARED, "training_v0.7", "Google")
needs_results = pytest.mark.skipif(not os.path.isdir(V07), reason="../shared/mlperf_results")


@pytest.fixture(scope="module")
def resnet_v3():
  return predict.read_mlperf(os.path.join(V07, "results", "tpu-v3-32-TF2.0", "resnet"))


@needs_results
def test_the_breakdown_is_its_formula(resnet_v3):
  src = resnet_v3
  assert (src.chips, src.global_batch, src.train_samples) == (16, 4096, 1_281_167)
  target = predict.target_from_system(predict.read_system_json(
      os.path.join(V07, "systems", "tpu-v3-8192-JAX.json")))
  assert (target.chips, target.topology) == (4096, "torus:64x64")
  out = predict.predict(src, target, 65536)
  # samples: the 1.0.0 RCP at 65,536 (olympic mean of its runs) x one epoch
  with open(predict._rcp_files("resnet")["1.0.0"]) as f:               # pylint: disable=protected-access
    epochs = sorted(next(r for r in json.load(f).values() if r["BS"] == 65536)
                    ["Epochs to converge"])
  samples = np.mean(epochs[1:-1]) * 1_281_167
  assert out["samples_mean"] == pytest.approx(samples, rel=1e-12)
  assert out["steps_mean"] == math.ceil(samples / 65536)
  # the measured step: (run time - evals) / steps trained, median over the converged runs
  steps = [math.ceil(r.samples / 4096) for r in src.converged()]
  measured = statistics.median((r.minutes * 60 - r.eval_s) / s for r, s in zip(src.converged(),
                                                                              steps))
  assert out["measured_step_s"] == pytest.approx(measured, rel=1e-12)
  # compute: the fixed part, and the rest per example (256 -> 16 a chip)
  compute = measured - out["source_exposed_s"]
  fixed = predict.STEP_FIXED_S
  assert out["compute_s"] == pytest.approx(fixed + (compute - fixed) * 16 / 256, rel=1e-12)
  assert out["step_s"] == pytest.approx(out["compute_s"] + out["exposed_s"], rel=1e-12)
  assert 0 <= out["exposed_s"] <= out["all_reduce_s"]
  evals = statistics.mean(r.evals / r.samples for r in src.converged()) * samples
  assert out["evals_mean"] == pytest.approx(evals, rel=1e-12)
  assert out["minutes_mean"] == pytest.approx(
      (out["steps_mean"] * out["step_s"] + evals * out["eval_s"]) / 60, rel=1e-12)
  assert out["minutes_low"] < out["minutes_mean"] < out["minutes_high"]


@pytest.mark.parametrize("benchmark,ruleset", [("resnet", "4.0.0"), ("bert", "4.0.0"),
                                               ("ssd", "1.0.0"), ("dlrm_dcnv2", "4.0.0")])
def test_rcp_interpolation_is_the_rcp_checkers(benchmark, ruleset):
  checker = rcp_checker.RCP_Checker("training", ruleset, benchmark, False)
  points = predict.rcp_points(benchmark, ruleset)
  batches = [p["bs"] for p in points]
  for bs in batches:                                   # the RCPs themselves
    ours, theirs = predict.rcp_at(points, bs), checker._find_rcp(bs, "full_rcps")  # pylint: disable=protected-access
    assert ours["mean"] == pytest.approx(theirs["RCP Mean"], rel=1e-12)
    assert ours["stdev"] == pytest.approx(theirs["RCP Stdev"], rel=1e-12)
  for lo, hi in zip(batches[:-1], batches[1:]):        # between two of them
    bs = (lo + hi) // 2
    _, theirs = checker._create_interp_rcp(                  # pylint: disable=protected-access
        bs, checker._find_top_min_rcp(bs, "full_rcps"),       # pylint: disable=protected-access
        checker._find_bottom_max_rcp(bs, "full_rcps"))        # pylint: disable=protected-access
    ours = predict.rcp_at(points, bs)
    assert ours["mean"] == pytest.approx(theirs["RCP Mean"], rel=1e-12)
    assert ours["stdev"] == pytest.approx(theirs["RCP Stdev"], rel=1e-12)
  assert predict.rcp_at(points, batches[-1] + 1) is None           # above: not covered
  assert predict.rcp_at(points, 1)["mean"] == points[0]["mean"]    # below: the smallest's


@needs_results
def test_backtest_rows_on_a_family(tmp_path, capsys):
  """A copy of one family (v0.7 ResNet on TPU v3, 16 and 4,096 chips): one row, its error
  predicted / measured - 1, the measured score the official summarizer's."""
  org = tmp_path / "training_v0.7" / "Google"
  for system in ("tpu-v3-32-TF2.0", "tpu-v3-8192-JAX"):
    shutil.copytree(os.path.join(V07, "results", system, "resnet"),
                    org / "results" / system / "resnet")
    (org / "systems").mkdir(parents=True, exist_ok=True)
    shutil.copy(os.path.join(V07, "systems", f"{system}.json"), org / "systems")
  assert cli.main(["predict", "--backtest", str(tmp_path), "--json"]) == 0
  rows = json.loads(capsys.readouterr().out)
  assert len(rows) == 1
  row = rows[0]
  assert set(row) == {"family", "from", "to", "predicted_minutes", "measured_minutes", "error",
                      "reason"}
  assert row["family"] == "v0.7 Google resnet tpu-v3"
  from harness import summarize
  score = summarize.summarize([str(org)])
  measured = score[score["system"] == "tpu-v3-8192-JAX"]["score_min"].iloc[0]
  assert row["measured_minutes"] == pytest.approx(measured)
  assert row["error"] == pytest.approx(row["predicted_minutes"] / measured - 1)
  assert abs(row["error"]) < 0.2


def _error(capsys, *argv):
  assert cli.main(["predict", *argv]) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1, lines
  return lines[0]


@needs_results
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
  empty = tmp_path / "Org" / "results" / "sys" / "resnet"
  empty.mkdir(parents=True)
  assert "no result_*.txt" in _error(capsys, str(empty), "--chips", "64", "--machine", "tpu-v4")
  system = tmp_path / "target.json"
  system.write_text(json.dumps({"accelerator_model_name": "TPU v3", "number_of_nodes": "4"}))
  source = os.path.join(V07, "results", "tpu-v3-32-TF2.0", "resnet")
  assert "missing accelerators_per_node" in _error(capsys, source, "--system", str(system))
  transformer = os.path.join(V07, "results", "tpu-v4-16-TF", "transformer")
  line = _error(capsys, transformer, "--chips", "64", "--machine", "tpu-v4", "--batch", "2048")
  assert "--batch 2048: no RCP of transformer covers it" in line
  gaudi = tmp_path / "gaudi.json"
  gaudi.write_text(json.dumps({"accelerator_model_name": "Habana Gaudi2", "number_of_nodes": "8",
                               "accelerators_per_node": "8"}))
  line = _error(capsys, source, "--system", str(gaudi))
  assert "'Habana Gaudi2' has no simulator preset" in line and "tpu-v4" in line


def test_from_this_harness_csv_to_1024_chips(tmp_path, capsys):
  """A row of this harness's baseline (ResNet mini, JAX, one CPU): its logs read, its model's
  parameters counted by its framework, the breakdown on 1,024 TPU v4 chips."""
  import pandas as pd
  root = os.path.join(os.path.dirname(__file__), "..", "..")
  frame = pd.read_csv(os.path.join(root, "results", "baseline_cpu_mini.csv"))
  frame = frame[(frame["workload"] == "resnet50") & (frame["framework"] == "jax")]
  frame["log_path"] = [os.path.join(root, p) for p in frame["log_path"]]
  frame.to_csv(tmp_path / "rows.csv", index=False)
  assert cli.main(["predict", str(tmp_path / "rows.csv"), "--chips", "1024", "--machine",
                   "tpu-v4", "--batch", "16384", "--json"]) == 0
  out = json.loads(capsys.readouterr().out)
  assert out["chips"] == 1024 and out["to"] == "tpu-v4 torus:16x8x8" and out["per_chip"] == 16
  assert out["parameters"] < 1_000_000            # the mini model's, not ResNet-50's
  assert "a mini preset has no RCP" in out["convergence"]
  assert out["predicted_minutes"] > 0
