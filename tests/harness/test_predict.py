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
from harness.errors import UsageError

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
  # compute: the fixed part (the floor and LARS's update over the TPU v3's HBM: 5 x 4 B a
  # parameter at 900 GB/s, sharded over the replicas by XLA: 16 on the source, 4,096 on the
  # target), and the rest per example (256 -> 16 a chip)
  compute = out["measured_step_s"] - out["source_exposed_s"]
  update = 25_557_032 * 20 / 900e9
  assert out["optimizer_update_s"] == pytest.approx(update / 4096, rel=1e-12)
  fixed_s = predict.LAUNCH_FLOOR_S + update / 16
  fixed_t = predict.LAUNCH_FLOOR_S + update / 4096
  assert out["compute_s"] == pytest.approx(fixed_t + (compute - fixed_s) * 16 / 256, rel=1e-12)
  assert 0 <= out["exposed_s"] <= out["all_reduce_s"]
  # the step ratio: the model on the target over the model on the source (its own system)
  own = predict.source_target(src)
  source_model = compute + predict.exposed_all_reduce(out["parameters"], compute, own)[1]
  step_ratio = (out["compute_s"] + out["exposed_s"]) / source_model
  assert out["step_ratio"] == pytest.approx(step_ratio, rel=1e-12)
  # the evals: top-1 is reduced on the chips, so an eval is all forward passes: x 16 / 4,096
  eval_each = statistics.mean(r.eval_s / r.evals for r in runs)
  eval_t = eval_each * 16 / 4096
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
                      "range_low", "range_high", "inside_range", "reason"}
  assert row["range_low"] < row["predicted_minutes"] < row["range_high"]
  assert row["inside_range"] == (row["range_low"] <= row["measured_minutes"]
                                 <= row["range_high"])
  assert row["family"] == "v0.7 Google resnet tpu-v3"
  from harness import summarize
  score = summarize.summarize([str(org)])
  measured = score[score["system"] == "tpu-v3-8192-JAX"]["score_min"].iloc[0]
  assert row["measured_minutes"] == pytest.approx(measured)
  assert row["error"] == pytest.approx(row["predicted_minutes"] / measured - 1)
  # -25%: the model's step (13.5 ms) is near the log's (14.6 ms in its blocks of 4 epochs);
  # the run's 14% more steps than the RCP ratio gives and its first block's 2.5 s of warm-up
  # are no term
  assert abs(row["error"]) < 0.3


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
  radeon = tmp_path / "radeon.json"
  radeon.write_text(json.dumps({"accelerator_model_name": "AMD Radeon RX 7900 XTX",
                                "number_of_nodes": "8", "accelerators_per_node": "6"}))
  line = _error(capsys, source, "--system", str(radeon))
  assert "'AMD Radeon RX 7900 XTX' has no simulator preset" in line and "gaudi2" in line


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
  # the step at 4x the examples: the fixed part (the floor and the mini model's LARS update
  # over a TPU v4's HBM) + the rest x 4; given for one chip, one chip here
  assert measured.optimizer == "lars"
  fixed = predict.LAUNCH_FLOOR_S + out["parameters"] * 20 / 1200e9
  step = (fixed + (given - fixed) * 4) / (fixed + (given - fixed) * 1) * given
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
  # the update sharded over the 1,024 replicas on the target (XLA), whole on the one chip
  fixed_t = predict.LAUNCH_FLOOR_S + out["parameters"] * 20 / 1200e9 / 1024
  compute = fixed_t + (given - fixed) * 16 / b_s
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
  assert sum(r["predicted_minutes"] is not None for r in rows) >= 40
  # the range's model-error term is this backtest's conformal quantile: redone when errors move
  error = predict.conformal_model_error(rows)
  assert predict.MODEL_ERROR == math.ceil(error * 1000) / 1000, (
      "the model's errors moved: set MODEL_ERROR as `predict --backtest ... --calibrate` says")
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


# ----------------------------------------------------------------------------- presets

