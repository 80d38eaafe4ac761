"""A JAX run needs no TensorFlow where no tf.data pipeline reads files (issue 53: an accelerator
image has JAX, flax and optax but no TensorFlow). In a process where importing tensorflow,
keras, tensorflow_datasets, pandas, tensorboardX, matplotlib or scikit-learn fails: every
registered workload's JAX trainer module and input pipeline import, and make a synthetic batch
of the real layout in numpy; each one's synthetic run (tiny model) goes through the driver, its
trainer and its recipe's optimizer to its result row and a log the official checker passes
but for the eval a throughput run does not have, with mlperf-logging and PyYAML from the folder bench/gpu_deps.sh installs for such an image. The
pipelines reach TensorFlow through workloads/common/host_tf.py, which imports it only when a
pipeline reads files."""
import subprocess
import sys
import textwrap

from tests.conftest import ROOT, clean_env

SCRIPT = textwrap.dedent("""
    import importlib, sys
    for name in ("tensorflow", "keras", "tensorflow_datasets", "pandas", "tensorboardX",
                 "matplotlib", "sklearn"):
      sys.modules[name] = None          # importing them raises ImportError
    from harness import cli, compliance, registry
    for name in registry.names():
      spec = registry.get(name)
      importlib.import_module(spec.trainer_modules["jax"])
      cfg = spec.configure("tiny", ["data.source=synthetic"] +
                           (["model.vocab_size=40"] if name == "transformer" else []))
      batch = spec.input_pipeline.synthetic_batch(cfg, 4, 0)
      layout = spec.batch_layout(cfg, 4, False)
      assert set(batch) == set(layout), (name, set(batch), set(layout))
      for key, (shape, dtype, _) in layout.items():
        assert tuple(batch[key].shape) == tuple(shape), (name, key, batch[key].shape, shape)
      print("imported", name)
    import glob, os
    for name in registry.names():
      extra = ["--set", "model.vocab_size=40"] if name == "transformer" else []
      code = cli.main(["run", name, "--preset", "tiny", "--set", "data.source=synthetic",
                       "--set", "train.synthetic_steps=1", "--results", sys.argv[1],
                       "--log-dir", os.path.join(sys.argv[2], name), *extra])
      assert code == 0, name
      (log,) = glob.glob(os.path.join(sys.argv[2], name, "*.log"))
      # The official checker's one complaint: a throughput run has no eval to log.
      passed, report = compliance.check(log)
      problems = [line for line in report.splitlines() if "WARNING" in line or "ERROR" in line]
      assert problems[0].endswith("Required AT_LEAST_ONE occurrence of 'eval_accuracy' but "
                                  "found 0") and problems[1:] == ["ERROR - FAILED"], report
    assert all(sys.modules.get(n) is None for n in ("tensorflow", "keras")), "TF was imported"
    import mlperf_logging, yaml
    print("from", mlperf_logging.__file__, yaml.__file__)
""")


def test_jax_synthetic_runs_import_no_tensorflow(tmp_path):
  version = "%d.%d" % sys.version_info[:2]
  deps = subprocess.run(["bash", "bench/gpu_deps.sh", version], cwd=ROOT, capture_output=True,
                        text=True, timeout=300, env=dict(clean_env(), GPU_DEPS_DIR=str(tmp_path)))
  assert deps.returncode == 0, deps.stdout + deps.stderr[-2000:]
  folder = tmp_path / ("cp" + version.replace(".", ""))
  env = dict(clean_env(few_steps=True), PYTHONPATH=f"{folder}:{ROOT}")   # tiny: compile less
  proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "r.csv"),
                         str(tmp_path / "logs")], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  used = proc.stdout.split("from ", 1)[1].split()
  assert all(path.startswith(str(folder)) for path in used), used   # the script's folder
  from harness import registry
  assert proc.stdout.count("imported ") == len(registry.names())
  import pandas as pd
  rows = pd.read_csv(tmp_path / "r.csv")
  assert list(rows["workload"]) == registry.names()
  assert (rows["status"] == "success").all() and (rows["framework"] == "jax").all()
  assert (rows["throughput"] > 0).all() and rows["time_to_train_s"].isna().all()   # no target
