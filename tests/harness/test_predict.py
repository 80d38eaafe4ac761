"""`predict`: the breakdown's arithmetic against a hand computation (Google's v0.7 ResNet-50,
TPU v3 16 -> 4,096 chips), the RCP interpolation against mlperf_logging's own RCP checker,
the backtest's rows on a small copy of the MLPerf results, and bad input (one line, exit 2)."""
import glob
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
SCALING = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "mlperf_scaling")
V07 = os.path.join(SHARED, "training_v0.7", "Google")
needs_results = pytest.mark.skipif(not os.path.isdir(V07), reason="../shared/mlperf_results")
ROUNDS = sorted(glob.glob(os.path.join(SHARED, "training_v*"))
                + glob.glob(os.path.join(SCALING, "training_v*")))
needs_all_rounds = pytest.mark.skipif(
    not (os.path.isdir(SHARED) and os.path.isdir(SCALING)),
    reason="../shared/mlperf_results and ../shared/mlperf_scaling (the MLPerf development data) "
           "are not beside this checkout")


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
  # samples: each measured run's x RCP(65,536) / RCP(4,096) (the 1.0.0 RCPs, olympic means)
  with open(predict._rcp_files("resnet")["1.0.0"]) as f:               # pylint: disable=protected-access
    table = json.load(f).values()
  rcp = {bs: np.mean(sorted(next(r for r in table if r["BS"] == bs)["Epochs to converge"])[1:-1])
         for bs in (4096, 65536)}
  ratio = rcp[65536] / rcp[4096]
  runs = src.converged()
  assert all(r.counted for r in runs) and len(runs) == len(src.runs)
  samples = [r.samples * ratio for r in runs]
  assert out["samples_ratio"] == pytest.approx(ratio, rel=1e-12)
  assert out["samples_mean"] == pytest.approx(statistics.mean(samples), rel=1e-12)
  # each run's step: (run time - evals) / steps trained; the measured step is their median
  per_step = [(r.minutes * 60 - r.eval_s) / math.ceil(r.samples / 4096) for r in runs]
  assert out["measured_step_s"] == pytest.approx(statistics.median(per_step), rel=1e-12)
  # compute: the fixed part, and the rest per example (256 -> 16 a chip)
  compute = out["measured_step_s"] - out["source_exposed_s"]
  fixed = predict.STEP_FIXED_S
  assert out["compute_s"] == pytest.approx(fixed + (compute - fixed) * 16 / 256, rel=1e-12)
  assert 0 <= out["exposed_s"] <= out["all_reduce_s"]
  # the step ratio: the model on the target over the model on the source (its own system)
  own = predict.source_target(src)
  source_model = compute + predict.exposed_all_reduce(out["parameters"], compute, own)[1]
  step_ratio = (out["compute_s"] + out["exposed_s"]) / source_model
  assert out["step_ratio"] == pytest.approx(step_ratio, rel=1e-12)
  eval_each = statistics.mean(r.eval_s / r.evals for r in runs)
  eval_t = predict.EVAL_FIXED_S + (eval_each - predict.EVAL_FIXED_S) * 16 / 4096
  minutes = [(math.ceil(s / 65536) * step * step_ratio
              + r.evals * ratio * (r.eval_s / r.evals) * eval_t / eval_each) / 60
             for r, s, step in zip(runs, samples, per_step)]
  olympic = statistics.mean(sorted(minutes)[1:-1])
  assert out["predicted_minutes"] == pytest.approx(olympic, rel=1e-12)
  assert out["minutes_low"] == pytest.approx(min(minutes), rel=1e-12)
  assert out["minutes_high"] == pytest.approx(max(minutes), rel=1e-12)


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


def _baseline_rows(tmp_path):
  """The ResNet mini JAX rows of this harness's CPU baseline, their logs found from tmp_path."""
  import pandas as pd
  root = os.path.join(os.path.dirname(__file__), "..", "..")
  frame = pd.read_csv(os.path.join(root, "results", "baseline_cpu_mini.csv"))
  frame = frame[(frame["workload"] == "resnet50") & (frame["framework"] == "jax")]
  frame["log_path"] = [os.path.join(root, p) for p in frame["log_path"]]
  frame.to_csv(tmp_path / "rows.csv", index=False)
  return str(tmp_path / "rows.csv")


