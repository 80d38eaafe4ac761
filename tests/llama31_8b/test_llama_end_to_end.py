"""Mini Llama runs through the command line, as a user starts them: JAX on data x model x
stage (8 simulated devices: Megatron's split inside each of two GPipe stages with sequence
parallelism, 2 micro-batches) and TF on one device reach the mini target with logs the
official 5.1.0 checker passes (open division, as logged), carrying every key closed_llama31_8b.yaml requires
with the preset's values, evals where the rules put them (every eval_interval_samples, logged
with samples_count); the same log turned closed (the reference's sequence length and a value
under 3.3) passes the closed checker, which shows nothing closed needs is missing."""
import json

import pandas as pd
import pytest

from harness import compliance
from tests.conftest import run_to_target

pytestmark = pytest.mark.slow

TARGET = 0.95
# JAX's with sequence parallelism, as a run at scale would be (its float64 equality:
# tests/llama31_8b/test_llama_distributed.py)
RUNS = [("jax", "8", "data=2,model=2,stage=2", ("--set", "parallel.microbatches=2", "--set",
                                               "parallel.sequence_parallel=true")),
        ("tf", "1", "data=1", ())]


def _events(path):
  with open(path) as f:
    return [json.loads(line[len(":::MLLOG "):]) for line in f if line.startswith(":::MLLOG ")]


@pytest.mark.parametrize("framework,devices,layout,options", RUNS,
                         ids=["jax-data=2,model=2,stage=2-sequence_parallel", "tf-data=1"])
def test_mini_llama_reaches_target_with_a_checker_clean_log(cli, tmp_path, framework, devices,
                                                            layout, options):
  run_to_target(cli, tmp_path, framework, "llama31_8b", devices, layout, TARGET, *options)
  row = pd.read_csv(tmp_path / "results.csv").iloc[0]
  assert row["framework"] == framework and row["preset"] == "mini"
  events = _events(row["log_path"])
  by_key = {e["key"]: e for e in events}
  expected = {"submission_benchmark": "llama31_8b", "opt_name": "adamw",
              "opt_base_learning_rate": 3e-3, "opt_end_learning_rate": 3e-4,
              "opt_learning_rate_warmup_steps": 20, "opt_learning_rate_decay_steps": 1_199_980,
              "opt_learning_rate_decay_schedule": "cosine with linear warmup",
              "opt_adamw_beta_1": 0.9, "opt_adamw_beta_2": 0.95, "opt_adamw_epsilon": 1e-5,
              "opt_adamw_weight_decay": 0.1, "opt_gradient_clip_norm": 1.0,
              "max_steps": 1_200_000, "max_sequence_length": 64, "global_batch_size": 32,
              "eval_samples": 1024, "gradient_accumulation_steps": 1}
  for key, value in expected.items():
    assert by_key[key]["value"] == pytest.approx(value), key
  evals = [e for e in events if e["key"] == "eval_accuracy"]
  assert [e["metadata"]["samples_count"] for e in evals] == [1600 * (i + 1)
                                                             for i in range(len(evals))]
  assert all(e["metadata"]["epoch_num"] == e["metadata"]["samples_count"] for e in evals)
  assert evals[-1]["value"] <= TARGET < evals[0]["value"]
  closed = tmp_path / "closed.log"
  text = open(row["log_path"]).read().replace('"value": "open"', '"value": "closed"')
  text = text.replace('"key": "max_sequence_length", "value": 64',
                      '"key": "max_sequence_length", "value": 8192')
  closed.write_text(text)
  passed, report = compliance.check(str(closed))
  assert passed, report


def test_tf_describes_the_reference_model_from_shapes(cli):
  """`describe --preset reference` in TF: 8,030,261,248 parameters and AdamW's two moments a
  weight, from shapes (the model and its state, 96 GB in float32, are more than this host
  holds: nothing is allocated, the step is not traced, and the line says so). JAX's count at
  the reference size: tests/llama31_8b/test_llama_model.py (eval_shape)."""
  proc = cli("describe", "llama31_8b", "--preset", "reference", "--framework", "tf")
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  lines = dict(line.split(":", 1) for line in proc.stdout.splitlines() if ":" in line)
  assert lines["parameters"].strip() == "8,030,261,248"
  assert lines["parameters / device"].strip() == f"{4 * 8_030_261_248:,} bytes"
  assert lines["optimizer state / device"].strip() == f"{8 * 8_030_261_248:,} bytes"
  assert "shapes only" in lines["train FLOPs per example"]