@pytest.mark.parametrize("preset,peak,memory,link", [
    # (bf16 dense FLOP/s, HBM bytes/s, link bytes/s a direction) as each spec states them
    ("dgx-a100", 312e12, 2039e9, 600e9 / 2),       # A100 SXM4 80GB; NVLink 600 GB/s a GPU
    ("dgx-h100", 989e12, 3.35e12, 900e9 / 2),      # H100 SXM5; NVLink 900 GB/s a GPU
    ("dgx-h200", 989e12, 4.8e12, 900e9 / 2),       # H200: H100's compute and NVLink, HBM3e
    ("dgx-b200", 2250e12, 8e12, 1.8e12 / 2),       # HGX B200; NVLink 5 1.8 TB/s a GPU
    ("tpu-v3", 123e12, 900e9, 50e9),
    ("tpu-v4", 275e12, 1200e9, 45e9),
    ("tpu-v5e", 197e12, 819e9, 400e9 / 4 / 2),     # 400 GB/s ICI a chip, 4 ports, 2 ways
    ("tpu-v5p", 459e12, 2765e9, 1200e9 / 6 / 2),   # 1,200 GB/s ICI a chip, 6 ports
    ("tpu-v6e", 918e12, 1638e9, 800e9 / 4 / 2),    # Trillium: 800 GB/s ICI a chip, 4 ports
    ("gaudi", 0.0, 1e12, 7 * 100e9 / 8),           # 7 of 10 x 100 GbE all-to-all in the node
    ("gaudi2", 432e12, 2.45e12, 21 * 100e9 / 8),   # 21 of 24 x 100 GbE in the node
    ("gaudi3", 1835e12, 3.7e12, 21 * 200e9 / 8),   # 21 of 24 x 200 GbE in the node
])
def test_a_preset_carries_its_published_figures(preset, peak, memory, link):
  from harness.commsim import machine
  p = machine.PRESETS[preset]
  assert (p.peak_flops, p.memory_bandwidth) == (peak, memory)
  assert p.link_bandwidth == pytest.approx(link, rel=1e-12)
  assert p.source                                  # every figure says where it is from


@pytest.mark.parametrize("name,system,preset", [
    ("NVIDIA A100-SXM4-80GB", "dgxa100_n8", "dgx-a100"),
    ("NVIDIA H100-SXM5-80GB", "Eos_n8", "dgx-h100"), ("NVIDIA H200-SXM-141GB", "", "dgx-h200"),
    ("NVIDIA B200-SXM-180GB", "", "dgx-b200"), ("TPU-v5p", "tpu-v5p-1024", "tpu-v5p"),
    ("TPU v6e", "", "tpu-v6e"), ("Trillium", "", "tpu-v6e"), ("TPU-v5e", "", "tpu-v5e"),
    ("TPU", "tpu-v4-128", "tpu-v4"), ("Habana Gaudi2", "HLS-Gaudi2-PT", "gaudi2"),
    ("Intel Gaudi 3", "", "gaudi3"), ("Habana Gaudi", "HLS-1", "gaudi"),
    ("AMD Radeon RX 7900 XTX", "tinybox red", None)])
def test_every_accelerator_name_finds_its_preset(name, system, preset):
  assert predict.machine_of(name, system) == preset


def test_the_system_descriptions_nics_set_the_network():
  """'Compute: 8x ... 400Gb/s' (storage and management NICs carry no collective): 8 rails of
  50 GB/s; 2 NICs for 4 GPUs: two GPUs share each; 8 NICs for 4 GPUs: each GPU two NICs'
  worth; 3 for 8 (no divisor): the node's 3 x 25 GB/s spread over its 8 GPUs."""
  eos = ("Storage: 2x ConnectX-7 IB NDR 400Gb/s, Compute: 8x ConnectX-7 IB NDR 400Gb/s, "
         "Management: 100Gb/s Ethernet NIC")
  assert predict.network_of(eos) == (8, 50e9)
  assert predict.network_of("2x ConnectX-6 IB HDR 200Gb/Sec") == (2, 25e9)
  assert predict.network_of("") is None
  shared = predict.make_target(8, "dgx-a100", per_node=4, network=(2, 25e9))
  assert (shared.kwargs["nics_per_node"], shared.kwargs["network_bandwidth"]) == (2, 25e9)
  assert shared.topology == "multinode:2x4"
  wide = predict.make_target(8, "dgx-h100", per_node=4, network=(8, 50e9))
  assert (wide.kwargs["nics_per_node"], wide.kwargs["network_bandwidth"]) == (0, 100e9)
  odd = predict.make_target(16, "dgx-a100", per_node=8, network=(3, 25e9))
  assert odd.kwargs["network_bandwidth"] == pytest.approx(3 * 25e9 / 8)
  # the simulator builds each (it refused 8 NICs on a 4-GPU node before)
  from harness.commsim import machine
  for target in (shared, wide, odd):
    assert predict.all_reduce_seconds(target)(64e6) > 0
    machine.Machine(target.topology, **target.kwargs)


