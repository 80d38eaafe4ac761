#!/usr/bin/env python3
"""MLPerf-style training benchmarks for TensorFlow and JAX. `python run_benchmark.py --help`."""
import sys

from harness.cli import main

if __name__ == "__main__":
  sys.exit(main())
