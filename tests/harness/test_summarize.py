import glob
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from mlperf_logging import benchmark_meta

from harness import results, summarize
from harness.errors import UsageError
from tests.conftest import SHARED_RESULTS
from tests.harness.test_results import make_row


@pytest.mark.parametrize("minutes, failed, expected", [
    ([5, 1, 2, 3, 4], 0, 3.0),               # drop 1 and 5
    ([1, 2, 3, 4], 1, 3.0),                  # the failed run is the dropped slowest: drop 1 only
    ([1, 2, 3], 2, None),                    # two non-converged runs invalidate
])
def test_olympic_rules(minutes, failed, expected):
  score, note = summarize.olympic_minutes(minutes, failed)
  assert score == expected
  assert (note == "") == (expected is not None)


def test_summarize_our_csv_uses_rules_run_counts(tmp_path):
  path = str(tmp_path / "r.csv")
  for i, seconds in enumerate([600, 120, 180, 240, 300]):
    results.append_row(path, make_row(i, time_to_train_s=seconds, started_at=f"2026-01-0{i+1}"))
  results.append_row(path, make_row(9, framework="tf", time_to_train_s=100))
  table = summarize.summarize([path]).set_index("framework")
  assert table.loc["jax", "score_min"] == pytest.approx((180 + 240 + 300) / 3 / 60)
  assert pd.isna(table.loc["tf", "score_min"])
  assert "needs 5" in table.loc["tf", "note"]


ALL_ROUNDS = os.path.dirname(SHARED_RESULTS)
ROUNDS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ALL_ROUNDS, "training_v*")))


# The official summarizer's own code, run as `python -m mlperf_logging.result_summarizer` runs
# it, with one change: the compliance checker, which re-reads its rules YAML for every log,
# reads it with libyaml's BaseLoader instead of PyYAML's pure-Python one (three quarters of the
# tool's CPU by cProfile; v0.7's 295 logs: 14.5 -> 8.8 s, the same CSV). Both build the same
# tree from every rules file mlperf-logging ships: test_the_checker_reads_every_rules_file_
# alike_with_libyaml below compares them all.
_OFFICIAL_SUMMARIZER_WITH_LIBYAML = """
import runpy, yaml
yaml.BaseLoader = yaml.CBaseLoader
runpy.run_module("mlperf_logging.result_summarizer", run_name="__main__", alter_sys=True)
"""


