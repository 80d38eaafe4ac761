import math

import numpy as np
import scipy.stats

from harness import cli, compare, config, registry, results, rules, run_logs
from tests.harness.test_results import make_row

# Five runs' throughput with a 4% spread, like the committed baseline's (BERT, DLRM TF), and
# the same five re-drawn: unchanged code measured twice.
NOISY = [1000.0, 1040.0, 965.0, 1012.0, 981.0]
REDRAWN = [1022.0, 979.0, 1003.0, 958.0, 1036.0]


def _csv(tmp_path, name, rows):
  path = str(tmp_path / name)
  for row in rows:
    results.append_row(path, row)
  return path


def _runs(throughputs, speedup=1.0, seeds=None, samples=None, **changes):
  """Runs whose every step is `speedup` times as fast: throughput and time to train alike."""
  seeds = seeds if seeds is not None else range(len(throughputs))
  samples = samples or [100] * len(throughputs)
  return [make_row(seed, throughput=tp * speedup, time_to_train_s=s / (0.9 * tp * speedup),
                   samples_to_converge=s, seed=seed, **changes)
          for tp, seed, s in zip(throughputs, seeds, samples)]


def test_unchanged_noisy_runs_pass_and_a_20_percent_loss_in_5_runs_fails(tmp_path):
  base = _csv(tmp_path, "base.csv", _runs(NOISY))
  same = _csv(tmp_path, "same.csv", _runs(REDRAWN))
  slow = _csv(tmp_path, "slow.csv", _runs(REDRAWN, speedup=0.8))
  fast = _csv(tmp_path, "fast.csv", _runs(REDRAWN, speedup=1.25))
  assert cli.main(["compare", base, same]) == 0
  assert compare.compare(base, same)["verdict"].tolist() == ["ok"]
  assert cli.main(["compare", base, slow]) == 1
  row = compare.compare(base, slow).iloc[0]
  assert row["verdict"] == "regression (throughput, time-to-train speed)"
  assert row["p_speed"] == 1 / math.comb(10, 5)              # every new run below every base run
  assert row["throughput_lo"] < row["throughput_ratio"] < row["throughput_hi"] < 0.9
  assert 0.75 < row["throughput_ratio"] < 0.85
  assert cli.main(["compare", base, slow, "--threshold", "0.25"]) == 0   # significant, small
  assert compare.compare(base, fast)["verdict"].tolist() == ["improvement"]
  assert cli.main(["compare", base, fast]) == 0


def test_speed_test_is_the_exact_mann_whitney_test_with_one_measure():
  rng = np.random.default_rng(3)
  for n_base, n_new in ((5, 5), (3, 4), (10, 10), (2, 7)):
    for _ in range(4):
      base, new = rng.lognormal(0, 0.05, n_base), rng.lognormal(-0.03, 0.05, n_new)
      test = compare.speed_test({"throughput": base}, {"throughput": new})
      want = scipy.stats.mannwhitneyu(new, base, alternative="less", method="exact").pvalue
      assert math.isclose(test.p_loss, want, rel_tol=1e-9)
      assert test.min_p == 1 / math.comb(n_base + n_new, n_base)


def test_hodges_lehmann_interval_is_bauer_s_order_statistics():
  """5 vs 5 at alpha 0.05: P(U <= 2) = 4/252 <= 0.025 < P(U <= 3) = 7/252, so the interval is
  the 3rd smallest and 3rd largest of the 25 pairwise ratios; 1 vs 1 has none."""
  base = np.array(NOISY)
  new = np.array(REDRAWN) * 0.9
  ratios = np.sort(np.divide.outer(new, base).ravel())
  estimate, lo, hi = compare.hodges_lehmann(base, new, 0.05)
  assert math.isclose(estimate, np.median(ratios))
  assert math.isclose(lo, ratios[2]) and math.isclose(hi, ratios[-3])
  assert list(compare._u_counts(5, 5)[:4]) == [1, 1, 2, 3]
  assert all(math.isnan(v) for v in compare.hodges_lehmann(base[:1], new[:1], 0.05)[1:])


