"""GPipe mini runs through the command line, as a user starts them: the Transformer with 4
micro-batches on data=2,stage=2,model=2 in JAX (8 simulated devices: 3-D parallelism, GSPMD
over model inside each stage) and with 2 on stage=2 in TF (2 devices: data x
stage in TF is its float64 equality test's point, test_tf_pipeline.py) reach their mini targets
(ResNet-50's pipelined step, batch-norm statistics included, is its equality tests' point in
both frameworks: test_jax_pipeline.py, test_tf_pipeline.py), the row records the layout, the
log carries the keys closed_transformer.yaml asks for with the mini preset's values and passes
the official checker (these are the Transformer's mini runs to target); describe prints the cut, the bubble and memory with and without
re-materialization; simulate times the schedule."""
import json

import pandas as pd
import pytest

from tests.conftest import run_to_target
from workloads.transformer import input_pipeline as transformer_input
from workloads.transformer import spec as transformer_spec

pytestmark = pytest.mark.slow

RUNS = [("jax", "transformer", "8", "data=2,model=2,stage=2", 85.0, "4"),
        ("tf", "transformer", "2", "data=1,stage=2", 85.0, "2")]


@pytest.mark.parametrize("framework,workload,devices,layout,target,microbatches", RUNS)
def test_pipelined_mini_reaches_target_with_a_checker_clean_log(cli, tmp_path, framework,
                                                                workload, devices, layout,
                                                                target, microbatches):
  run_to_target(cli, tmp_path, framework, workload, devices, layout, target,
                "--set", f"parallel.microbatches={microbatches}")
  row = pd.read_csv(tmp_path / "results.csv").iloc[0]
  assert row["framework"] == framework and row["preset"] == "mini"
  assert_mini_transformer_log(row)


def _log_events(path):
  with open(path) as f:
    return [json.loads(line[len(":::MLLOG "):]) for line in f if line.startswith(":::MLLOG ")]


def assert_mini_transformer_log(row):
  """The log carries every key closed_transformer.yaml (ruleset 0.7.0) asks for with the mini
  preset's values (these runs replaced the one-device JAX mini run of
  tests/transformer/test_transformer_end_to_end.py, which checked the same: 32 CPU s)."""
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
  cfg = transformer_spec.SPEC.configure("mini")
  folder = transformer_input.prepare_mini(cfg.data)      # the session's set (the run's)
  rows = transformer_input.count_rows(
      transformer_input.tfrecord_files(folder["dir"], "train-*"), cfg.data)
  assert by_key["train_samples"]["value"] == rows and 6000 / 3 < rows < 6000 * 0.8
  assert by_key["max_sequence_length"]["metadata"]["method"] == "discard"
  # BLEU is logged as eval_accuracy / 100, once per epoch
  accuracies = [e for e in events if e["key"] == "eval_accuracy"]
  assert [e["metadata"]["epoch_num"] for e in accuracies] == list(
      range(1, len(accuracies) + 1))
  assert accuracies[-1]["value"] == pytest.approx(row["final_metric"] / 100)


def test_describe_prints_the_cut_the_bubble_and_memory_with_and_without_remat(cli):
  """The tiny Transformer (1+1 layers, hidden 16, 145 words) on stage=2, M=2: the encoder on
  stage 0, the decoder on stage 1 (each with the shared embedding: it embeds on both and the
  logits read it on the last); bubble 1/3; the encoder output (16 rows x 24 x 16 float32 a
  micro-batch) shifted forward and its gradient back in each of 3 iterations. With the
  few-step switches (describe compiles the step both ways of remat and runs neither); the
  activation figures then are the unoptimized programs', whose order is what is asserted.
  (It was the mini Transformer, 2+2 layers, on stage=2,data=2 with M=4: 32 CPU s, ~19 here;
  a stage of several layers printed as a range is the TF describe test's.)"""
  proc = cli("describe", "transformer", "--preset", "tiny", "--cpu-devices", "2", "--mesh",
             "stage=2", "--set", "parallel.microbatches=2", few_steps=True)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  out = proc.stdout
  assert "2 stages x 2 micro-batches, 3 iterations a step, bubble (K-1)/(M+K-1) = 0.3333" in out
  h, f, v = 16, 32, 145
  encoder_layer = 4 * h * h + 2 * h * f + f + h + 2 * 2 * h
  decoder_layer = 8 * h * h + 2 * h * f + f + h + 3 * 2 * h
  stage0 = v * h + encoder_layer + 2 * h               # + the encoder's final norm
  stage1 = v * h + decoder_layer + 2 * h
  assert f"stage 0:                1 layers (encoder/layer_0), {stage0:,}" in out
  assert f"stage 1:                1 layers (decoder/layer_0), {stage1:,}" in out
  line = next(l for l in out.splitlines() if l.startswith("  activations / device:"))
  with_remat, without = (int(w.replace(",", "")) for w in line.split()[3:8:4])
  assert 0 < with_remat < without
  assert f"{2 * 3 * 16 * 24 * 16 * 4:,} bytes a step" in out


def test_tf_describe_keeps_fewer_activations_with_recompute_grad(cli):
  """tf.recompute_grad keeps each stage's input, not its activations (the traced graph's
  forward tensors that the backward reads): 6.2x fewer bytes here, ResNet-50 mini's 4 blocks
  on stage=2 with M=2 (on stage=4 with M=4 it was 3.5x, 23 CPU s against 13; it was 5x there
  while every padded conv's zero-padded input copy was kept too: tf_layers.PaddedConv2D pads
  in the conv). A stage of several layers prints them as a range."""
  proc = cli("describe", "resnet50", "--framework", "tf", "--cpu-devices", "2", "--mesh",
             "stage=2", "--set", "parallel.microbatches=2")
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  line = next(l for l in proc.stdout.splitlines() if l.startswith("  activations / device:"))
  with_remat, without = (int(w.replace(",", "")) for w in line.split()[3:8:4])
  assert 0 < with_remat < without / 5
  assert "2 stages x 2 micro-batches, 3 iterations a step, bubble" in proc.stdout
  assert "stage 0:                2 layers (BottleneckBlock_0 .. BottleneckBlock_1)" in proc.stdout


def test_simulate_times_the_schedule_from_the_stages_forward_time(cli):
  """Links free (no latency, overhead or per-byte time: 1e9 GB/s): a step is M + K - 1
  forward iterations of the slowest stage and as many backward ones at twice its time; one
  chip does 3 x every layer's forward for the whole replica batch."""
  proc = cli("simulate", "--workload", "transformer", "--preset", "mini", "--mesh", "stage=4",
             "--set", "parallel.microbatches=8", "--topology", "ring:4", "--peak-tflops", "100",
             "--link-bandwidth", "1e9", "--link-latency", "0", "--overhead", "0", "--json")
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  out = json.loads(proc.stdout)
  stage = out["stage_forward_s"]
  assert out["cut"] == [1, 1, 1, 1] and len(stage) == 4
  assert out["step_s"] == pytest.approx((8 + 4 - 1) * 3 * max(stage), rel=1e-6)
  assert out["speedup_vs_one_chip"] == pytest.approx(3 * 8 * sum(stage) / out["step_s"],
                                                     rel=1e-6)
  assert out["bubble_fraction"] == pytest.approx(3 / 11)
  table = out["throughput_vs_k2_m1"]
  assert table["K=1,M=1"] == pytest.approx(table["K=1,M=32"])   # one stage: no bubble
  for k in (2, 4):
    assert table[f"K={k},M=1"] < table[f"K={k},M=4"] < table[f"K={k},M=32"]
