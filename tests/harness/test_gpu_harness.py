"""bench/gpu_harness.py, the one command for a GPU box (issue 53), run as it would be there at a
toy size on this CPU: the harness's synthetic run through the driver and the bare step of
bench/gpu_models.py, each in its own process, and the table's ratios from their rows."""
import csv
import subprocess
import sys

import pytest

from bench import gpu_harness
from tests.conftest import ROOT, clean_env


@pytest.mark.slow
def test_one_command_runs_the_harness_and_the_bare_step(tmp_path):
  out = tmp_path / "table.csv"
  proc = subprocess.run(
      [sys.executable, "bench/gpu_harness.py", "--workloads", "resnet50", "--preset", "tiny",
       "--set", "data.source=synthetic", "--steps", "3", "--batch", "resnet50=4",
       "--out", str(out), "--profile", str(tmp_path / "profile.txt"),
       "--variant", "resnet50:parallel.remat_policy=full"], cwd=ROOT,   # 3 steps: few-step XLA
      env=clean_env(few_steps=True), capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  with open(out, newline="") as f:
    row, variant = list(csv.DictReader(f))
  # the variant: a harness run of its own, against the same bare step
  assert variant["workload"] == "resnet50[parallel.remat_policy=full]"
  assert variant["bare_samples_per_s"] == row["bare_samples_per_s"]
  assert float(variant["harness_samples_per_s"]) > 0
  harness, bare = float(row["harness_samples_per_s"]), float(row["bare_samples_per_s"])
  assert row["workload"] == "resnet50" and row["device_kind"] == "cpu" and row["batch"] == "4"
  assert harness > 0 and bare > 0
  assert abs(float(row["harness_over_bare"]) - harness / bare) < 1e-5 * harness / bare
  assert row["harness_mfu"] == "" and row["mfu_over_anchor"] == ""   # a CPU has no peak here
  assert float(row["mfu_goal"]) == 0.19 and float(row["anchor_mfu"]) == 0.192
  assert "resnet50: missed: MFU not measured" in proc.stdout     # a CPU's peak is unknown
  assert "3 steps |" in proc.stdout and " params; " in proc.stdout  # each command's summary
  # the bare step's trace: XLA:CPU's ops run on host threads, so no /device: kernels here
  profile = (tmp_path / "profile.txt").read_text()
  assert profile.startswith("resnet50 bare step, batch 4, cpu: ")
  assert "trace of 3 steps: the trace has no device kernels" in profile, profile


def test_table_row_ratios_and_verdicts():
  row = gpu_harness.compare("bert", 32, {"throughput": "180", "mfu": "0.41",
                                         "device_kind": "NVIDIA H100 80GB HBM3"},
                            {"samples_per_s": "200", "mfu": "0.45"})
  assert row["harness_over_bare"] == 0.9 and abs(row["mfu_over_anchor"] - 0.41 / 0.49) < 1e-12
  assert gpu_harness.verdicts(row) == "harness/bare 0.90 < 0.95"
  failed = gpu_harness.compare("ssd", 64, None, {"samples_per_s": "100", "mfu": ""})
  assert failed["harness_samples_per_s"] is None and failed["harness_over_bare"] is None
  assert gpu_harness.verdicts(failed) == "harness/bare not measured; MFU not measured"
  nan = gpu_harness.compare("resnet50", 256, {"throughput": "5597", "mfu": "nan"},
                            {"samples_per_s": "5659", "mfu": "0.135"})
  assert nan["harness_mfu"] is None and gpu_harness.verdicts(nan) == "MFU not measured"
  diverged = gpu_harness.compare("efficientnet", 128, None, {"samples_per_s": "5402",
                                                             "mfu": "0.013", "loss": "nan"})
  assert gpu_harness.verdicts(diverged) == ("harness/bare not measured; MFU not measured; "
                                            "the bare step's loss is nan")


def test_bad_arguments_exit_2_with_one_line():
  assert gpu_harness.main(["--workloads", "dlrm"]) == 2     # no bare-step builder
  assert gpu_harness.main(["--steps", "0"]) == 2
  assert gpu_harness.main(["--batch", "bert=x"]) == 2
  assert gpu_harness.main(["--workloads", "bert", "--variant", "ssd:data.packing=true"]) == 2
  assert gpu_harness.main(["--variant", "bert"]) == 2


@pytest.mark.slow
def test_nan_probe_names_the_first_non_finite_leaves_and_the_op(tmp_path):
  """bench/nan_probe.py on ResNet's tiny model with a learning rate that must diverge: the
  first finite steps print their losses, the step that breaks names the state's non-finite
  leaves, and the re-run under jax.debug_nans names the primitive and the workload's line."""
  proc = subprocess.run(
      [sys.executable, "bench/nan_probe.py", "resnet50", "--preset", "tiny", "--steps", "6",
       "--set", "data.source=synthetic", "--set", "optimizer.base_learning_rate=1e30"],
      cwd=ROOT, env=clean_env(few_steps=True),        # 6 steps and a re-run: few-step XLA
      capture_output=True, text=True, timeout=600)
  out = proc.stdout
  assert proc.returncode == 1, out + proc.stderr[-3000:]
  assert out.splitlines()[0].startswith("resnet50 (tiny, float32) on ")
  assert "step 0: loss " in out
  broken = [line for line in out.splitlines() if "non-finite: .params[" in line]
  assert len(broken) == 1
  assert "FloatingPointError: invalid value (nan)" in out
  assert "  workloads/resnet/" in out