def test_the_family_is_corrected_a_p_that_passes_alone_does_not_pass_among_twelve(tmp_path):
  """One group's runs overlap by one pair (p = 2/252 = 0.008 < 0.05): alone it regresses; in a
  comparison of 12 such groups Holm asks p <= 0.05/12 = 0.004 of the smallest, so none does,
  and each is reported with the smallest loss these runs could have shown."""
  slow = sorted(NOISY)
  slow = [slow[0] * 0.85, slow[0] * 0.9, slow[1] * 0.9, slow[2] * 0.9, slow[0] * 1.003]
  groups = [f"w{i}" for i in range(12)]
  base = _csv(tmp_path, "base.csv", [r for g in groups for r in _runs(NOISY, workload=g)])
  one = _csv(tmp_path, "one.csv", _runs(NOISY, workload="w0"))
  new_one = _csv(tmp_path, "new1.csv", _runs(slow, workload="w0"))
  new = _csv(tmp_path, "new.csv", [r for g in groups for r in _runs(slow, workload=g)])
  alone = compare.compare(one, new_one).iloc[0]
  assert math.isclose(alone["p_speed"], 2 / 252) and alone["verdict"].startswith("regression")
  table = compare.compare(base, new)
  assert table.attrs["tests"] == 12
  assert (table["p_speed"] == alone["p_speed"]).all()
  assert (table["p_speed_adj"] == min(1, 12 * 2 / 252)).all()
  assert set(table["verdict"]) == {"ok"}
  assert cli.main(["compare", base, new]) == 0
  assert (table["detectable_loss"] > alone["detectable_loss"]).all()   # a stricter level
  assert cli.main(["compare", base, new, "--alpha", "0.1"]) == 1        # 12 x 0.008 < 0.1


def test_too_few_runs_is_said_not_silently_passed(tmp_path):
  """1 vs 1 (smallest p 1/2) or 2 vs 2 (1/6) can never reach 0.05: the verdict says so, and
  fails the gate with --require-all, even for a 30% loss."""
  base = _csv(tmp_path, "base.csv", _runs(NOISY[:2]))
  new = _csv(tmp_path, "new.csv", _runs(NOISY[:2], speedup=0.7))
  verdict = compare.compare(base, new)["verdict"].iloc[0]
  assert verdict.startswith("too few runs (2 vs 2: the smallest possible p, 0.167")
  assert cli.main(["compare", base, new]) == 0
  assert cli.main(["compare", base, new, "--require-all"]) == 1
  assert math.isinf(compare.compare(base, new)["detectable_loss"].iloc[0])


def test_failed_runs_and_missing_keys(tmp_path):
  base = _csv(tmp_path, "base.csv", _runs(NOISY) + _runs(NOISY, framework="tf"))
  failed = _csv(tmp_path, "failed.csv", [make_row(i, status="aborted", time_to_train_s=None)
                                         for i in range(3)] + _runs(REDRAWN, framework="tf"))
  table = compare.compare(base, failed).set_index("framework")
  assert table.loc["jax", "verdict"] == "regression (no successful run)"
  assert table.loc["tf", "verdict"] == "ok"
  missing = _csv(tmp_path, "missing.csv", _runs(REDRAWN))
  table = compare.compare(base, missing).set_index("framework")
  assert table.loc["tf", "verdict"] == "missing"
  assert cli.main(["compare", base, missing]) == 0
  assert cli.main(["compare", base, missing, "--require-all"]) == 1


def test_same_seeds_convergence_is_compared_run_by_run_and_names_the_seed(tmp_path):
  """Fixed seeds: samples to target are deterministic, so one seed needing one more eval is a
  change of numerics, at unchanged speed and in one run of five: it fails, naming the seed."""
  samples = [9000, 9000, 12000, 9000, 6000]
  base = _csv(tmp_path, "base.csv", _runs(NOISY, seeds=range(100, 105), samples=samples))
  changed = list(samples)
  changed[3] = 12000
  new = _csv(tmp_path, "new.csv", _runs(REDRAWN, seeds=range(100, 105), samples=changed))
  row = compare.compare(base, new).iloc[0]
  assert row["verdict"] == "convergence changed (seed 103: 9000 -> 12000)"
  assert cli.main(["compare", base, new]) == 1
  same = _csv(tmp_path, "same.csv", _runs(REDRAWN, seeds=range(100, 105), samples=samples))
  assert compare.compare(base, same)["convergence"].iloc[0] == "same (5 seeds)"
  other = _csv(tmp_path, "other.csv", _runs(REDRAWN, seeds=range(100, 105), samples=changed,
                                            versions="python=3.12"))
  assert compare.compare(base, other)["convergence"].iloc[0].startswith("same (mean")  # RCP