@pytest.fixture(scope="session")
def official_runs(tmp_path_factory):
  """The official summarizer started once per round, all rounds at once, each on a copy (its
  RCP check rewrites scaling.json in place); {round: (process, csv path)}."""
  tmp = tmp_path_factory.mktemp("official")
  runs = {}
  for name in ROUNDS:
    copy = tmp / name
    shutil.copytree(os.path.join(ALL_ROUNDS, name), copy)
    ruleset = summarize.ruleset_of(str(copy))
    out = tmp / f"{name}.csv"
    proc = subprocess.Popen([sys.executable, "-c", _OFFICIAL_SUMMARIZER_WITH_LIBYAML,
                             str(copy) + "/{*}", "training", ruleset, "--csv", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp)
    runs[name] = (proc, out, ruleset)
  yield runs
  for proc, _, _ in runs.values():
    proc.kill()


def _official_scores(csv_path, ruleset):
  """{(system folder, benchmark): minutes or None} from the official summarizer's CSV."""
  frame = pd.read_csv(csv_path)
  benchmarks = [b for b in benchmark_meta.get_allowed_benchmarks("training", ruleset)
                if b in frame.columns]
  scores = {}
  for _, row in frame.iterrows():
    folder = row["details_url"].rsplit("/", 1)[-1].removesuffix(".json")
    for bench in benchmarks:
      scores[(folder, bench)] = None if pd.isna(row[bench]) else float(row[bench])
  return scores


@pytest.mark.slow
@pytest.mark.skipif(not ROUNDS, reason="../shared/mlperf_results missing")
@pytest.mark.parametrize("round_name", ROUNDS)
def test_summary_equals_the_official_summarizer(round_name, official_runs):
  """Every (system, benchmark) with result logs: the same score to 1e-6 minutes, or no score
  on both sides (compliance failures, too many dropped runs), ruleset from the folder name."""
  ours = summarize.summarize([os.path.join(ALL_ROUNDS, round_name)])
  proc, out, ruleset = official_runs[round_name]
  assert proc.wait(timeout=900) == 0
  official = _official_scores(out, ruleset)
  assert len(ours) > 0
  for row in ours.itertuples():
    theirs = official[(row.system, row.benchmark)]     # the official table has every one
    if theirs is None:
      assert pd.isna(row.score_min), (row.system, row.benchmark, row.note)
    else:
      assert row.score_min == pytest.approx(theirs, abs=1e-6), (row.system, row.benchmark)
  scored = {key for key, value in official.items() if value is not None}
  assert scored <= {(r.system, r.benchmark) for r in ours.itertuples()}


def test_the_checker_reads_every_rules_file_alike_with_libyaml():
  """summarize hands the compliance checker libyaml's BaseLoader: the same tree (or the same
  error, at the same place) as PyYAML's own for every rules file mlperf-logging ships."""
  import yaml
  from mlperf_logging.compliance_checker import mlp_compliance
  shim = summarize._YamlWithLibyamlBaseLoader()      # pylint: disable=protected-access
  assert shim.BaseLoader is yaml.CBaseLoader and shim.load is yaml.load

  def load(path, loader):
    with open(path) as f:
      try:
        return yaml.load(f, Loader=loader)
      except yaml.MarkedYAMLError as e:     # the messages differ in wording, not in place
        return type(e).__name__, e.problem_mark.line, e.problem_mark.column
  files = glob.glob(os.path.join(os.path.dirname(mlp_compliance.__file__), "**", "*.yaml"),
                    recursive=True)
  assert len(files) > 100
  for path in files:
    assert load(path, shim.BaseLoader) == load(path, yaml.BaseLoader), path


@pytest.mark.skipif(not os.path.isdir(SHARED_RESULTS), reason="../shared/mlperf_results missing")
def test_the_checkers_own_yaml_is_back_after_a_summary():
  """The shim stands in for the checker's `yaml` only while summarize scores a log."""
  import yaml
  from mlperf_logging.compliance_checker import mlp_compliance
  summarize.run_minutes(glob.glob(os.path.join(SHARED_RESULTS, "*", "results", "*", "*",
                                               "result_0.txt"))[0], "0.7.0")
  assert mlp_compliance.yaml is yaml


@pytest.mark.skipif(not ROUNDS, reason="../shared/mlperf_results missing")
def test_round_rules_scaling_and_drop_counts():
  """What the rounds beyond v0.7 need: a failed compliance check drops the run (v2.1 Habana
  BERT logs opt_epsilon), scaling.json multiplies the score, unet3d drops 4 and 4."""
  habana = summarize.summarize([os.path.join(ALL_ROUNDS, "training_v2.1", "Intel-HabanaLabs")])
  bert = habana.set_index(["system", "benchmark"]).loc[("HLS-Gaudi2-TF", "bert")]
  assert pd.isna(bert["score_min"]) and "compliance check failed" in bert["note"]
  # scaling.json: the TF ResNet's olympic average of its own logs' minutes x 1.0011204...
  folder = os.path.join(ALL_ROUNDS, "training_v2.1", "Intel-HabanaLabs", "results",
                        "HLS-Gaudi2-TF", "resnet")
  minutes = [summarize.run_minutes(os.path.join(folder, f"result_{i}.txt"), "2.1.0")[0]
             for i in range(5)]
  resnet = habana.set_index(["system", "benchmark"]).loc[("HLS-Gaudi2-TF", "resnet")]
  factor = 1.0011204481792717                     # the folder's scaling.json
  assert resnet["score_min"] == pytest.approx(
      summarize.olympic_minutes(minutes, 0)[0] * factor, rel=1e-12)
  assert "scaling.json" in resnet["note"]
  assert summarize.olympic_minutes(list(range(40)), 0, drop=4)[0] == sum(range(4, 36)) / 32
  assert summarize.olympic_minutes(list(range(38)), 2, drop=4)[0] == sum(range(4, 36)) / 32
  assert summarize.olympic_minutes(list(range(35)), 5, drop=4)[0] is None


def test_ruleset_from_folder_or_flag(tmp_path):
  assert summarize.ruleset_of("/x/training_v2.1/Dell") == "2.1.0"
  assert summarize.ruleset_of("/x/training_v2.1/Dell", "3.1.0") == "3.1.0"
  with pytest.raises(UsageError, match="pass --ruleset"):
    summarize.ruleset_of(str(tmp_path))
  with pytest.raises(UsageError, match="allowed: .*4.0.0"):
    summarize.ruleset_of(str(tmp_path), "9.9")


@pytest.mark.skipif(not os.path.isdir(SHARED_RESULTS), reason="../shared/mlperf_results missing")
def test_summarize_accepts_results_folder_and_single_system_folder():
  inspur = os.path.join(SHARED_RESULTS, "Inspur")
  whole = summarize.summarize([inspur])
  from_results = summarize.summarize([os.path.join(inspur, "results")])
  pd.testing.assert_frame_equal(whole, from_results)
  one = summarize.summarize([os.path.join(SHARED_RESULTS, "Google", "results", "tpu-v3-1024-TF")])
  row = one.set_index("benchmark").loc["maskrcnn"]
  assert row["converged"] == 4 and row["runs"] == 5        # one aborted run: counted as slowest
  assert row["score_min"] > 0 and "1 dropped: compliance check failed" in row["note"]


def test_committed_baseline_scores_and_gates_itself():
  """results/baseline_cpu_mini.csv: a group per registered workload's benchmark and framework,
  each with the ruleset's run count (mlperf_logging's own table; rules/<b>.yaml read by hand for
  a benchmark MLPerf does not have) or the fewest the gate can test among that many groups
  (compare.runs_to_test: 6 for 14), measured on a 2-core CPU, each group scored as the olympic
  mean of its runs (from the CSV read by hand)."""
  import csv
  import yaml
  from harness import compare, config, registry
  from tests.conftest import ROOT
  path = os.path.join(ROOT, "results", "baseline_cpu_mini.csv")
  table = summarize.summarize([path]).set_index(["benchmark", "framework"])
  with open(path) as f:
    rows = list(csv.DictReader(f))
  groups = {(r["mlperf_benchmark"], r["framework"]) for r in rows}
  benchmarks = {registry.get(w).mlperf_benchmark for w in registry.names()}
  assert groups == {(b, f) for b in benchmarks for f in config.FRAMEWORKS}
  assert set(table.index) == groups
  official = benchmark_meta.get_result_file_counts("training")

  def runs_required(benchmark):
    if benchmark in official:
      return official[benchmark]
    with open(os.path.join(ROOT, "rules", f"{benchmark}.yaml")) as f:
      return yaml.safe_load(f)["runs_required"]

  for benchmark, framework in groups:
    mine = sorted((r for r in rows if (r["mlperf_benchmark"], r["framework"]) ==
                   (benchmark, framework) and r["status"] == "success"),
                  key=lambda r: r["started_at"])
    # the ruleset's count, or the fewest the gate's family of groups can test (compare)
    least = compare.runs_to_test(len(groups))
    required = runs_required(benchmark)
    assert len(mine) == max(required, least) >= 3, (benchmark, framework)
    # the score: the latest `required` runs (a score is the ruleset's count of runs)
    times = sorted(float(r["time_to_train_s"]) for r in mine[-required:])
    kept = times[1:-1]                     # the olympic mean: the fastest and slowest dropped
    assert table.loc[(benchmark, framework), "score_min"] == pytest.approx(
        sum(kept) / len(kept) / 60)
  assert not compare.is_regression(compare.compare(path, path, 0.05))


@pytest.mark.slow
def test_committed_baseline_logs_pass_the_official_checker():
  """One log of each workload x framework (a group's runs are one code path), and every log
  the CSV names exists."""
  from harness import compliance
  from tests.conftest import ROOT
  frame = results.read_csv(os.path.join(ROOT, "results", "baseline_cpu_mini.csv"))
  assert all(os.path.isfile(os.path.join(ROOT, log)) for log in frame["log_path"])
  for log in frame.groupby(["workload", "framework"])["log_path"].first():
    passed, report = compliance.check(os.path.join(ROOT, log))
    assert passed, report
