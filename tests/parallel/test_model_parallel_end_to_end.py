"""The model axis through the command line: describe and simulate of a layout against the
Transformer's formulas. The JAX model-parallel mini run to its target (the driver, the
beam-search eval on weights split on `model`, the row and a checker-clean log) is the 3-D run
of test_pipeline_end_to_end.py (data=2,stage=2,model=2: the same eval and model layouts, with
stages), which replaced the data=2,model=2 run here (33 CPU s). TF's model axis is its float64
equality tests' (test_tf_model_parallel.py: the step, the beam-search eval, BERT's LAMB;
test_tf_distributed.py: across two processes): its mini run to target on data=1,model=2 (45
CPU s: the same trainer and eval through the driver, whose row and log every other run
checks) was cut for suite time; docs/distribution.md gives its figures."""
import json

import pytest

pytestmark = pytest.mark.slow


def test_describe_the_v07_transformer_layout_from_shapes(cli):
  """data=2048,model=4 needs 8,192 devices: describe derives the bytes per device from shapes.
  Against Transformer-big's formula (H 1024, d_ff 4096, vocab 33,708, 6+6 layers): the
  embedding, attention and feed-forward kernels (and d_ff biases) split 4 ways; the H-sized
  biases and LayerNorm scales and biases whole on every device. Float32: 4 bytes each."""
  proc = cli("describe", "transformer", "--preset", "reference", "--mesh", "data=2048,model=4",
             "--set", "train.global_batch_size=2048")
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  lines = dict(line.split(":", 1) for line in proc.stdout.splitlines() if ":" in line)
  h, f, v, n = 1024, 4096, 33708, 6
  split = v * h + n * (4 * h * h + 2 * h * f + f) + n * (8 * h * h + 2 * h * f + f)
  whole = n * (h + 2 * 2 * h) + n * (h + 3 * 2 * h) + 2 * 2 * h
  assert int(lines["parameters"].strip().replace(",", "")) == split + whole
  per_device = int(lines["parameters / device"].split()[0].replace(",", ""))
  assert per_device == 4 * (split // 4 + whole)
  state = int(lines["optimizer state / device"].split()[0].replace(",", ""))
  assert state == 2 * per_device + 4                 # Adam's m and v, and its step count
  assert "not compiled" in lines["collectives in the step"]


def test_simulate_times_a_layouts_step_collectives(cli):
  """The mini Transformer (hidden 64, d_ff 128, 233 words, 2+2 layers) on data=2,model=4 at 64
  rows of 24: the model axis all-reduces 16 activations per encoder+decoder layer pair (see
  test_jax_model_parallel) of 32 x 24 x 64 float32 each; the vocabulary (233) stays whole; the
  gradient all-reduce moves the parameters' bytes per device (Transformer's formula)."""
  proc = cli("simulate", "--workload", "transformer", "--preset", "mini", "--mesh",
             "data=2,model=4", "--topology", "torus:4x2", "--json")
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  out = json.loads(proc.stdout)
  assert out["per_replica_batch"] == 32
  assert out["model_all_reduce_tensors"] == 2 * 16
  assert out["model_all_reduce_bytes"] == 2 * 16 * 32 * 24 * 64 * 4
  h, f, v, n = 64, 128, 233, 2
  split = n * (4 * h * h + 2 * h * f + f) + n * (8 * h * h + 2 * h * f + f)
  whole = v * h + n * (h + 2 * 2 * h) + n * (h + 3 * 2 * h) + 2 * 2 * h
  assert out["gradient_bytes"] == 4 * (split // 4 + whole)
  assert out["data"]["topology"] == "torus:1x2" and out["model"]["topology"] == "ring:4"
  assert out["step_collectives_s"] == out["data"]["time_s"] + out["model"]["time_s"] > 0
  bad = cli("simulate", "--workload", "transformer", "--preset", "mini", "--mesh",
            "data=4,model=4", "--topology", "torus:4x2")
  assert bad.returncode == 2 and "needs 16 chips; --topology torus:4x2 has 8" in bad.stderr