def _log(tmp_path, name, values):
  """An MLPerf log whose eval_accuracy events are `values`, one an epoch (mllog's line format)."""
  path = tmp_path / name
  lines = [f':::MLLOG {{"namespace": "", "time_ms": {1000 + e}, "event_type": "POINT_IN_TIME", '
           f'"key": "eval_accuracy", "value": {v!r}, "metadata": {{"epoch_num": {e + 1}}}}}'
           for e, v in enumerate(values)]
  path.write_text("\n".join(lines) + "\n")
  return str(path)


def test_same_seeds_name_the_first_eval_where_the_curves_part(tmp_path):
  """With both runs' logs at hand, a changed seed names the eval where its curves part, and a
  curve that parts with the same samples to target is a change of numerics said, not failed."""
  curve = [0.41, 0.52, 0.61, 0.72]
  base_logs = [_log(tmp_path, f"b{s}.log", curve) for s in range(3)]
  later = _log(tmp_path, "n1.log", [0.41, 0.51875, 0.6, 0.69, 0.73])
  wobble = _log(tmp_path, "n2.log", [0.41, 0.52, 0.6100001, 0.72])
  new_logs = [_log(tmp_path, "n0.log", curve), later, wobble]
  base = _csv(tmp_path, "base.csv", [
      make_row(s, seed=100 + s, samples_to_converge=400, log_path=log, throughput=NOISY[s])
      for s, log in enumerate(base_logs)])
  new = _csv(tmp_path, "new.csv", [
      make_row(s, seed=100 + s, samples_to_converge=500 if s == 1 else 400, log_path=log,
               throughput=REDRAWN[s]) for s, log in enumerate(new_logs)])
  row = compare.compare(base, new).iloc[0]
  assert row["verdict"] == ("convergence changed (seed 101: 400 -> 500, curves part at eval 2 "
                            "(epoch 2: 0.52 -> 0.51875))")
  same = _csv(tmp_path, "same.csv", [
      make_row(s, seed=100 + s, samples_to_converge=400, log_path=log, throughput=REDRAWN[s])
      for s, log in enumerate([new_logs[0], base_logs[1], wobble])])
  row = compare.compare(base, same).iloc[0]
  assert row["convergence"] == ("same (3 seeds; numerics changed: seed 102's curves part at "
                                "eval 3 (epoch 3: 0.61 -> 0.6100001))")
  assert not row["verdict"].startswith("convergence changed")
  shorter = _log(tmp_path, "n3.log", curve[:3])
  assert run_logs.first_parting(base_logs[0], shorter) == (4, 4, 0.72, None)
  assert run_logs.first_parting(base_logs[0], new_logs[0]) is None


def test_other_seeds_convergence_is_the_rcp_comparison_of_means(tmp_path):
  """Other seeds: the olympic means and the pooled t-test of rcp_checker._find_p_value
  (two-sided); a shift of three standard deviations is a change, a spread-alike draw is not;
  all runs alike on both sides is compared exactly."""
  from mlperf_logging.rcp_checker import rcp_checker
  base_s = [43200, 48000, 43200, 52800, 48000]
  base = _csv(tmp_path, "base.csv", _runs(NOISY, seeds=range(100, 105), samples=base_s))
  alike = _csv(tmp_path, "alike.csv", _runs(REDRAWN, seeds=range(200, 205),
                                            samples=[48000, 43200, 43200, 48000, 52800]))
  assert compare.compare(base, alike)["verdict"].iloc[0] == "ok"
  more_s = [62400, 57600, 67200, 57600, 62400]
  more = _csv(tmp_path, "more.csv", _runs(REDRAWN, seeds=range(200, 205), samples=more_s))
  row = compare.compare(base, more).iloc[0]
  assert row["verdict"].startswith("convergence changed (mean 46400 -> 60800, RCP p=")
  assert cli.main(["compare", base, more]) == 1
  got = compare.convergence_rcp(np.array(base_s, float), np.array(more_s, float))
  spread = math.sqrt((np.var(base_s, ddof=1) + np.var(more_s, ddof=1)) / 2)
  _, one_sided = rcp_checker.RCP_Checker._find_p_value(None, 60800, spread, 3, 46400, spread, 3)
  assert math.isclose(got["p"], 2 * min(one_sided, 1 - one_sided))
  flat = _csv(tmp_path, "flat.csv", _runs(NOISY, samples=[9024] * 5))
  flat_other = _csv(tmp_path, "flat2.csv", _runs(REDRAWN, seeds=range(10, 15),
                                                 samples=[12032] * 5))
  row = compare.compare(flat, flat_other).iloc[0]
  assert row["verdict"] == "convergence changed (every run 9024 -> mean 12032)"
  assert compare.compare(flat, flat_other).attrs["tests"] == 1       # speed only: no p spent


