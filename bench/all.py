"""Every workload's peer comparison in one command: one table and one CSV.

  python bench/all.py [--repeats 3] [--frameworks tf,jax] [--workloads resnet50,bert,...]
                      [--out bench_all.csv] [--gpu auto|yes|no]

For each workload it runs that bench script's comparison (bench/<model>_vs_<peer>.py, found by
that name, each naming its WORKLOAD; at the script's SMALL size: about 15 minutes for all five
on 2 CPU cores with --repeats 3): ours and the peer on TF and on JAX, each side one kept-alive
process, interleaved rounds, the ratio's median with its min-max, model FLOPs per sample of
each side (TF's graph profiler of one train step) and the ratio of model-FLOP rates, and ours
on TF against ours on JAX (framework 'tf/jax'). It prints the table, writes the rows as CSV
(bench/method.COLUMNS), and `run_benchmark.py report --bench FILE` draws them.

With a GPU (--gpu auto: when JAX sees one), it also runs bench/gpu_models.py: each model's
synthetic step at the reference shapes in bfloat16, added as rows of framework 'gpu-jax' with
samples/s, GFLOP per sample and MFU (no peer). Needs the bench extras for the keras-hub peers:
pip install --no-deps -r bench/requirements.txt
"""
import argparse
import csv
import glob
import importlib
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import method  # noqa: E402  pylint: disable=wrong-import-position
from harness import registry  # noqa: E402  pylint: disable=wrong-import-position


def find_benches() -> dict:
  """workload -> its bench script (module under bench/): every bench/<model>_vs_<peer>.py names
  the workload it times (`WORKLOAD`, a registered name); in the registry's order."""
  found = {}
  for path in sorted(glob.glob(os.path.join(ROOT, "bench", "*_vs_*.py"))):
    stem = os.path.basename(path)[:-3]
    workload = importlib.import_module(f"bench.{stem}").WORKLOAD   # imports bench.method only
    if workload not in registry.names() or workload in found:
      raise SystemExit(f"bench/{stem}.py: WORKLOAD {workload!r} is " + (
          f"also bench/{found[workload]}.py's" if workload in found else
          f"not a registered workload ({', '.join(registry.names())})"))
    found[workload] = stem
  return {w: found[w] for w in registry.names() if w in found}


BENCHES = find_benches()


def parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  method.add_repeats_arg(p, default=3)
  p.add_argument("--frameworks", default="tf,jax", help="comma-separated, of tf and jax")
  p.add_argument("--workloads", default=",".join(BENCHES),
                 help=f"comma-separated, of {', '.join(BENCHES)} (default all)")
  p.add_argument("--out", default="bench_all.csv", help="the CSV written (default bench_all.csv)")
  p.add_argument("--gpu", choices=["auto", "yes", "no"], default="auto",
                 help="also time the reference-shape bf16 steps on a GPU (default: if present)")
  args = p.parse_args(argv)
  workloads = args.workloads.split(",")
  bad = [w for w in workloads if w not in BENCHES]
  if bad or not workloads:
    p.error(f"--workloads {args.workloads}: allowed: a comma-separated list of "
            f"{', '.join(BENCHES)}")
  if args.repeats < 1:
    p.error(f"--repeats {args.repeats}: allowed: an integer >= 1")
  args.workloads = workloads
  return args


def gpu_present() -> bool:
  """Whether JAX sees a GPU (asked in a child process: this one imports no framework)."""
  code = "import jax; print(any(d.platform == 'gpu' for d in jax.devices()))"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
  return out.stdout.strip().endswith("True")


def gpu_rows(workloads) -> list:
  """bench/gpu_models.py's rows (bf16, reference shapes) in the table's columns, for the
  workloads whose folder has a bare step (workloads/<w>/bare_step.py; it imports JAX, so it is
  found, not imported)."""
  script = os.path.join(ROOT, "bench", "gpu_models.py")
  workloads = [w for w in workloads if registry.get(w).own_module("bare_step")]
  if not workloads:
    return []
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "gpu.csv")
    subprocess.run([sys.executable, script, "--workloads", ",".join(workloads), "--out", out],
                   check=False)
    if not os.path.exists(out):
      raise SystemExit("bench/gpu_models.py wrote no table")
    with open(out) as f:
      return [from_gpu_row(r) for r in csv.DictReader(f)]


def from_gpu_row(r) -> dict:
  number = lambda k: float(r[k]) if r.get(k) not in (None, "") else None   # noqa: E731
  row = dict.fromkeys(method.COLUMNS)
  row.update(workload=r["workload"], framework="gpu-jax",
             ours_samples_per_s=number("samples_per_s"),
             ours_gflop_per_sample=number("gflop_per_sample"), mfu=number("mfu"))
  return row


def write_csv(rows, path):
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=method.COLUMNS)
    writer.writeheader()
    for r in rows:
      writer.writerow({k: "" if r.get(k) is None else r[k] for k in method.COLUMNS})


def main(argv=None):
  args = parse(argv)
  start, rows = time.perf_counter(), []
  for workload in args.workloads:
    bench = importlib.import_module(f"bench.{BENCHES[workload]}")
    script = os.path.join(ROOT, "bench", BENCHES[workload] + ".py")
    wargs = method.bench_args(bench, bench.SMALL + [f"--repeats={args.repeats}",
                                                    f"--frameworks={args.frameworks}"],
                              worker=False)
    print(f"{workload}: {bench.title(wargs)}", flush=True)
    rows += method.compare(bench, script, wargs)
  if args.gpu == "yes" or (args.gpu == "auto" and gpu_present()):
    rows += gpu_rows(args.workloads)
  print(method.table(rows))
  write_csv(rows, args.out)
  print(f"{len(rows)} rows written to {args.out} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
  main()
