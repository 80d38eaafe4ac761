"""The harness on one accelerator against its bare step and the best public per-GPU figures
(issue 53): one command for a GPU box.

For each workload, in this process tree and one after the other (one device):
  1. the harness's own run: `run_benchmark.py run W --framework jax --preset synthetic`, i.e.
     the driver, the workload's JAX trainer with its recipe's optimizer (LARS, LAMB, RMSProp +
     EMA, Adam), the compliance log and the result row, at the reference model shapes in the
     preset's precision (bf16), a fixed number of steps; its row gives samples/s and MFU;
  2. the bare step at the same per-device batch: `bench/gpu_models.py` (model, loss and plain
     optax, jit, one batch reused);
then one table: samples/s and MFU of each, harness / bare (goal >= 0.95), the MFU goal and the
public anchor (each workload's bare_step.ANCHOR: MLPerf Training results and NVIDIA's DeepLearningExamples, model
FLOPs counted as `describe` counts them, against the bf16 peak), and the harness's MFU over the
anchor's.

  python bench/gpu_harness.py [--workloads resnet50,bert,transformer,ssd,efficientnet]
      [--steps 30] [--batch resnet50=256,bert=32] [--preset synthetic] [--set KEY=VALUE ...]
      [--out bench_gpu_harness.csv] [--timeout 300] [--profile FILE]
      [--variant bert:data.packing=true ...]

On an image without the harness's pure-Python needs (mlperf-logging, PyYAML), run
`bash bench/gpu_deps.sh` where PyPI is reachable and put `.gpu_deps/cpXY` on PYTHONPATH; the
subprocesses inherit the environment. `--preset tiny --set data.source=synthetic` runs the same
commands at toy shapes on a CPU (tests/bench/test_gpu_harness.py). A command that fails (out
of memory: lower its --batch) prints its last lines and leaves its cells blank; the exit status
is then 1.
"""
import argparse
import csv
import math
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench import gpu_models  # noqa: E402  pylint: disable=wrong-import-position

# workload -> (MFU goal of issue 53, the anchor's MFU, its source), per GPU: each workload's
# bare_step.ANCHOR (workloads/<w>/bare_step.py).
ANCHORS = {name: (m.ANCHOR.mfu_goal, m.ANCHOR.mfu, m.ANCHOR.source)
           for name, m in gpu_models.BARE_STEPS.items()}
COLUMNS = ("workload", "device_kind", "batch", "harness_samples_per_s", "harness_mfu",
           "bare_samples_per_s", "bare_mfu", "harness_over_bare", "mfu_goal", "anchor_mfu",
           "mfu_over_anchor")
HARNESS_GOAL = 0.95


def run(command, timeout):
  """(ok, its output) of a command run from the repository root."""
  try:
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    return False, f"timed out after {timeout} s"
  return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def last_lines(text, n=6):
  """The last `n` lines of a command's output, without XLA's autotuning timer warnings."""
  return "\n".join([line for line in text.splitlines() if "cuda_timer.cc" not in line][-n:])


def read_row(path):
  with open(path, newline="") as f:
    rows = list(csv.DictReader(f))
  return rows[-1] if rows else {}


def number(text):
  """A cell's float; None where it is blank, not a number or NaN (nothing measured)."""
  try:
    value = float(text)
  except (TypeError, ValueError):
    return None
  return None if math.isnan(value) else value


def harness_run(name, batch, args, folder, extra=()):
  """The harness's synthetic run of `name` at per-device `batch` (with the `extra` overrides
  of a --variant): its result row (one device)."""
  results = os.path.join(folder, f"{name}_{len(extra)}_{abs(hash(extra))}_rows.csv")
  command = [sys.executable, "run_benchmark.py", "run", name, "--framework", "jax",
             "--preset", args.preset, "--steps", str(args.steps), "--seed", "0",
             "--set", f"train.global_batch_size={batch}", "--results", results,
             "--log-dir", os.path.join(folder, "logs")]
  for item in (*args.set, *extra):
    command += ["--set", item]
  ok, output = run(command, args.timeout)
  row = read_row(results) if ok and os.path.exists(results) else {}
  if not ok or row.get("status") != "success":
    print(f"  {name}: the harness run failed:\n    " + last_lines(output).replace("\n", "\n    "),
          flush=True)
    return None
  print("    " + "\n    ".join(line for line in output.splitlines() if "steps |" in line),
        flush=True)
  return row


