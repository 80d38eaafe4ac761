"""The environment a framework reads when it loads: simulated CPU devices and TF's log level.
Set before TensorFlow or JAX is imported (by `run`, `describe`, `simulate --workload` and the
bench scripts); a module of its own so that none of them imports the command line.

On a GPU, a JAX run also gets the XLA flags NVIDIA's JAX-Toolbox recommends (its GPU
performance guide, rosetta/docs/GPU_performance.md, and the flag its JAX image sets):
the latency-hiding scheduler, which moves collectives to overlap compute (the gradient
all-reduce of `--mesh data=N`), and the collectives' stream at the highest priority; and
XLA_PYTHON_CLIENT_MEM_FRACTION 0.9 (the guide's value; JAX's default 0.75 leaves a fifth of
an 80 GB card unused). A flag the user's XLA_FLAGS already names, and a variable already set,
win; HARNESS_XLA_GPU_FLAGS=0 adds none. A GPU is recognised without importing JAX (the flags
must be set before its backend starts): a CUDA plugin of jaxlib is installed and JAX_PLATFORMS
does not rule it out.
"""
import importlib.util
import os

GPU_XLA_FLAGS = ("--xla_gpu_enable_latency_hiding_scheduler=true",
                 "--xla_gpu_enable_highest_priority_async_stream=true")
GPU_ENV = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}
CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_plugins.xla_cuda12",
                "jax_plugins.xla_cuda13")


# Dense peak FLOP/s of one device for MFU: (device_kind substring, precision, peak), the first
# match wins (a PCIe H100 before the SXM one). Vendors' figures without sparsity: H100 SXM and
# H200 989.4 TFLOP/s bf16, H100 PCIe 756; float32 is the non-tensor-core rate (67 / 51), A100
# 312 bf16 and 19.5 float32, TPU v4 275 and v5p 459 bf16. A kind not listed has no MFU (blank).
PEAK_FLOPS = (
    ("H100 PCIE", "bfloat16", 756e12), ("H100 PCIE", "float32", 51e12),
    ("H100", "bfloat16", 989e12), ("H100", "float32", 67e12),
    ("H200", "bfloat16", 989e12), ("H200", "float32", 67e12),
    ("A100", "bfloat16", 312e12), ("A100", "float32", 19.5e12),
    ("TPU V4", "bfloat16", 275e12), ("TPU V5", "bfloat16", 459e12),
)


# HBM bandwidth of one device in bytes/s (the data sheets'), by the same name matching: what a
# bandwidth-bound step (ResNet-50, EfficientNet) is measured against (bench/gpu_models.py
# --profile). This workplace's H100 copied device to device at about 3.0 TB/s (KINDS.md).
PEAK_BANDWIDTH = (
    ("H100 PCIE", 2.0e12), ("H100", 3.35e12), ("H200", 4.8e12),
    ("A100-SXM4-80GB", 2.039e12), ("A100", 1.555e12),
)


def peak_bandwidth(device_kind: str):
  """HBM bytes/s of one device of `device_kind`, or None where the table has no such device."""
  kind = (device_kind or "").upper()
  return next((bw for name, bw in PEAK_BANDWIDTH if name in kind), None)


def peak_flops(device_kind: str, precision: str = "bfloat16"):
  """Peak FLOP/s of one device of `device_kind` ('NVIDIA H100 80GB HBM3') at `precision`,
  or None where the table has no such device."""
  kind = (device_kind or "").upper()
  for name, prec, peak in PEAK_FLOPS:
    if name in kind and prec == precision:
      return peak
  return None


def mfu(flops_per_example, samples_per_s, device_kind, num_devices, precision):
  """Model FLOPs per example x samples/s over the devices' peak; None where either is unknown."""
  peak = peak_flops(device_kind, precision)
  if not (peak and flops_per_example and samples_per_s and num_devices):
    return None
  return flops_per_example * samples_per_s / (peak * num_devices)


def _installed(module) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:       # the parent package (jax_plugins) is absent
    return False


def jax_gpu_expected(environ=os.environ) -> bool:
  """Whether JAX will start a CUDA backend: a CUDA plugin is installed and JAX_PLATFORMS (when
  set) names cuda or gpu."""
  platforms = environ.get("JAX_PLATFORMS", "")
  if platforms and not {"cuda", "gpu"} & set(platforms.lower().split(",")):
    return False
  return any(_installed(m) for m in CUDA_PLUGINS)


def merge_xla_flags(user_flags: str, added) -> str:
  """The user's XLA_FLAGS with each of `added` appended unless the user names that flag."""
  named = {f.split("=", 1)[0] for f in user_flags.split()}
  extra = [f for f in added if f.split("=", 1)[0] not in named]
  return " ".join([user_flags.strip(), *extra]).strip()


def prepare_jax_gpu(environ=os.environ) -> bool:
  """Sets the GPU flags and memory fraction (see above) when a JAX GPU run is expected."""
  if environ.get("HARNESS_XLA_GPU_FLAGS", "1") == "0" or not jax_gpu_expected(environ):
    return False
  environ["XLA_FLAGS"] = merge_xla_flags(environ.get("XLA_FLAGS", ""), GPU_XLA_FLAGS)
  for name, value in GPU_ENV.items():
    environ.setdefault(name, value)
  return True


def prepare(framework, cpu_devices):
  """Must run before the framework is imported: simulated CPU devices are fixed at import."""
  if cpu_devices and framework == "tf":             # read by workloads/parallel/tf_runtime.py
    os.environ["HARNESS_CPU_DEVICES"] = str(cpu_devices)
  if cpu_devices and framework == "jax":
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={cpu_devices}")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  if framework == "jax" and not cpu_devices:
    prepare_jax_gpu()
  # TensorFlow's C++ start-up chatter (CUDA probes on a CPU host) would bury our one-line
  # errors and progress lines; Python-level TF errors still raise. Set it yourself to see it.
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