def test_a_cpu_row_is_refused_for_another_accelerator(tmp_path, capsys):
  """A CPU row's step says nothing of a TPU's: refused without --step-s, one line naming the
  file and the flag that would allow it."""
  rows = _baseline_rows(tmp_path)
  line = _error(capsys, rows, "--chips", "1024", "--machine", "tpu-v4", "--batch", "16384")
  assert rows in line and "'cpu'" in line and "--step-s SECONDS" in line
  assert "--step-s 0.0 is out of range; allowed: seconds > 0" in _error(
      capsys, rows, "--chips", "4", "--machine", "tpu-v4", "--step-s", "0")


def test_from_this_harness_csv_with_a_measured_step(tmp_path, capsys):
  """A CPU row of this harness's baseline (ResNet mini, JAX, one CPU) on one TPU v4 chip at 4x
  its examples, with the step given as measured on a TPU v4 chip: the prediction against the
  documented model written out here (no all-reduce on one chip, so every term is by hand)."""
  rows = _baseline_rows(tmp_path)
  measured = predict.read_result(rows)
  assert (measured.machine, measured.chips, measured.sample_unit) == (None, 1, "mini")
  given, b_s = 0.030, measured.global_batch
  assert cli.main(["predict", rows, "--chips", "1", "--machine", "tpu-v4", "--batch",
                   str(4 * b_s), "--step-s", str(given), "--json"]) == 0
  out = json.loads(capsys.readouterr().out)
  assert out["parameters"] < 1_000_000            # the mini model's, not ResNet-50's
  assert "a mini preset has no RCP" in out["convergence"] and out["samples_ratio"] == 1.0
  runs = measured.scored()[0]
  per_step = [(r.minutes * 60 - r.eval_s) / math.ceil(r.samples / b_s) for r in runs]
  cpu_step = statistics.median(per_step)
  # the step at 4x the examples: 4 ms fixed + the rest x 4; given for one chip, one chip here
  step = (0.004 + (given - 0.004) * 4) / (0.004 + (given - 0.004) * 1) * given
  assert out["step_s"] == pytest.approx(step, rel=1e-12)
  assert out["exposed_s"] == 0 and out["chip_speed"] == 1.0
  # each run: its samples at 4x the batch, its own step and evals scaled by given / CPU step
  eval_each = statistics.mean(r.eval_s / r.evals for r in runs)
  eval_t = 0.2 + (eval_each - 0.2) * 1 / 1           # one chip measured, one chip here
  minutes = []
  for run, own_step in zip(runs, per_step):
    steps = math.ceil(run.samples / (4 * b_s))
    minutes.append((steps * own_step * step / cpu_step
                    + run.eval_s * eval_t / eval_each * given / cpu_step) / 60)
  assert out["predicted_minutes"] == pytest.approx(statistics.mean(sorted(minutes)[1:-1]),
                                                   rel=1e-12)
  # on 1,024 chips: the same, plus the all-reduce the simulator exposes
  assert cli.main(["predict", rows, "--chips", "1024", "--machine", "tpu-v4", "--batch",
                   "16384", "--step-s", str(given), "--json"]) == 0
  big = json.loads(capsys.readouterr().out)
  assert big["to"] == "tpu-v4 torus:16x8x8" and big["per_chip"] == 16
  compute = 0.004 + (given - 0.004) * 16 / b_s
  target = predict.make_target(1024, "tpu-v4")
  exposed = predict.exposed_all_reduce(big["parameters"], compute, target)[1]
  assert big["compute_s"] == pytest.approx(compute, rel=1e-12)
  assert big["step_s"] == pytest.approx((compute + exposed) / given * given, rel=1e-12)


@needs_all_rounds
def test_the_backtest_over_every_round_folder(capsys):
  """Every round folder of the development data at once: exit 0, nothing on stderr, each row
  predicted or refused in one line that names the folder or file it is about."""
  assert len(ROUNDS) >= 8
  assert cli.main(["predict", "--backtest", *ROUNDS, "--json"]) == 0
  captured = capsys.readouterr()
  assert captured.err == ""
  rows = json.loads(captured.out)
  assert sum(r["predicted_minutes"] is not None for r in rows) >= 25
  refused = [r for r in rows if r["reason"]]
  assert refused                       # DLRM, GPT-3, Mask R-CNN, ...: each with its reason
  for row in refused:
    assert row["predicted_minutes"] is None
    assert "\n" not in row["reason"] and "Traceback" not in row["reason"]
    assert os.sep + "training_v" in row["reason"], row      # the folder or file it is about