def bare_step(name, batch, args, folder):
  """bench/gpu_models.py's bare step of `name` at `batch`: its table row."""
  out = os.path.join(folder, f"{name}_bare.csv")
  command = [sys.executable, os.path.join("bench", "gpu_models.py"), "--workloads", name,
             "--steps", str(args.steps), "--batch", f"{name}={batch}", "--preset", args.preset,
             "--out", out]
  for item in args.set:
    command += ["--set", item]
  if args.profile:
    command += ["--profile", args.profile]
  ok, output = run(command, args.timeout)
  if not ok or not os.path.exists(out):
    print(f"  {name}: the bare step failed:\n    " + last_lines(output).replace("\n", "\n    "),
          flush=True)
    return None
  print("    " + "\n    ".join(line for line in output.splitlines() if " params; " in line),
        flush=True)
  return read_row(out)


def ratio(a, b):
  return a / b if a is not None and b else None


def compare(name, batch, harness, bare, label=None):
  """One table row from a harness result row and a bare-step row (either may be None);
  `label`: the row's name where it is a variant of workload `name`."""
  goal, anchor, _ = ANCHORS.get(name, (None, None, ""))
  h_speed = number((harness or {}).get("throughput"))
  h_mfu = number((harness or {}).get("mfu"))
  b_speed = number((bare or {}).get("samples_per_s"))
  return {"workload": label or name, "device_kind": (harness or {}).get("device_kind", ""),
          "batch": batch, "harness_samples_per_s": h_speed, "harness_mfu": h_mfu,
          "bare_samples_per_s": b_speed, "bare_mfu": number((bare or {}).get("mfu")),
          "harness_over_bare": ratio(h_speed, b_speed), "mfu_goal": goal,
          "anchor_mfu": anchor, "mfu_over_anchor": ratio(h_mfu, anchor),
          "bare_loss": (bare or {}).get("loss", "")}


def verdicts(row):
  """'' or the goals a row misses (or could not measure), in words."""
  missed = [f"{what} not measured" for what, key in (("harness/bare", "harness_over_bare"),
                                                     ("MFU", "harness_mfu"))
            if row[key] is None and (key != "harness_mfu" or row["mfu_goal"])]
  if row.get("bare_loss", "") not in ("", None) and not math.isfinite(float(row["bare_loss"])):
    missed.append(f"the bare step's loss is {row['bare_loss']}")
  if row["harness_over_bare"] is not None and row["harness_over_bare"] < HARNESS_GOAL:
    missed.append(f"harness/bare {row['harness_over_bare']:.2f} < {HARNESS_GOAL}")
  if row["harness_mfu"] is not None and row["mfu_goal"] and row["harness_mfu"] < row["mfu_goal"]:
    missed.append(f"MFU {row['harness_mfu']:.3f} < {row['mfu_goal']}")
  return "; ".join(missed)