def test_bad_alpha_is_a_usage_error():
  with pytest.raises(UsageError, match=r"argument --alpha: 1.0 is out of range; allowed: 0 < "):
    cli.build_parser().parse_args(["compare", "a.csv", "b.csv", "--alpha", "1"])


# ----------------------------------------------------------------------------- the CI gate

import os
import shlex

import numpy as np
import pytest
import yaml

from harness.errors import UsageError
from tests.conftest import ROOT

BASELINE = os.path.join(ROOT, "results", "baseline_cpu_mini.csv")
WORKFLOW = os.path.join(ROOT, "docs", "ci", "regression.yml")


def _scaled(tmp_path, name, ttt_factors, tp_factors=None):
  """The committed baseline with each run's time-to-train (and throughput) scaled."""
  frame = results.read_csv(BASELINE)
  frame["time_to_train_s"] = frame["time_to_train_s"] * ttt_factors
  if tp_factors is not None:
    frame["throughput"] = frame["throughput"] * tp_factors
  path = str(tmp_path / name)
  frame[results.COLUMNS].to_csv(path, index=False)
  return path


# Every registered workload, in both frameworks (tests/test_contract.py holds each workload to
# both), with its rules/<benchmark>.yaml run count (checked against mlperf_logging's own table in
# tests/harness/test_framework_neutral_core.py).
WORKLOADS = tuple(registry.names())
FRAMEWORKS = config.FRAMEWORKS
GROUPS = {(w, f) for w in WORKLOADS for f in FRAMEWORKS}
# the ruleset's run count, or the fewest the gate can test in a family of this many groups
RUNS = {w: max(rules.load(registry.get(w).mlperf_benchmark).runs_required,
               compare.runs_to_test(len(GROUPS))) for w in WORKLOADS}


def test_the_committed_baseline_holds_the_ruleset_s_runs_of_every_workload_and_framework():
  """Each registered workload x framework has exactly its ruleset's run count (MLPerf's: 5, 10
  for BERT and the Transformer; with fewer there is no olympic score to gate), or the fewest
  runs whose speed test can reject among this many groups (6 for 14: 1/C(12, 6) = 0.00108 <=
  0.05 / 14; 5 a side, 1/252 = 0.00397, could not), all mini runs that succeeded; no group of a
  workload the registry does not list."""
  assert {"resnet50", "bert"} <= set(WORKLOADS) and min(RUNS.values()) >= 3
  frame = results.read_csv(BASELINE)
  counts = frame.groupby(["workload", "framework"]).size()
  assert set(counts.index) == GROUPS
  assert all(count == RUNS[w] for (w, _), count in counts.items()), counts
  assert set(frame["preset"]) == {"mini"} and set(frame["status"]) == {"success"}
  benchmarks = frame.groupby("workload")["mlperf_benchmark"].unique()
  assert all(list(benchmarks[w]) == [registry.get(w).mlperf_benchmark] for w in WORKLOADS)


def test_gate_on_the_committed_baseline_noise_only_passes(tmp_path):
  """Runs re-drawn within +-8% of the baseline's, same seeds and samples: no verdict fails at
  the defaults (alpha 0.05, threshold 3%), exit 0 with --require-all (every group testable)."""
  rng = np.random.default_rng(0)
  rows = len(results.read_csv(BASELINE))
  for trial in range(5):
    noisy = _scaled(tmp_path, f"noisy{trial}.csv", rng.uniform(0.92, 1.08, rows),
                    rng.uniform(0.92, 1.08, rows))
    table = compare.compare(BASELINE, noisy)
    assert set(zip(table["workload"], table["framework"])) == GROUPS and len(table) == len(GROUPS)
    assert set(table["verdict"]) <= {"ok", "improvement"}, table
    assert table["convergence"].str.startswith("same (").all()
    assert table.attrs["tests"] == len(GROUPS)                 # speed per group, nothing else
    assert cli.main(["compare", BASELINE, noisy, "--require-all"]) == 0


