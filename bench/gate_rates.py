"""The regression gate's error rates, measured on real runs' noise: how often `compare` fails
unchanged code, and how often it catches a planted loss or a changed samples-to-target.

  python bench/gate_rates.py [--csv results/baseline_cpu_mini.csv] [--trials 1000] [--seed 0]
                             [--threshold 0.03] [--alpha 0.05]

From the groups (workload, framework, preset) of the CSV with at least 10 successful runs, each
trial splits every group at random into two halves of 5 runs, base and new, and runs the gate
on them, in two modes:
- different seeds: the halves as they are (their seeds differ, so convergence is compared the
  RCP way, statistically);
- same seeds: the new half takes the base half's seeds and samples to target (with fixed seeds
  they are deterministic) with its own runs' speeds (the CI's case: it runs the baseline's
  seeds; the noise is the other half's).
Nothing changed: the false-alarm rate is the share of trials where any group fails. Planted, in
one group at a time (the rate averaged over the groups, with its range): a throughput loss of
5, 10 and 20% (throughput x (1-L), the time to train longer by the training time it adds); a
changed samples-to-target (every new run of the group one eval interval longer in the
different-seeds mode, one seed's run in the same-seeds mode; the interval is the smallest step
between the group's samples-to-target values, or one epoch where they are all equal). The old
gate (harness/compare.py at OLD_REF, the last commit of the noise rule, or --old-ref) gets
the same trials at the thresholds given by --old-thresholds.
"""
import argparse
import dataclasses
import os
import subprocess
import sys
import types

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from harness import compare, results  # noqa: E402  pylint: disable=wrong-import-position

LOSSES = (0.05, 0.10, 0.20)
HALF = 5
OLD_REF = "5c2432a3df2264282971e9cf21c5132f09f85d41"   # the old gate: median ratio beyond the noise


@dataclasses.dataclass
class Runs:
  """One group's successful runs (arrays, one entry per run)."""
  name: str
  seeds: np.ndarray
  throughput: np.ndarray
  ttt_s: np.ndarray
  samples: np.ndarray

  def interval(self) -> float:
    steps = np.diff(np.unique(self.samples))
    if len(steps):
      return float(steps.min())
    return float(self.samples[0]) / 3       # all equal: a third of it, about one epoch of mini


def load_groups(path: str, min_runs: int = 2 * HALF) -> list:
  frame = results.read_csv(path)
  frame = frame[frame["status"] == "success"]
  groups = []
  for key, rows in frame.groupby(compare.KEYS):
    if len(rows) >= min_runs:
      groups.append(Runs("/".join(map(str, key)), rows["seed"].to_numpy(float),
                         rows["throughput"].to_numpy(float), rows["time_to_train_s"].to_numpy(float),
                         rows["samples_to_converge"].to_numpy(float)))
  return groups


def _side(seeds, throughput, ttt_s, samples) -> compare.Side:
  return compare.Side(runs=len(seeds), seeds=np.asarray(seeds, float),
                      throughput=np.asarray(throughput, float), ttt_s=np.asarray(ttt_s, float),
                      samples=np.asarray(samples, float))


def split(runs: Runs, rng, same_seeds: bool):
  """(base, new) as arrays dicts: two random halves; in the same-seeds mode the new half runs
  the base half's seeds (their samples to target) at its own speeds."""
  order = rng.permutation(len(runs.seeds))
  a, b = order[:HALF], order[HALF:2 * HALF]
  base = dict(seeds=runs.seeds[a], throughput=runs.throughput[a], ttt_s=runs.ttt_s[a],
              samples=runs.samples[a])
  if same_seeds:
    speed_b = runs.samples[b] / runs.ttt_s[b]           # time-to-train speed of the other half
    new = dict(seeds=runs.seeds[a], throughput=runs.throughput[b],
               ttt_s=runs.samples[a] / speed_b, samples=runs.samples[a])
  else:
    new = dict(seeds=runs.seeds[b], throughput=runs.throughput[b], ttt_s=runs.ttt_s[b],
               samples=runs.samples[b])
  return base, new


def plant_loss(new: dict, loss: float) -> dict:
  """Every step (1-loss) as fast: the throughput falls by `loss`, and the time to train grows
  by the training time it adds (its evals are not slower)."""
  train_s = new["samples"] / new["throughput"]
  return dict(new, throughput=new["throughput"] * (1 - loss),
              ttt_s=new["ttt_s"] + train_s * (1 / (1 - loss) - 1))


