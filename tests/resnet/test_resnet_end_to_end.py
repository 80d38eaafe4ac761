"""The mini run end to end, through the command line, as a user runs it."""
import glob
import json

import pandas as pd
import pytest

from harness import compliance

pytestmark = pytest.mark.slow


def _log_events(path):
  with open(path) as f:
    return [json.loads(line[len(":::MLLOG "):]) for line in f if line.startswith(":::MLLOG ")]


def test_mini_resnet_jax_reaches_target_and_log_passes_the_official_checker(cli, tmp_path):
  results_csv, logs = tmp_path / "results.csv", tmp_path / "logs"
  proc = cli("run", "resnet50", "--seed", "0", "--results", str(results_csv),
             "--log-dir", str(logs), loop_emitters=True)      # tests/conftest.py: a conv net
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "samples/s" in proc.stdout and "elapsed" in proc.stdout      # a progress line per block
  row = pd.read_csv(results_csv).iloc[0]
  assert row["status"] == "success" and row["framework"] == "jax" and row["preset"] == "mini"
  assert row["final_metric"] >= row["target"] == 0.9
  assert 0 < row["time_to_train_s"] < 120 and row["throughput"] > 0
  events = _log_events(row["log_path"])
  keys = [e["key"] for e in events]
  # compile before run_start; time-to-train is exactly run_stop - run_start
  assert keys.index("init_stop") < keys.index("run_start") < keys.index("block_start")
  start, stop = (next(e for e in events if e["key"] == k) for k in ("run_start", "run_stop"))
  assert row["time_to_train_s"] == (stop["time_ms"] - start["time_ms"]) / 1000
  assert stop["metadata"]["status"] == "success"
  for key in ("submission_division", "seed", "global_batch_size", "gradient_accumulation_steps",
              "train_samples", "eval_samples", "opt_name", "lars_epsilon", "lars_opt_weight_decay",
              "lars_opt_base_learning_rate", "lars_opt_learning_rate_warmup_epochs",
              "lars_opt_end_learning_rate", "lars_opt_learning_rate_decay_steps",
              "lars_opt_learning_rate_decay_poly_power", "lars_opt_momentum", "model_bn_span",
              "cache_clear", "eval_accuracy", "block_stop", "eval_start", "eval_stop"):
    assert key in keys, key
  assert next(e for e in events if e["key"] == "submission_division")["value"] == "open"
  passed, report = compliance.check(row["log_path"])
  assert passed, report
  check = cli("check", row["log_path"])
  assert check.returncode == 0 and "PASSED" in check.stdout


def test_mini_resnet_tf_reaches_target_and_log_passes_the_official_checker(cli, tmp_path):
  results_csv = tmp_path / "results.csv"
  proc = cli("run", "resnet50", "--framework", "tf", "--seed", "0", "--results",
             str(results_csv), "--log-dir", str(tmp_path / "logs"), loop_emitters=True)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  row = pd.read_csv(results_csv).iloc[0]
  assert row["status"] == "success" and row["framework"] == "tf"
  assert row["final_metric"] >= 0.9
  check = cli("check", row["log_path"])
  assert check.returncode == 0 and "PASSED" in check.stdout, check.stdout


# A run that spends its --steps cap before its target (aborted row, no time to train, a log the
# checker passes, exit 1) was a ResNet mini run here (13 CPU s): the driver's path, the same for
# every trainer, is tests/harness/test_driver.py's budget test with the official checker, and
# tests/harness/test_faults.py ends real runs aborted by signal, lost peer and full disk.


def test_a_nonfinite_loss_aborts(cli, tmp_path):
  results_csv = tmp_path / "results.csv"
  proc = cli("run", "resnet50", "--preset", "tiny", "--seed", "1",
             "--set", "optimizer.base_learning_rate=1e30",
             "--set", "optimizer.name=sgd", "--results", str(results_csv),
             "--log-dir", str(tmp_path / "logs"))
  assert proc.returncode == 1
  row = pd.read_csv(results_csv).iloc[0]
  assert row["status"] == "aborted" and "non-finite loss" in row["abort_reason"]


# JAX compiles the train step to count its FLOPs: at 128x128 instead of 224x224 to keep it
# quick. Every feature map is then exactly 4/7 of the reference's on each side (64, 32, 16, 8, 4
# against 112, 56, 28, 14, 7), so every conv, batch-norm and pool FLOP scales by (224/128)^2.
# Only the image-independent part (the 2048x1000 classifier, ~12 MFLOPs per example in
# training, and the per-parameter optimizer update, 25.6M parameters over describe's batch of
# 8) scales along with it: under 0.1 GFLOPs, against a band of +-4 GFLOPs.
@pytest.mark.parametrize("framework, image_size", [("jax", 128), ("tf", 224)])
def test_describe_reference_resnet50(cli, framework, image_size):
  proc = cli("describe", "resnet50", "--preset", "reference", "--framework", framework,
             "--set", f"data.image_size={image_size}", few_steps=True)   # compiles, runs none
  assert proc.returncode == 0, proc.stderr
  assert "25,557,032" in proc.stdout                   # the parameter count is size-free
  flops = float(proc.stdout.split("train FLOPs per example:")[1].split()[0])
  # forward ~4.1 GMACs = 8.2 GFLOPs at 224x224; training ~3x forward (XLA's count for JAX,
  # TF's graph profiler, which also counts batch-norm and optimizer arithmetic, for TF)
  assert 2.2e10 < flops * (224 / image_size) ** 2 < 3.0e10


def test_mini_on_simulated_devices_matches_the_device_count(cli, tmp_path):
  proc = cli("run", "resnet50", "--cpu-devices", "3", "--results", str(tmp_path / "r.csv"),
             "--log-dir", str(tmp_path / "logs"))
  assert proc.returncode == 2
  assert "not divisible by the data axis (3: --cpu-devices 3)" in proc.stderr
  assert not (tmp_path / "r.csv").exists() and not glob.glob(str(tmp_path / "logs" / "*"))


def test_mini_on_4_devices_grouped_bn_weight_update_sharding(cli, tmp_path):
  """Two groups of 2 replicas (4 devices show groups as 8 did, at half the replicas)."""
  results_csv = tmp_path / "results.csv"
  proc = cli("run", "resnet50", "--seed", "0", "--cpu-devices", "4", "--mesh", "data=4",
             "--bn-group-size", "2", "--weight-update-sharding", "--results", str(results_csv),
             "--log-dir", str(tmp_path / "logs"), loop_emitters=True)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  row = pd.read_csv(results_csv).iloc[0]
  assert row["status"] == "success" and row["num_devices"] == 4 and row["mesh"] == "data=4"
  span = next(e for e in _log_events(row["log_path"]) if e["key"] == "model_bn_span")
  assert span["value"] == 2 * 64 // 4                  # group of 2 replicas x 16 examples
  assert cli("check", row["log_path"]).returncode == 0