# ----------------------------------------------------------------------------- figures

def test_figures_of_a_workload_come_from_its_folder():
  """resnet, bert and SSD300 (to round 1.0) from workloads/<w>/mlperf_figures.py, pinned by
  those workloads' own model tests; RetinaNet (ssd from 2.0), GPT-3 and DLRM from
  predict_figures.json; no per-benchmark table in predict.py."""
  assert not hasattr(predict, "PARAMETERS")
  resnet = predict.figures("resnet", "3.1")
  assert resnet["parameters"] == 25_557_032 and resnet["workload"] == "resnet50"
  assert predict.figures("bert", "1.0")["sample_unit"] == "samples"
  assert predict.figures("ssd", "1.0")["parameters"] == 19_972_534
  retinanet = predict.figures("ssd", "2.1")
  assert "RetinaNet" in retinanet["model"] and "workload" not in retinanet
  dcn = predict.figures("dlrm_dcnv2", "3.1")
  from workloads.dlrm import spec
  cfg = spec.reference()
  assert dcn["parameters"] == spec.parameter_count(cfg) - sum(
      cfg.model.num_embeddings_per_feature) * 128 == 16_044_545
  with pytest.raises(predict.UsageError, match="gnmt: GNMT .* no parameter count"):
    predict.figures("gnmt", "0.7")
  with pytest.raises(predict.UsageError, match="no parameter count at round 0.7"):
    predict.figures("dlrm_dcnv2", "0.7")


def test_retinanets_parameters_are_its_layer_shapes():
  """The table's RetinaNet count recounted from the reference's architecture: ResNeXt50-32x4d
  (its torchvision total 25,028,904 checked first, so the block arithmetic is right), stages
  2-4 trainable, an FPN on C3-C5 with P6/P7, and the two heads at 9 anchors x 264 classes."""
  def conv(i, o, k, groups=1, bias=False):
    return i * o * k * k // groups + (o if bias else 0)
  stages, bn, inp = [], 2 * 64, 64
  for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
    width, out, total = planes * 2, planes * 4, 0
    for b in range(blocks):
      total += conv(inp, width, 1) + conv(width, width, 3, 32) + conv(width, out, 1)
      bn += 2 * (2 * width + out)
      if b == 0:
        total += conv(inp, out, 1)
        bn += 2 * out
      inp = out
    stages.append(total)
  assert conv(3, 64, 7) + sum(stages) + bn + 2048 * 1000 + 1000 == 25_028_904
  fpn = sum(conv(c, 256, 1, bias=True) + conv(256, 256, 3, bias=True)
            for c in (512, 1024, 2048)) + 2 * conv(256, 256, 3, bias=True)
  heads = (2 * 4 * conv(256, 256, 3, bias=True) + conv(256, 9 * 264, 3, bias=True)
           + conv(256, 9 * 4, 3, bias=True))
  assert predict.figures("ssd", "3.1")["parameters"] == sum(stages[1:]) + fpn + heads


def test_dlrm_dcnv2s_all_to_all_bytes_by_hand():
  """One chip's vector in an all-to-all: its examples (55,296 over 8 GPUs) x 26 pooled
  vectors x 128 floats x 4 B (the reference's float32; 2 B on NVIDIA GPUs, whose recipes
  exchange half precision); the step holds two (the vectors out, their gradients back)."""
  fig = predict.figures("dlrm_dcnv2", "3.1")
  assert predict.all_to_all_bytes(fig, 55296 / 8) == 6912 * 26 * 128 * 4 == 92_012_544
  assert predict.all_to_all_bytes(fig, 55296 / 8, "dgx-h100") == 6912 * 26 * 128 * 2
  assert predict.all_to_all_bytes(fig, 55296 / 8, "tpu-v4") == 6912 * 26 * 128 * 4
  target = predict.make_target(64, "dgx-h100")
  fit = {"per_example_s": 1e-7, "update_scale": 1.0, "floor_s": predict.LAUNCH_FLOOR_S}
  m = predict.Measured("dlrm_dcnv2", "3.1", "x", "x", "H100", 8, 55296, 0, [], None,
                       "dgx-h100", optimizer="adagrad")
  parts = predict.step_parts(m, fig, fit, 55296, target, 1.0)
  assert parts.all_to_all == pytest.approx(
      2 * predict.all_to_all_seconds(864 * 26 * 128 * 2, target), rel=1e-12)
  assert parts.step == pytest.approx(parts.compute + parts.exposed + parts.all_to_all)