@pytest.fixture(scope="module")
def every_family():
  """Each family's smallest system of the development data, read."""
  found = predict.families(ROUNDS)
  return {key: predict.read_mlperf(members[0][1]) for key, members in sorted(found.items())
          if os.path.basename(members[0][1]) != "minigo"}     # minigo logs no batch: refused


@needs_all_rounds
def test_the_source_itself_is_its_measured_score(every_family):
  """Predicting a family's source on its own system at its own batch returns its measured
  score (the official summarizer's, as test_backtest_rows_on_a_family checks it): the samples
  are its runs' own (the RCP only a ratio), and every factor is 1."""
  assert len(every_family) >= 50
  scored = 0
  for key, measured in every_family.items():
    out = predict.predict(measured, predict.source_target(measured), measured.global_batch)
    assert out["same_system"] and out["samples_ratio"] == 1.0, key
    if measured.score_minutes is None:  # every log fails its round's compliance check
      continue
    assert out["predicted_minutes"] == pytest.approx(measured.score_minutes, rel=1e-12,
                                                     abs=0), key
    scored += 1
  assert scored >= 45


def _round_copy(tmp_path, systems, org="Google", round_dir="training_v0.7"):
  """A copy of v0.7 Google systems' ResNet folders and descriptions under tmp_path."""
  org_dir = tmp_path / round_dir / org
  (org_dir / "systems").mkdir(parents=True, exist_ok=True)
  for system in systems:
    shutil.copytree(os.path.join(V07, "results", system, "resnet"),
                    org_dir / "results" / system / "resnet")
    shutil.copy(os.path.join(V07, "systems", f"{system}.json"), org_dir / "systems")
  return org_dir


@needs_results
def test_a_list_where_one_number_belongs_is_one_line(tmp_path, capsys):
  """A log whose global_batch_size is a list: that folder refused in one line naming the
  field and the file; the rest of the family still predicted, exit 0."""
  org_dir = _round_copy(tmp_path, ["tpu-v3-32-TF2.0", "tpu-v3-8192-JAX", "tpu-v3-8192-TF"])
  bad = org_dir / "results" / "tpu-v3-8192-TF" / "resnet" / "result_3.txt"
  text = bad.read_text()
  assert '"key": "global_batch_size", "value": 65536' in text
  bad.write_text(text.replace('"key": "global_batch_size", "value": 65536',
                              '"key": "global_batch_size", "value": [32768, 32768]'))
  with pytest.raises(predict.UsageError) as e:
    predict.read_mlperf(str(bad.parent))
  assert str(e.value) == (f"{bad}: global_batch_size is [32768, 32768] (a list), not one "
                          "number; allowed: one number >= 0")
  assert cli.main(["predict", "--backtest", str(tmp_path), "--json"]) == 0
  rows = {r["to"]: r for r in json.loads(capsys.readouterr().out)}
  assert rows["tpu-v3-8192-TF (4096 chips)"]["reason"] == str(e.value)
  assert rows["tpu-v3-8192-JAX (4096 chips)"]["predicted_minutes"] > 0
  # the text table lists it below, in full
  assert cli.main(["predict", "--backtest", str(tmp_path)]) == 0
  out = capsys.readouterr().out
  assert f"v0.7 Google resnet tpu-v3 -> tpu-v3-8192-TF (4096 chips): {e.value}" in out
  assert "1 predicted, 1 refused" in out


@needs_results
def test_a_folder_without_results_is_one_line_and_exit_2(tmp_path, capsys):
  (tmp_path / "empty" / "training_v9.9").mkdir(parents=True)
  line = _error(capsys, "--backtest", str(tmp_path / "empty"))
  assert line == (f"run_benchmark.py: error: {tmp_path / 'empty'}: holds no MLPerf result logs; "
                  "allowed: a folder with training_vX.Y/<org>/results/<system>/<benchmark>/"
                  "result_*.txt (a round folder, an org folder, or their parent)")
  # a folder of results with no two sizes of one family: said, nothing to predict, exit 0
  _round_copy(tmp_path / "one", ["tpu-v3-32-TF2.0"])
  assert cli.main(["predict", "--backtest", str(tmp_path / "one")]) == 0
  assert "no scaling family" in capsys.readouterr().out
