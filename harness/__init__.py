"""Framework-neutral core of the benchmark harness: imports neither TensorFlow nor JAX."""
