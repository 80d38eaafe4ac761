"""GPipe mini runs through the command line, as a user starts them: the Transformer on
stage=2,data=2 with 4 micro-batches and ResNet-50 on stage=4 with 8 (4 simulated devices)
reach their mini targets, the row records the layout and the log passes the official checker;
describe prints the cut, the bubble and memory with and without re-materialization."""
import pytest

from tests.conftest import run_to_target

pytestmark = pytest.mark.slow

RUNS = [("jax", "transformer", "4", "data=2,stage=2", 85.0, "4"),
        ("jax", "resnet50", "4", "data=1,stage=4", 0.9, "8")]


@pytest.mark.parametrize("framework,workload,devices,layout,target,microbatches", RUNS)
def test_pipelined_mini_reaches_target_with_a_checker_clean_log(cli, tmp_path, framework,
                                                                workload, devices, layout,
                                                                target, microbatches):
  run_to_target(cli, tmp_path, framework, workload, devices, layout, target,
                "--set", f"parallel.microbatches={microbatches}")


def test_describe_prints_the_cut_the_bubble_and_memory_with_and_without_remat(cli):
  """The mini Transformer (2+2 layers, hidden 64, 233 words) on stage=2,data=2, M=4: the
  encoder on stage 0, the decoder on stage 1 (each with the shared embedding: it embeds on
  both and the logits read it on the last); bubble 1/5; the encoder output (8 rows x 24 x 64
  float32 a micro-batch) shifted forward and its gradient back in each of 5 iterations."""
  proc = cli("describe", "transformer", "--cpu-devices", "4", "--mesh", "stage=2,data=2",
             "--set", "parallel.microbatches=4")
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  out = proc.stdout
  assert "2 stages x 4 micro-batches, 5 iterations a step, bubble (K-1)/(M+K-1) = 0.2000" in out
  h, f, v = 64, 128, 233
  encoder_layer = 4 * h * h + 2 * h * f + f + h + 2 * 2 * h
  decoder_layer = 8 * h * h + 2 * h * f + f + h + 3 * 2 * h
  stage0 = v * h + 2 * encoder_layer + 2 * h           # + the encoder's final norm
  stage1 = v * h + 2 * decoder_layer + 2 * h
  assert f"stage 0:                2 layers (encoder/layer_0 .. encoder/layer_1), {stage0:,}" in out
  assert f"stage 1:                2 layers (decoder/layer_0 .. decoder/layer_1), {stage1:,}" in out
  line = next(l for l in out.splitlines() if l.startswith("  activations / device:"))
  with_remat, without = (int(w.replace(",", "")) for w in line.split()[3:8:4])
  assert 0 < with_remat < without
  assert f"{2 * 5 * 8 * 24 * 64 * 4:,} bytes a step" in out
