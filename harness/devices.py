"""The environment a framework reads when it loads: simulated CPU devices and TF's log level.
Set before TensorFlow or JAX is imported (by `run`, `describe`, `simulate --workload` and the
bench scripts); a module of its own so that none of them imports the command line."""
import os


def prepare(framework, cpu_devices):
  """Must run before the framework is imported: simulated CPU devices are fixed at import."""
  if cpu_devices and framework == "tf":             # read by workloads/parallel/tf_runtime.py
    os.environ["HARNESS_CPU_DEVICES"] = str(cpu_devices)
  if cpu_devices and framework == "jax":
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={cpu_devices}")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  # TensorFlow's C++ start-up chatter (CUDA probes on a CPU host) would bury our one-line
  # errors and progress lines; Python-level TF errors still raise. Set it yourself to see it.
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
