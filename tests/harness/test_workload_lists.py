"""The places that used to list the workloads by hand read the registry (issue 56): `list
--names` (CI's runs), bench/all.py's bench scripts, the test files' start order."""
import glob
import os

from harness import cli, registry
from tests import conftest
from tests.conftest import ROOT


def test_list_names_prints_the_registry_one_a_line(capsys):
  assert cli.main(["list", "--names"]) == 0
  out = capsys.readouterr().out
  assert out.splitlines() == registry.names() and "frameworks" not in out
  assert {"resnet50", "bert"} <= set(out.split())


def test_bench_all_finds_every_peer_script_by_its_workload():
  """Each bench/<model>_vs_<peer>.py is found, names a registered workload, and no two the same
  one; the table's workloads come in the registry's order."""
  import importlib
  bench_all = importlib.import_module("bench.all")
  scripts = sorted(os.path.basename(p)[:-3]
                   for p in glob.glob(os.path.join(ROOT, "bench", "*_vs_*.py")))
  assert sorted(bench_all.BENCHES.values()) == scripts and len(scripts) >= 2
  assert list(bench_all.BENCHES) == [w for w in registry.names() if w in bench_all.BENCHES]
  for workload, stem in bench_all.BENCHES.items():
    assert importlib.import_module(f"bench.{stem}").WORKLOAD == workload
  assert bench_all.BENCHES["resnet50"] == "resnet_vs_keras"


def test_an_unmeasured_workload_s_slow_files_start_after_the_measured_ones():
  """LONG_FILES (measured) keep their order; a file it does not list starts after them when its
  name says it is an end-to-end, distributed or parity file (in that order), else last."""
  on_disk = {os.path.relpath(p, ROOT)
             for p in glob.glob(os.path.join(ROOT, "tests", "**", "test_*.py"), recursive=True)}
  assert set(conftest.LONG_FILES) <= on_disk
  ranks = [conftest.file_rank(p) for p in conftest.LONG_FILES]
  assert ranks == list(range(len(conftest.LONG_FILES)))
  n = len(conftest.LONG_FILES)
  new = ["tests/newnet/test_newnet_end_to_end.py", "tests/newnet/test_newnet_distributed.py",
         "tests/newnet/test_newnet_parity.py", "tests/newnet/test_newnet_model.py"]
  assert [conftest.file_rank(p) for p in new] == [n, n + 1, n + 2, n + 3]


def _literal_workload_lists(path, names):
  """(line, the names) of each dict (by key), list, tuple or set literal in a file that names
  two or more of `names`."""
  import ast  # pylint: disable=import-outside-toplevel
  found = []
  for node in ast.walk(ast.parse(open(path).read())):
    items = (node.keys if isinstance(node, ast.Dict) else
             node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else [])
    named = [i.value for i in items if isinstance(i, ast.Constant) and i.value in names]
    if len(set(named)) >= 2:
      found.append((node.lineno, sorted(set(named))))
  return found


def test_no_hand_kept_list_of_workloads_outside_the_registry_and_the_folders():
  """harness/ and bench/ name no two workloads (nor their MLPerf benchmarks) in one literal:
  per-workload figures live in each workload's folder (its spec, bare_step.py) and are found
  through the registry. The registry itself is the one list."""
  names = set(registry.names()) | {registry.get(n).mlperf_benchmark for n in registry.names()}
  files = [p for folder in ("harness", "bench")
           for p in glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True)
           if os.path.relpath(p, ROOT) != os.path.join("harness", "registry.py")]
  lists = {os.path.relpath(p, ROOT): found for p in files
           for found in [_literal_workload_lists(p, names)] if found}
  assert not lists, lists
