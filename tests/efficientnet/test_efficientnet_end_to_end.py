"""The mini EfficientNet run end to end, through the command line (JAX; TF: see below): the
target is reached (eval on the moving-average weights), the result row says success, and the
log carries the recipe's keys and passes the official checker with the project's rule file;
the large-batch (LARS) recipe's log too."""
import json

import pandas as pd
import pytest

pytestmark = pytest.mark.slow


def _log_events(path):
  with open(path) as f:
    return [json.loads(line[len(":::MLLOG "):]) for line in f if line.startswith(":::MLLOG ")]


# JAX only: TF's EfficientNet (RMSProp, the EMA eval) is the parity test's and the contract
# test's through the same trainer, its mini convergence the committed baseline's 5 runs (42 CPU s)
@pytest.mark.parametrize("framework", ["jax"])
def test_mini_efficientnet_reaches_target_and_log_passes_the_checker(cli, tmp_path, framework):
  results_csv = tmp_path / "results.csv"
  proc = cli("run", "efficientnet", "--framework", framework, "--seed", "0", "--results",
             str(results_csv), "--log-dir", str(tmp_path / "logs"),
             loop_emitters=True)                     # tests/conftest.py: its compile dominates
  assert proc.returncode == 0, proc.stdout + proc.stderr
  row = pd.read_csv(results_csv).iloc[0]
  assert row["status"] == "success" and row["framework"] == framework
  assert row["preset"] == "mini" and row["final_metric"] >= row["target"] == 0.9
  events = {e["key"]: e for e in _log_events(row["log_path"])}
  expected = {"submission_benchmark": "efficientnet", "submission_division": "open",
              "opt_name": "rmsprop", "opt_rmsprop_decay": 0.9, "opt_rmsprop_momentum": 0.9,
              "opt_rmsprop_epsilon": 0.001, "opt_weight_decay": 1e-5, "label_smoothing": 0.1,
              "opt_learning_rate_decay_factor": 0.9, "model_eval_ema_factor": 0.9,
              "opt_base_learning_rate": 0.064 * 64 / 256, "global_batch_size": 64}
  for key, value in expected.items():
    assert events[key]["value"] == pytest.approx(value) if isinstance(value, float) else (
        events[key]["value"] == value), key
  check = cli("check", row["log_path"])
  assert check.returncode == 0 and "PASSED" in check.stdout, check.stdout


def test_large_batch_recipe_logs_its_keys_and_passes_the_checker(cli, tmp_path):
  """The LARS recipe on the mini set (16 steps and the eval after them: the keys, not the
  target), and a log that lacks one of them fails the rule file's recipe check."""
  results_csv = tmp_path / "results.csv"
  proc = cli("run", "efficientnet", "--preset", "mini_large_batch", "--steps", "16",
             "--results", str(results_csv), "--log-dir", str(tmp_path / "logs"), few_steps=True)
  row = pd.read_csv(results_csv).iloc[0]          # exit 1: the run stopped short of the target
  assert proc.returncode == (0 if row["status"] == "success" else 1), proc.stderr[-2000:]
  events = {e["key"]: e for e in _log_events(row["log_path"])}
  expected = {"opt_name": "lars", "lars_opt_base_learning_rate": 8.0 * 64 / 256,
              "lars_opt_end_learning_rate": 0.0, "lars_opt_learning_rate_decay_poly_power": 2.0,
              "lars_opt_momentum": 0.9, "lars_opt_weight_decay": 1e-5, "lars_epsilon": 0.0,
              "opt_weight_decay": 1e-5, "model_bn_span": 64}
  for key, value in expected.items():
    assert events[key]["value"] == pytest.approx(value), key
  assert "opt_rmsprop_decay" not in events
  check = cli("check", row["log_path"])
  assert check.returncode == 0 and "PASSED" in check.stdout, check.stdout
  lines = open(row["log_path"]).read().splitlines()
  cut = tmp_path / "cut.log"
  cut.write_text("\n".join(l for l in lines if '"lars_opt_momentum"' not in l) + "\n")
  check = cli("check", str(cut))
  assert check.returncode != 0, check.stdout
