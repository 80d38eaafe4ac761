"""ST-MoE mini runs through the command line, as a user starts them: `run transformer
--preset moe_mini --cpu-devices 4 --mesh data=2,expert=2` reaches its BLEU target (JAX) with a
log the official checker passes, and the progress lines carry the router's
figures; describe prints the expert figures, and its all-to-all bytes are the compiled
step's."""
import re

import pytest

from tests.conftest import run_to_target

pytestmark = pytest.mark.slow


# JAX's run (TF's expert layers: the float64 equality of test_tf_moe.py on data x expert, the
# router's figures included; its run here, 48 CPU s, showed what the JAX run and the TF
# Transformer's own end-to-end run do)
def test_moe_mini_reaches_target_on_data_x_expert(cli, tmp_path):
  proc = run_to_target(cli, tmp_path, "jax", "transformer", "4", "data=2,expert=2", 85.0,
                       "--preset", "moe_mini")
  lines = [l for l in proc.stdout.splitlines() if "| bleu " in l]
  assert lines and all(re.search(r"router z [\d.]+ balance [\d.]+ dropped [\d.]+% load "
                                 r"[\d.]+/[\d.]+/[\d.]+/[\d.]+", l) for l in lines), lines


def test_describe_prints_the_expert_figures_and_the_all_to_all_bytes_of_the_step(cli):
  proc = cli("describe", "transformer", "--preset", "moe_mini", "--cpu-devices", "4", "--mesh",
             "data=2,expert=2")
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  out = proc.stdout
  h, f, e = 64, 128, 4                              # the mini model: hidden 64, d_ff 128
  ffn = 2 * h * f + f + h
  assert f"expert parameters:        {2 * (e * ffn + h * e):,} ({e * ffn + h * e:,} a layer) " \
         f"in place of {2 * ffn:,} dense" in out
  assert f"FFN FLOPs per token:      {2 * 4 * h * f + 2 * h * e:,} in an expert layer " \
         f"against {4 * h * f:,} dense" in out
  # 64 rows x 24 tokens in groups of 96, capacity floor(96 x 1.25 / 4) = 30 slots per expert:
  # per device 4 groups x 4 x 30 slots x 64 float32 values, 4 times in each of 2 layers
  per_device = 4 * e * 30 * h * 4 * 4 * 2
  assert f"; {per_device:,} bytes a device" in out
  assert re.search(rf"all-to-all over expert: \d+ tensors in 8 ops, {per_device:,} bytes", out)
