import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_RESULTS = os.path.join(os.path.dirname(ROOT), "shared", "mlperf_results", "training_v0.7")

# In-process JAX tests see 8 simulated CPU devices (set before anything imports jax).
USER_XLA_FLAGS = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = USER_XLA_FLAGS + " --xla_force_host_platform_device_count=8"
# ... and TF ones 8 logical CPU devices (fixed before TensorFlow runs its first op).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from workloads.parallel import tf_runtime  # noqa: E402  pylint: disable=wrong-import-position
tf_runtime.use_logical_cpus(8)


def clean_env(**extra):
  """The environment a user's shell has: without the 8-device flag the tests set."""
  env = dict(os.environ, **extra)
  env["XLA_FLAGS"] = USER_XLA_FLAGS
  return env


def run_cli(*args, cwd=None, timeout=600):
  """Runs `python run_benchmark.py ARGS` in a fresh process, as a user would."""
  return subprocess.run([sys.executable, os.path.join(ROOT, "run_benchmark.py"), *args],
                        capture_output=True, text=True, cwd=cwd or ROOT, timeout=timeout,
                        env=clean_env())


@pytest.fixture
def cli():
  return run_cli