DIGITS = {"harness_samples_per_s": 1, "bare_samples_per_s": 1, "harness_mfu": 3,
          "bare_mfu": 3, "harness_over_bare": 3, "mfu_goal": 2, "anchor_mfu": 3,
          "mfu_over_anchor": 2}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workloads", default=",".join(gpu_models.WORKLOADS),
                      help="comma list of " + ", ".join(gpu_models.WORKLOADS))
  parser.add_argument("--steps", type=int, default=30, help="timed steps of each run")
  parser.add_argument("--batch", default="", help="per-device batches, name=N pairs (defaults: "
                      "bench/gpu_models.py's, which fit an 80 GB GPU in bf16)")
  parser.add_argument("--preset", default="synthetic",
                      help="the harness run's preset (default synthetic: the reference model "
                           "on synthetic batches); the bare step steps the same preset's model")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="config overrides for both runs (run_benchmark.py's --set)")
  parser.add_argument("--out", default="bench_gpu_harness.csv", help="CSV of the table")
  parser.add_argument("--timeout", type=int, default=300, help="seconds a command may take")
  parser.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                      help="an extra harness run of workload NAME with these overrides, a row "
                           "of its own against NAME's bare step (e.g. bert:data.packing=true: "
                           "packed rows against the unpacked bare step)")
  parser.add_argument("--profile", default="", metavar="FILE",
                      help="the bare steps' trace summaries, appended to FILE "
                           "(bench/gpu_models.py --profile)")
  args = parser.parse_args(argv)
  names = [n.strip() for n in args.workloads.split(",") if n.strip()]
  unknown = [n for n in names if n not in gpu_models.WORKLOADS]
  if unknown or not names:
    print(f"--workloads {args.workloads!r}: allowed a comma list of "
          f"{', '.join(gpu_models.WORKLOADS)}", file=sys.stderr)
    return 2
  if args.steps < 1 or args.timeout < 1:
    print(f"--steps {args.steps} / --timeout {args.timeout}: allowed positive integers",
          file=sys.stderr)
    return 2
  try:
    batches = gpu_models.parse_batches(args.batch)
  except SystemExit as e:
    print(e, file=sys.stderr)
    return 2

  variants = {}
  for text in args.variant:
    name, _, sets = text.partition(":")
    if name not in names or "=" not in sets:
      print(f"--variant {text!r}: allowed NAME:KEY=VALUE[,KEY=VALUE] with NAME one of "
            f"{', '.join(names)}", file=sys.stderr)
      return 2
    variants.setdefault(name, []).append(tuple(sets.split(",")))

  rows, failed = [], []

  def add(row):
    rows.append(row)
    gpu_models.write_csv(args.out, rows, COLUMNS)     # row by row: a cut run keeps them
    print(f"  {row['workload']}: " + ", ".join(
        f"{c} {gpu_models.fmt(row[c], DIGITS.get(c, 0))}" for c in COLUMNS[3:8]), flush=True)
    if row["harness_samples_per_s"] is None or row["bare_samples_per_s"] is None:
      failed.append(row["workload"])

  with tempfile.TemporaryDirectory(prefix="gpu-harness-") as folder:
    for name in names:
      print(f"{name}: harness run, then bare step, per-device batch {batches[name]}", flush=True)
      harness = harness_run(name, batches[name], args, folder)
      bare = bare_step(name, batches[name], args, folder)
      add(compare(name, batches[name], harness, bare))
      for extra in variants.get(name, ()):
        label = f"{name}[{','.join(extra)}]"
        print(f"{label}: harness run", flush=True)
        add(compare(name, batches[name], harness_run(name, batches[name], args, folder, extra),
                    bare, label))

  print()
  cells = [COLUMNS] + [tuple(gpu_models.fmt(r[c], DIGITS.get(c, 0)) if r[c] != "" else "n/a"
                             for c in COLUMNS) for r in rows]
  widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
  for i, cell_row in enumerate(cells):
    print("  ".join(c.ljust(w) if j < 2 else c.rjust(w)
                    for j, (c, w) in enumerate(zip(cell_row, widths))))
    if i == 0:
      print("  ".join("-" * w for w in widths))
  print()
  for r in rows:
    missed = verdicts(r)
    print(f"{r['workload']}: " + (f"missed: {missed}" if missed else "goals met")
          + f" (anchor: {ANCHORS[r['workload'].split('[')[0]][2]})")
  gpu_models.write_csv(args.out, rows, COLUMNS)
  print(f"\nwrote {args.out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