def plant_convergence(new: dict, interval: float, same_seeds: bool) -> dict:
  """One eval interval more to reach the target, at the run's own speed: for every run (other
  seeds: a shift of the mean), or for one seed's run (same seeds: one run's numerics)."""
  extra = np.full(len(new["samples"]), interval)
  if same_seeds:
    extra[1:] = 0
  speed = new["samples"] / new["ttt_s"]
  samples = new["samples"] + extra
  return dict(new, samples=samples, ttt_s=samples / speed)


# ------------------------------------------------------------------------------------ gates

def new_gate(threshold: float, alpha: float):
  """The gate of harness/compare.py: (base dicts, new dicts) -> which groups fail (the CI's
  --require-all: "too few runs" fails too)."""
  failing = compare.FAILING + ("too few runs",)

  def figures(base, new):
    return compare.group_figures(_side(**base), _side(**new), alpha)

  def decide(groups):
    rows = compare.decide(groups, threshold, alpha, detectable=False)
    return [row["verdict"].startswith(failing) for row in rows]
  return figures, decide


def load_old(ref: str) -> types.ModuleType:
  """harness/compare.py as it was at `ref` (read with git show; nothing is checked out)."""
  source = subprocess.run(["git", "show", f"{ref}:harness/compare.py"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout
  module = types.ModuleType("old_compare")
  exec(compile(source, f"{ref}:harness/compare.py", "exec"), module.__dict__)  # pylint: disable=exec-used
  return module


def old_gate(old, threshold: float):
  """The old gate's own verdict (its _verdict) on the figures its _side computes (medians and
  half the max-min spread over the median), from arrays: the same numbers, without a CSV."""
  def stats(side):
    out = {}
    for name, values in (("ttt", side["ttt_s"]), ("tp", side["throughput"])):
      median = float(np.median(values))
      out[name] = median
      out[name + "_noise"] = (values.max() - values.min()) / median / 2
    return out

  def figures(base, new):
    b, n = stats(base), stats(new)
    return {"runs_new": len(new["seeds"]), "success_base": len(base["seeds"]),
            "success_new": len(new["seeds"]), "ttt_noise_base": b["ttt_noise"],
            "ttt_noise_new": n["ttt_noise"], "tp_noise_base": b["tp_noise"],
            "tp_noise_new": n["tp_noise"], "ttt_ratio": n["ttt"] / b["ttt"],
            "throughput_ratio": n["tp"] / b["tp"]}

  def decide(groups):
    return [old._verdict(row, threshold).startswith("regression") for row in groups]
  return figures, decide


def check_old_gate_on_csvs(old, threshold, base_dicts, new_dicts, names, tmp):
  """The array path gives the old compare()'s own verdicts on the same runs written as CSVs."""
  import pandas as pd
  frames = []
  for dicts in (base_dicts, new_dicts):
    rows = []
    for name, d in zip(names, dicts):
      workload, framework, preset = name.split("/")
      for i in range(len(d["seeds"])):
        rows.append(dict(workload=workload, framework=framework, preset=preset,
                         status="success", time_to_train_s=d["ttt_s"][i],
                         throughput=d["throughput"][i], seed=d["seeds"][i],
                         samples_to_converge=d["samples"][i]))
    frames.append(pd.DataFrame(rows))
  paths = [os.path.join(tmp, f"{side}.csv") for side in ("base", "new")]
  for frame, path in zip(frames, paths):
    frame.to_csv(path, index=False)
  table = old.compare(paths[0], paths[1], threshold)
  want = dict(zip(table["workload"] + "/" + table["framework"] + "/" + table["preset"],
                  table["verdict"].str.startswith("regression")))
  figures, decide = old_gate(old, threshold)
  got = decide([figures(b, n) for b, n in zip(base_dicts, new_dicts)])
  assert [want[name] for name in names] == got, (want, got)


# ------------------------------------------------------------------------------- estimation

def estimate(groups: list, gate, trials: int, rng, same_seeds: bool, plants: bool = True):
  """Rates of one gate over `trials` random splits: {"false_alarm": share of trials where any
  group failed, ("loss", L): [per group detection], "convergence": [per group]}."""
  figures, decide = gate
  false_alarms = 0
  hits = {("loss", loss): np.zeros(len(groups)) for loss in LOSSES}
  hits["convergence"] = np.zeros(len(groups))
  for _ in range(trials):
    pairs = [split(runs, rng, same_seeds) for runs in groups]
    null = [figures(b, n) for b, n in pairs]
    false_alarms += any(decide(null))
    if not plants:
      continue
    for g, (runs, (base, new)) in enumerate(zip(groups, pairs)):
      planted = [("loss", loss, plant_loss(new, loss)) for loss in LOSSES]
      planted.append(("convergence", None,
                      plant_convergence(new, runs.interval(), same_seeds)))
      for kind, loss, changed in planted:
        family = list(null)
        family[g] = figures(base, changed)
        key = ("loss", loss) if kind == "loss" else "convergence"
        hits[key][g] += decide(family)[g]
  out = {"false_alarm": false_alarms / trials}
  if plants:
    out.update({key: value / trials for key, value in hits.items()})
  return out


def synthetic_groups(rng, n_groups: int = 8, runs: int = 2 * HALF, cv: float = 0.05):
  """A seeded noise model: per run a lognormal speed (cv), shared by its throughput and its
  time-to-train speed (the latter with its own 2% on top: evals), fixed samples per seed."""
  groups = []
  for g in range(n_groups):
    speed = np.exp(rng.normal(0, cv, runs))
    throughput = 1000.0 * speed
    samples = np.full(runs, 9000.0)
    ttt_speed = 0.9 * throughput * np.exp(rng.normal(0, 0.02, runs))
    groups.append(Runs(f"synthetic/{g}/mini", np.arange(runs, dtype=float), throughput,
                       samples / ttt_speed, samples))
  return groups


def _fmt_rates(rates, key):
  values = rates[key]
  return f"{values.mean():5.0%} ({values.min():.0%}-{values.max():.0%})"


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--csv", default=os.path.join(ROOT, "results", "baseline_cpu_mini.csv"))
  parser.add_argument("--trials", type=int, default=1000)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--threshold", type=float, default=compare.DEFAULT_THRESHOLD)
  parser.add_argument("--alpha", type=float, default=compare.DEFAULT_ALPHA)
  parser.add_argument("--old-ref", default=OLD_REF,
                      help="git revision whose harness/compare.py is the old gate")
  parser.add_argument("--old-thresholds", default="0.05,0.10")
  args = parser.parse_args(argv)
  groups = load_groups(args.csv)
  if not groups:
    parser.error(f"{args.csv}: no group with >= {2 * HALF} successful runs")
  old = load_old(args.old_ref)
  import tempfile
  with tempfile.TemporaryDirectory() as tmp:    # the old gate's array path is its own code's
    pairs = [split(runs, np.random.default_rng(args.seed), False) for runs in groups]
    for threshold in map(float, args.old_thresholds.split(",")):
      check_old_gate_on_csvs(old, threshold, [b for b, _ in pairs], [n for _, n in pairs],
                             [r.name for r in groups], tmp)
  gates = [(f"old ({args.old_ref[:7]}) --threshold {t}", old_gate(old, float(t)))
           for t in args.old_thresholds.split(",")]
  gates.append((f"new --alpha {args.alpha} --threshold {args.threshold}",
                new_gate(args.threshold, args.alpha)))
  print(f"{len(groups)} groups with >= {2 * HALF} runs in {os.path.relpath(args.csv, ROOT)}: "
        f"{', '.join(r.name for r in groups)}; {args.trials} random splits into halves of "
        f"{HALF}, seed {args.seed}")
  header = (f"{'gate':40} {'seeds':9} {'false alarm':>11}  " +
            "  ".join(f"{'loss ' + format(l, '.0%'):>17}" for l in LOSSES) +
            f"  {'samples-to-target':>17}")
  print(header)
  per_group = {}
  for name, gate in gates:
    for same_seeds in (True, False):
      rng = np.random.default_rng(args.seed)     # every gate sees the same splits
      rates = estimate(groups, gate, args.trials, rng, same_seeds)
      mode = "same" if same_seeds else "different"
      per_group[(name, mode)] = rates
      print(f"{name:40} {mode:9} {rates['false_alarm']:11.1%}  " +
            "  ".join(f"{_fmt_rates(rates, ('loss', l)):>17}" for l in LOSSES) +
            f"  {_fmt_rates(rates, 'convergence'):>17}")
  print("\nper group, detection (same seeds | different seeds):")
  print(f"{'gate':40} {'group':22} " + " ".join(f"{format(l, '.0%'):>11}" for l in LOSSES) +
        f" {'samples':>11}")
  for name, _ in gates:
    same, other = per_group[(name, "same")], per_group[(name, "different")]
    for g, runs in enumerate(groups):
      cells = [f"{same[('loss', l)][g]:4.0%} |{other[('loss', l)][g]:4.0%}" for l in LOSSES]
      cells.append(f"{same['convergence'][g]:4.0%} |{other['convergence'][g]:4.0%}")
      print(f"{name:40} {runs.name:22} " + " ".join(f"{c:>11}" for c in cells))


if __name__ == "__main__":
  main()