@needs_all_rounds
def test_retinanet_and_gpt3_logs_read_as_their_benchmarks_count():
  """NVIDIA's RetinaNet logs train_samples 4,572 = the steps of an epoch at batch 256: the
  epoch is the dataset's 1,170,301 images. GPT-3's logs count tokens: samples are sequences
  of 2,048, and the layout follows the log's gradient accumulation (128 micro-batches at
  2,048 sequences on 512 GPUs: 16 replicas of tensor x pipeline 32)."""
  v31 = os.path.join(SCALING, "training_v3.1", "NVIDIA", "results")
  ssd = predict.read_mlperf(os.path.join(v31, "eos_ngc23.09_pytorch", "ssd"))
  assert ssd.train_samples == 1_170_301 and "counts steps" in ssd.epoch_note
  gpt = predict.read_mlperf(os.path.join(v31, "eos_n64_ngc23.09_nemo", "gpt3"))
  assert gpt.grad_accum == 128 and gpt.optimizer == "adam"
  assert all(r.samples % 2048 == 0 and r.samples < 1e7 for r in gpt.scored()[0])
  fig = predict.figures("gpt3", "3.1")
  target = predict.make_target(768, "dgx-h100")
  lay = predict.layout(gpt, fig, 768, 3072, target)
  assert (lay.data, lay.params) == (24, 175e9 / 32)
  assert lay.work == pytest.approx(3072 / 768 * (1 + 3 / 128))    # pipeline 4, 128 micro


def test_the_range_is_two_standard_errors_with_the_model_s_error():
  """Runs 10, 11, 12 minutes carried over, batch moved (RCP spread 8%), one dropped at each
  end: the runs' half-width 2 x hypot(spread of the runs, 8%) / sqrt(1), combined in log space
  with MODEL_ERROR on another system; on the source's own system the model adds nothing."""
  out = {"runs_minutes": [10.0, 11.0, 12.0], "rcp_spread": 0.08, "samples_ratio": 1.2,
         "predicted_minutes": 11.0}
  got = predict.prediction_range(out, 3, 1)
  runs = 2 * math.hypot(float(np.std([10, 11, 12]) / 11), 0.08)
  assert got["range_runs"] == pytest.approx(runs, rel=1e-12)
  half = math.sqrt(math.log(1 + runs) ** 2 + predict.MODEL_ERROR ** 2)
  assert got["range_relative"] == pytest.approx(math.exp(half) - 1, rel=1e-12)
  assert (got["range_low"], got["range_high"]) == pytest.approx((11 / math.exp(half),
                                                                  11 * math.exp(half)))
  own = predict.prediction_range(dict(out, same_system=True), 3, 1)
  assert own["range_model"] == 0.0 and own["range_relative"] == pytest.approx(runs, rel=1e-12)


def test_the_model_error_is_the_split_conformal_quantile():
  """The ceil((n + 1) x level)-th smallest |log(predicted / measured)|: with 9 pairs at 0.8 the
  8th; with 4 the rank (4) is n, the largest; unscored rows do not count."""
  errors = [0.1, -0.2, 0.05, 0.3, -0.5, 0.0, 1.0, -0.1, 0.2]
  rows = [{"error": e} for e in errors] + [{"error": None}]
  logs = sorted(abs(math.log1p(e)) for e in errors)
  assert predict.conformal_model_error(rows, 0.8) == logs[7] == math.log(2)
  assert predict.conformal_model_error(rows[:4], 0.8) == math.log1p(0.3)
  with pytest.raises(UsageError, match="no scored pair"):
    predict.conformal_model_error([{"error": None}])
