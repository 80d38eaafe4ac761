"""harness/devices.py: the XLA flags a JAX run gets on a GPU (JAX-Toolbox's), the user's own
flags winning, none on a CPU host or when switched off."""
from harness import devices


def test_user_flags_win_over_the_added_ones():
  user = "--xla_gpu_enable_latency_hiding_scheduler=false --xla_dump_to=/tmp/d"
  merged = devices.merge_xla_flags(user, devices.GPU_XLA_FLAGS)
  assert merged.split() == [*user.split(), "--xla_gpu_enable_highest_priority_async_stream=true"]
  assert devices.merge_xla_flags("", ["--a=1"]) == "--a=1"


def test_gpu_flags_only_where_a_cuda_backend_will_start(monkeypatch):
  environ = {}
  assert not devices.prepare_jax_gpu(environ) and environ == {}   # this host: no CUDA plugin
  monkeypatch.setattr(devices, "_installed", lambda module: module == "jax_cuda12_plugin")
  environ = {"XLA_FLAGS": "--xla_gpu_enable_highest_priority_async_stream=false",
             "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"}
  assert devices.prepare_jax_gpu(environ)
  assert environ == {"XLA_FLAGS": "--xla_gpu_enable_highest_priority_async_stream=false "
                                  "--xla_gpu_enable_latency_hiding_scheduler=true",
                     "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"}
  environ = {}
  assert devices.prepare_jax_gpu(environ)
  assert environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.9"
  assert environ["XLA_FLAGS"].split() == list(devices.GPU_XLA_FLAGS)
  for off in ({"JAX_PLATFORMS": "cpu"}, {"HARNESS_XLA_GPU_FLAGS": "0"}):
    environ = dict(off)
    assert not devices.prepare_jax_gpu(environ) and environ == off
  assert devices.prepare_jax_gpu({"JAX_PLATFORMS": "cuda,cpu"})


def test_mfu_is_model_flops_times_samples_over_the_peak():
  # ResNet-50 v1.5: 3 x 4.1 GMAC x 2 = 24.6 GFLOP a training sample, at 7,160 img/s on one H100
  h100 = devices.mfu(24.6e9, 7160, "NVIDIA H100 80GB HBM3", 1, "bfloat16")
  assert abs(h100 - 24.6e9 * 7160 / 989e12) < 1e-15 and 0.178 < h100 < 0.179
  assert devices.mfu(24.6e9, 2 * 7160, "NVIDIA H100 80GB HBM3", 2, "bfloat16") == h100
  assert devices.peak_flops("NVIDIA H100 PCIe") == 756e12        # before the SXM entry
  assert devices.peak_flops("NVIDIA H200", "float32") == 67e12
  assert devices.mfu(24.6e9, 7160, "cpu", 1, "bfloat16") is None  # not in the table: blank
  assert devices.mfu(None, 7160, "NVIDIA H200", 1, "bfloat16") is None


def test_peak_bandwidth_matches_the_device_kind_most_specific_first():
  assert devices.peak_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
  assert devices.peak_bandwidth("NVIDIA H100 PCIe") == 2.0e12
  assert devices.peak_bandwidth("NVIDIA A100-SXM4-80GB") == 2.039e12
  assert devices.peak_bandwidth("NVIDIA A100-SXM4-40GB") == 1.555e12
  assert devices.peak_bandwidth("cpu") is None


def test_describe_prints_the_peak_and_the_samples_per_s_of_full_mfu():
  from types import SimpleNamespace
  from harness import cli
  h100 = SimpleNamespace(device_kind="NVIDIA H100 80GB HBM3", num_devices=8)
  assert cli._peak_line(h100, "bfloat16", 24.6e9) == (      # pylint: disable=protected-access
      "989 TFLOP/s bfloat16 (NVIDIA H100 80GB HBM3) x 8 device(s); 100% MFU = "
      f"{989e12 * 8 / 24.6e9:,.0f} samples/s")
  cpu = SimpleNamespace(device_kind="cpu", num_devices=1)
  assert "not in the table for 'cpu'" in cli._peak_line(cpu, "float32", 1e9)  # pylint: disable=protected-access
