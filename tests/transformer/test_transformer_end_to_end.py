"""The mini Transformer run end to end, through the command line: BLEU (beam search, the
reference's BLEU) reaches the mini target, the result row says success, and the log carries
every key closed_transformer.yaml (ruleset 0.7.0) asks for and passes the official checker.
JAX here; TF's one-device run is the committed baseline's ten (their logs checked in
tests/harness/test_summarize.py), and TF's Transformer reaches the mini target through the CLI
pipelined and model-parallel (tests/parallel/test_*_end_to_end.py): cut here for suite time."""
import json

import pandas as pd
import pytest

from workloads.transformer import input_pipeline, spec

pytestmark = pytest.mark.slow


def _log_events(path):
  with open(path) as f:
    return [json.loads(line[len(":::MLLOG "):]) for line in f if line.startswith(":::MLLOG ")]


@pytest.mark.parametrize("framework", ["jax"])
def test_mini_transformer_reaches_bleu_target_and_log_passes_the_checker(cli, tmp_path,
                                                                         framework):
  results_csv = tmp_path / "results.csv"
  proc = cli("run", "transformer", "--framework", framework, "--seed", "0", "--results",
             str(results_csv), "--log-dir", str(tmp_path / "logs"), "--data-dir",
             str(tmp_path / "data"))
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  row = pd.read_csv(results_csv).iloc[0]
  assert row["status"] == "success" and row["framework"] == framework
  assert row["preset"] == "mini" and row["final_metric"] >= row["target"] == 85.0
  events = _log_events(row["log_path"])
  by_key = {e["key"]: e for e in events}
  expected = {"submission_benchmark": "transformer", "opt_name": "adam",
              "opt_base_learning_rate": 1.0, "opt_learning_rate_warmup_steps": 200,
              "opt_adam_beta_1": 0.9, "opt_adam_beta_2": 0.98, "opt_adam_epsilon": 1e-9,
              "max_sequence_length": 24, "global_batch_size": 64, "eval_samples": 200}
  for key, value in expected.items():
    assert by_key[key]["value"] == pytest.approx(value), key
  # packed rows: the batch and the epoch count rows, as many as packing the files gives
  assert by_key["global_batch_size"]["metadata"]["samples"] == "packed rows"
  cfg = spec.SPEC.configure("mini")
  folder = input_pipeline.prepare_mini(cfg.data, str(tmp_path / "data" / "transformer_mini"))
  rows = input_pipeline.count_rows(input_pipeline.tfrecord_files(folder["dir"], "train-*"),
                                   cfg.data)
  assert by_key["train_samples"]["value"] == rows and 6000 / 3 < rows < 6000 * 0.8
  assert by_key["max_sequence_length"]["metadata"]["method"] == "discard"
  # BLEU is logged as eval_accuracy / 100, once per epoch
  accuracies = [e for e in events if e["key"] == "eval_accuracy"]
  assert [e["metadata"]["epoch_num"] for e in accuracies] == list(
      range(1, len(accuracies) + 1))
  assert accuracies[-1]["value"] == pytest.approx(row["final_metric"] / 100)
  check = cli("check", row["log_path"])
  assert check.returncode == 0 and "PASSED" in check.stdout, check.stdout
