"""Does every mini preset reach its target on every seed? Each workload's mini preset in each
framework run on N seeds (and any layouts given), then, per group, how many runs reached the
target and with how much room: the epochs each seed needed against the preset's budget, and
how far above the target its curve ended.

  python bench/mini_seeds.py --out /tmp/seeds --seeds 10 --first-seed 7000
  python bench/mini_seeds.py --out /tmp/seeds --seeds 5 --first-seed 7000 --no-defaults \
      --layout jax:dlrm:4:data=2,model=2 --layout tf:ssd:2:data=1,spatial=2
  python bench/mini_seeds.py --out /tmp/seeds --summary-only

Every group runs in one process (`run --runs N --seed S`: seeds S..S+N-1), one group at a time,
appending to OUT/seeds.csv (logs in OUT/logs); a group already there (same workload, framework
and mesh) is skipped, so an interrupted sweep resumes. A layout is FRAMEWORK:WORKLOAD:DEVICES:
MESH[:KEY=VALUE;...] (the last part: `--set` overrides, e.g. parallel.microbatches=4).
The summary reads the rows and each run's MLPerf log (its eval_accuracy events).
"""
import argparse
import os
import subprocess
import sys
import time

import pandas as pd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from harness import registry  # noqa: E402  pylint: disable=wrong-import-position
from harness.run_logs import eval_curve  # noqa: E402  pylint: disable=wrong-import-position


def parse_layout(text):
  parts = text.split(":")
  if len(parts) not in (4, 5) or not parts[2].isdigit():
    raise SystemExit(f"--layout {text!r}: allowed: FRAMEWORK:WORKLOAD:DEVICES:MESH[:KEY=VALUE;...]")
  framework, workload, devices, mesh = parts[:4]
  if workload not in registry.names():
    raise SystemExit(f"--layout {text!r}: workload {workload!r}; allowed: {registry.names()}")
  if framework not in registry.get(workload).frameworks:
    raise SystemExit(f"--layout {text!r}: framework {framework!r}; allowed: "
                     f"{registry.get(workload).frameworks}")
  sets = [s for s in parts[4].split(";") if s] if len(parts) == 5 else []
  return framework, workload, int(devices), mesh, sets


def groups(args):
  """(framework, workload, devices, mesh or None, sets) for every group to run."""
  out = []
  if not args.no_defaults:
    for name in registry.names():
      for framework in registry.get(name).frameworks:
        out.append((framework, name, 0, None, []))
  return out + [parse_layout(text) for text in args.layout]


def done(csv_path):
  if not os.path.exists(csv_path):
    return set()
  rows = pd.read_csv(csv_path)
  return set(zip(rows["workload"], rows["framework"], rows["mesh"]))


def run_group(group, args, csv_path, log_dir):
  framework, workload, devices, mesh, sets = group
  cmd = [sys.executable, os.path.join(ROOT, "run_benchmark.py"), "run", workload,
         "--framework", framework, "--preset", "mini", "--runs", str(args.seeds),
         "--seed", str(args.first_seed), "--results", csv_path, "--log-dir", log_dir]
  if mesh:
    cmd += ["--cpu-devices", str(devices), "--mesh", mesh]
  for s in sets:
    cmd += ["--set", s]
  start = time.time()
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
  print(f"{framework} {workload} {mesh or ''} {' '.join(sets)}: exit {proc.returncode}, "
        f"{time.time() - start:.0f} s", flush=True)
  if proc.returncode not in (0, 1):     # 1: a run missed its target (recorded as aborted)
    print(proc.stderr[-2000:], flush=True)


def summary(csv_path):
  rows = pd.read_csv(csv_path)
  out = []
  for (workload, framework, mesh), g in rows.groupby(["workload", "framework", "mesh"], sort=True):
    train = registry.get(workload).configure("mini").train
    # the budget the run is stopped by: samples where the preset counts them (MLPerf BERT)
    need, budget = (("samples_to_converge", train.max_samples) if train.max_samples else
                    ("epochs_to_converge", train.max_epochs))
    ok = g[g["status"] == "success"]
    curves = [eval_curve(p) for p in g["log_path"]]
    best = [max(v for _, v in c) if c else float("nan") for c in curves]
    target = float(g["target"].iloc[0])
    out.append({
        "workload": workload, "framework": framework, "mesh": mesh,
        "seeds": f"{int(g['seed'].min())}-{int(g['seed'].max())}",
        "reached": f"{len(ok)}/{len(g)}",
        "target": target,
        "needed": need.split("_")[0],
        "min/med/max": (f"{ok[need].min():g}/{ok[need].median():g}/{ok[need].max():g}"
                        if len(ok) else "-"),
        "budget": f"{budget:g}",
        "room": round(budget / ok[need].max(), 2) if len(ok) else float("nan"),
        "end metric min": round(min(best), 4),
        "evals min": min(len(c) for c in curves),
    })
  return pd.DataFrame(out)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="folder for seeds.csv and the logs")
  parser.add_argument("--seeds", type=int, default=10, help="runs per group (default 10)")
  parser.add_argument("--first-seed", type=int, default=7000)
  parser.add_argument("--layout", action="append", default=[],
                      help="FRAMEWORK:WORKLOAD:DEVICES:MESH[:KEY=VALUE;...] (repeatable)")
  parser.add_argument("--no-defaults", action="store_true",
                      help="only the --layout groups, not every workload's mini on one device")
  parser.add_argument("--summary-only", action="store_true")
  args = parser.parse_args()
  if args.seeds < 1:
    raise SystemExit(f"--seeds {args.seeds}: allowed: an integer >= 1")
  os.makedirs(args.out, exist_ok=True)
  csv_path = os.path.join(args.out, "seeds.csv")
  if not args.summary_only:
    for group in groups(args):
      framework, workload, devices, mesh, _ = group
      if (workload, framework, mesh or "data=1") in done(csv_path):
        print(f"{framework} {workload} {mesh or ''}: already in {csv_path}", flush=True)
        continue
      run_group(group, args, csv_path, os.path.join(args.out, "logs"))
  with pd.option_context("display.width", 200, "display.max_columns", 20):
    print(summary(csv_path).to_string(index=False))


if __name__ == "__main__":
  main()
