"""ST-MoE through the command line: `describe transformer --preset moe_mini --cpu-devices 4
--mesh data=2,expert=2` prints the expert figures, and its all-to-all bytes are the compiled
step's. (The moe_mini run to its BLEU target on that mesh, 34 CPU s, was cut for suite time:
its step is the float64 equality tests' in both frameworks (test_jax_moe.py, test_tf_moe.py,
the router's counts and figures included), the progress line's router part is
test_moe_router.py's, and the run's figures are in docs/distribution.md.)"""
import re

import pytest

pytestmark = pytest.mark.slow


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