@pytest.mark.parametrize("workload", WORKLOADS)
def test_gate_on_the_committed_baseline_planted_regressions_fail(tmp_path, workload):
  """One workload's JAX runs each 40% slower (every step: throughput and time to train), or its
  TF runs' seed 102 one eval interval later to target: that group fails the gate, with the
  seed named, and every other group passes."""
  frame = results.read_csv(BASELINE)
  mine = (frame["workload"] == workload).to_numpy()
  jax_rows = mine & (frame["framework"] == "jax").to_numpy()
  tf_rows = mine & (frame["framework"] == "tf").to_numpy()
  slow = _scaled(tmp_path, "slow.csv", np.where(jax_rows, 1 / 0.6, 1.0),
                 np.where(jax_rows, 0.6, 1.0))
  table = compare.compare(BASELINE, slow).set_index(["workload", "framework"])
  assert table.loc[(workload, "jax"), "verdict"] == \
      "regression (throughput, time-to-train speed)"
  assert table.loc[(workload, "jax"), "throughput_hi"] < 1          # its interval excludes 1
  assert set(table.drop(index=(workload, "jax"))["verdict"]) <= {"ok", "improvement"}, table
  assert cli.main(["compare", BASELINE, slow]) == 1
  later = frame.copy()
  row = np.nonzero(tf_rows & (frame["seed"] == 102).to_numpy())[0][0]
  values = np.unique(frame.loc[tf_rows, "samples_to_converge"])   # one eval interval:
  interval = np.diff(values).min() if len(values) > 1 else values[0] // 3   # or 1 of 3 epochs
  before = later.loc[row, "samples_to_converge"]
  later.loc[row, "samples_to_converge"] = before + interval
  path = str(tmp_path / "later.csv")
  later[results.COLUMNS].to_csv(path, index=False)
  table = compare.compare(BASELINE, path).set_index(["workload", "framework"])
  assert table.loc[(workload, "tf"), "verdict"] == \
      f"convergence changed (seed 102: {before:g} -> {before + interval:g})"
  assert set(table.drop(index=(workload, "tf"))["verdict"]) == {"ok"}, table
  assert cli.main(["compare", BASELINE, path]) == 1


def test_convergence_only_ignores_speed_and_still_fails_a_changed_seed(tmp_path):
  """Two machines' CSVs (the CI's runs against the committed baseline): every run 40% slower
  passes with --convergence-only (no speed test in the family), one seed one eval later still
  fails, named."""
  frame = results.read_csv(BASELINE)
  slow = _scaled(tmp_path, "slow.csv", 1 / 0.6, 0.6)
  assert cli.main(["compare", BASELINE, slow]) == 1
  table = compare.compare(BASELINE, slow, speed=False)
  assert set(table["verdict"]) == {"ok"} and table.attrs["tests"] == 0
  assert table["p_speed_adj"].isna().all() and table["detectable_loss"].isna().all()
  assert (table["throughput_ratio"] < 0.7).all()                # printed, not gated
  assert cli.main(["compare", BASELINE, slow, "--convergence-only", "--require-all"]) == 0
  later = frame.copy()
  row = np.nonzero(((frame["workload"] == "dlrm") & (frame["framework"] == "jax")
                    & (frame["seed"] == 101)).to_numpy())[0][0]
  later.loc[row, "samples_to_converge"] += 1
  later["throughput"] *= 0.6
  path = str(tmp_path / "later.csv")
  later[results.COLUMNS].to_csv(path, index=False)
  table = compare.compare(BASELINE, path, speed=False).set_index(["workload", "framework"])
  assert table.loc[("dlrm", "jax"), "verdict"].startswith("convergence changed (seed 101: ")
  assert set(table.drop(index=("dlrm", "jax"))["verdict"]) == {"ok"}
  assert cli.main(["compare", BASELINE, path, "--convergence-only"]) == 1


