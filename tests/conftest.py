import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_RESULTS = os.path.join(os.path.dirname(ROOT), "shared", "mlperf_results", "training_v0.7")

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def run_cli(*args, cwd=None, timeout=600):
  """Runs `python run_benchmark.py ARGS` in a fresh process, as a user would."""
  return subprocess.run([sys.executable, os.path.join(ROOT, "run_benchmark.py"), *args],
                        capture_output=True, text=True, cwd=cwd or ROOT, timeout=timeout)


@pytest.fixture
def cli():
  return run_cli
