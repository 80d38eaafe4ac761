"""The core (driver, logging, rules, results, summaries, the collective simulator) imports
neither TensorFlow nor JAX."""
import subprocess
import sys

from tests.conftest import ROOT


def test_harness_imports_no_framework():
  code = ("import sys, harness.cli, harness.driver, harness.mllog, harness.rules, "
          "harness.results, harness.summarize, harness.compare, harness.ab, harness.changepoints, "
          "harness.compliance, "
          "harness.registry, harness.report, harness.package_check, harness.tensorboard, "
          "harness.commsim.command, harness.commsim.tables, harness.commsim.functional; "
          "harness.registry.get('resnet50');"
          "bad = [m for m in ('tensorflow', 'jax', 'flax', 'keras') if m in sys.modules];"
          "print(bad); sys.exit(1 if bad else 0)")
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stdout + proc.stderr


def test_reference_preset_takes_target_and_cadence_from_rules():
  from harness import rules
  from workloads.resnet import spec
  mlperf = rules.load("resnet")
  cfg = spec.reference()
  assert cfg.train.target == mlperf.target == 0.759
  assert cfg.train.eval_every_epochs == mlperf.eval_cadence["every"] == 4
  assert mlperf.ruleset == "4.0.0" and mlperf.runs_required == 5


def test_every_benchmark_has_rules_with_a_checker():
  """Each registered workload's rules/<benchmark>.yaml against mlperf_logging's own tables: an
  MLPerf benchmark's run count is the package's (benchmark_meta), its ruleset is one the
  package allows the benchmark in and has a closed-division rule file for; a benchmark MLPerf
  does not have (EfficientNet) brings its own checker config, run by a ruleset the package
  has, and one of MLPerf's run counts."""
  import os
  from mlperf_logging import benchmark_meta
  from mlperf_logging.compliance_checker import mlp_compliance
  from harness import registry, rules
  checkers = os.path.dirname(mlp_compliance.__file__)
  counts = benchmark_meta.get_result_file_counts("training")
  benchmarks = {registry.get(w).mlperf_benchmark for w in registry.names()}
  assert {"resnet", "bert"} <= benchmarks and benchmarks <= set(rules.benchmarks())
  for name in sorted(benchmarks):
    r = rules.load(name)
    assert r.benchmark == name
    assert os.path.isdir(os.path.join(checkers, f"training_{r.ruleset}")), (name, r.ruleset)
    if name in counts:                       # an MLPerf benchmark: the package's numbers
      assert r.runs_required == counts[name], name
      assert name in benchmark_meta.get_allowed_benchmarks("training", r.ruleset), name
      assert os.path.isfile(os.path.join(checkers, f"training_{r.ruleset}",
                                         f"closed_{name}.yaml")), (name, r.ruleset)
      assert r.checker_config is None, name
    else:                                    # our own benchmark: our own rule file
      assert r.runs_required in set(counts.values()), name
      assert r.checker_config and os.path.isfile(r.checker_config), name
  assert rules.load("efficientnet").checker_config.endswith("efficientnet_compliance.yaml")


def test_no_workload_imports_another_and_the_core_imports_no_workload():
  """Shared pieces live in workloads/{common,optim,parallel}; a workload's folder imports only
  itself and those, and harness/ imports no workload module (the registry names them as
  strings and imports them on demand)."""
  import ast
  import os
  shared = {"common", "optim", "parallel"}
  workloads_dir = os.path.join(ROOT, "workloads")
  workloads = [d for d in os.listdir(workloads_dir)
               if os.path.isdir(os.path.join(workloads_dir, d)) and d not in shared | {"__pycache__"}]
  assert {"resnet", "bert"} <= set(workloads)

  def imported(path):
    tree = ast.parse(open(path).read())
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and node.module:
        yield node.module
      elif isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)

  bad = []
  for folder in workloads + sorted(shared) + ["harness"]:
    base = os.path.join(ROOT, "harness") if folder == "harness" else os.path.join(workloads_dir, folder)
    for name in os.listdir(base):
      if not name.endswith(".py"):
        continue
      for module in imported(os.path.join(base, name)):
        parts = module.split(".")
        if parts[0] != "workloads" or len(parts) < 2:
          continue
        allowed = set() if folder == "harness" else (
            shared if folder in shared else shared | {folder})
        if parts[1] not in allowed:
          bad.append(f"{folder}/{name} imports {module}")
  assert not bad, bad