def _ci_commands(script, tmp_path, command, env=None):
  """The `python run_benchmark.py COMMAND ...` calls a workflow step's bash script makes: it
  runs here with `python` a shim that records them (argv after the script) and hands every
  other call to this interpreter."""
  import json
  import subprocess
  import sys
  shim, record = tmp_path / "bin", tmp_path / "commands.jsonl"
  shim.mkdir(exist_ok=True)
  (shim / "python").write_text(
      f"#!{sys.executable}\n"
      "import json, os, sys\n"
      "args = sys.argv[1:]\n"
      f"if args[:2] == ['run_benchmark.py', {command!r}]:\n"
      f"  open({str(record)!r}, 'a').write(json.dumps(args[1:]) + '\\n')\n"
      "  sys.exit(0)\n"
      f"os.execv({sys.executable!r}, [{sys.executable!r}] + args)\n")
  (shim / "python").chmod(0o755)
  if record.exists():
    record.unlink()
  env = dict(os.environ, PATH=f"{shim}{os.pathsep}{os.environ['PATH']}", **(env or {}))
  proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=ROOT, env=env,
                        capture_output=True, text=True)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def test_the_documented_ci_workflow_runs_real_commands(tmp_path):
  """docs/ci/regression.yml: speed by `ab` against the baseline commit (its step executed as
  GitHub runs it, bash -e -o pipefail, the command recorded): every registered workload in both
  frameworks, 6 rounds a side from seed 100 (the fewest that can reject among 14 groups: 1/924
  <= 0.05/14), --require-all, the REF of the event or, without one (a new branch: zeros),
  HEAD~1; convergence by compare --convergence-only of the A/B's new rows against the committed
  baseline, whose every group holds those seeds; change points and the report over the
  history. Every run_benchmark.py command parses, and no gating step may continue on error."""
  import subprocess
  with open(WORKFLOW) as f:
    workflow = yaml.safe_load(f)
  steps = workflow["jobs"]["regression"]["steps"]
  literal = [shlex.split(line.strip())[2:] for step in steps
             for line in step.get("run", "").splitlines()
             if line.strip().startswith("python run_benchmark.py") and "$" not in line]
  ab_steps = [s for s in steps if "run_benchmark.py ab " in s.get("run", "")]
  assert len(ab_steps) == 1 and "REF" in ab_steps[0]["env"]
  head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                        text=True).stdout.strip()
  refs = {"": "HEAD~1", "0" * 40: "HEAD~1"}
  if head:
    refs[head] = head
  parser = cli.build_parser()
  for given, used in refs.items():
    made = _ci_commands(ab_steps[0]["run"], tmp_path, "ab", {"REF": given})
    assert len(made) == 1 and made[0][1] == used, (given, made)
  ab_args = parser.parse_args(made[0])
  groups, rounds, _ = cli.ab_groups(ab_args)
  least = compare.runs_to_test(len(GROUPS))
  assert sorted(groups) == sorted(GROUPS) and set(rounds.values()) == {least}
  assert compare._u_counts(least, least).sum() == math.comb(2 * least, least) >= \
      len(GROUPS) / 0.05
  assert ab_args.seed == 100 and ab_args.require_all and ab_args.out == "results/ab"
  commands = literal + made
  assert {c[0] for c in commands} == {"ab", "compare", "changepoints", "report"}
  for command in commands:
    try:
      parser.parse_args(command)
    except UsageError as e:
      pytest.fail(f"{command}: {e}")
  (gate,) = [parser.parse_args(c) for c in commands if c[0] == "compare"]
  assert os.path.join(ROOT, gate.baseline) == BASELINE and gate.new == "results/ab/new.csv"
  assert gate.convergence_only and gate.require_all
  seeds = results.read_csv(BASELINE).groupby(["workload", "framework"])["seed"].apply(set)
  assert all(set(range(100, 100 + least)) <= seeds[g] for g in GROUPS)   # the A/B's seeds
  (history,) = [parser.parse_args(c) for c in commands if c[0] == "changepoints"]
  assert history.csvs == ["pages/history.csv", "results/ab/new.csv"]
  (report,) = [parser.parse_args(c) for c in commands if c[0] == "report"]
  assert report.baseline == "results/ab/base.csv" and report.csvs == history.csvs
  gating = [s for s in steps if "run_benchmark.py ab " in s.get("run", "")
            or "run_benchmark.py compare " in s.get("run", "")]
  assert len(gating) == 2 and not any(s.get("continue-on-error") for s in gating)
  assert "if" not in ab_steps[0]


def test_runs_to_test_is_the_fewest_whose_smallest_p_reaches_holm_s_first_level():
  """By hand: the exact one-sided test of n runs against n has smallest p 1 / C(2n, n); it must
  be <= alpha / groups."""
  assert [compare.runs_to_test(g) for g in (1, 2, 12, 13, 14, 46, 47)] == [3, 4, 5, 6, 6, 6, 7]
  assert 1 / 252 <= 0.05 / 12 and 0.05 / 13 < 1 / 252     # 5 a side: C(10, 5) = 252
  assert 1 / 924 <= 0.05 / 46 and 0.05 / 47 < 1 / 924     # 6 a side: C(12, 6) = 924
