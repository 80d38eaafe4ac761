"""The measuring method every bench script shares: ours and the peer interleaved.

A throughput measured once, or ours measured after the peer, picks up whatever else the machine
was doing at that moment (a ratio here once ranged 0.95-1.03 from run to run). So every script
runs R rounds; each round measures every side once, the order alternating between rounds
(forward, then reversed), and the ratio ours/peer is taken within each round, where both sides
saw the same machine. Printed: each side's median rate, and per pair the median ratio with its
min-max over the rounds. Plain Python: the sides may be in-process callables or subprocesses.
"""
import json
import statistics
import subprocess
import sys


def add_repeats_arg(parser, default=5):
  parser.add_argument("--repeats", type=int, default=default,
                      help=f"interleaved rounds of measurements (default {default})")


def interleaved(measures: dict, repeats: int, log=print) -> dict:
  """{name: [value per round]}: round r calls every measure once, forward when r is even and
  in reverse when odd, so no side always runs first (or last)."""
  if repeats < 1:
    raise ValueError(f"--repeats {repeats}: allowed: an integer >= 1")
  names = list(measures)
  values = {name: [] for name in names}
  for r in range(repeats):
    for name in (names if r % 2 == 0 else names[::-1]):
      values[name].append(float(measures[name]()))
    if log:
      log(f"  round {r + 1}/{repeats}: " + ", ".join(f"{n} {values[n][-1]:.4g}" for n in names))
  return values


def ratios(values: dict, ours: str, peer: str) -> list:
  """ours / peer within each round."""
  return [a / b for a, b in zip(values[ours], values[peer])]


def summary(rs) -> tuple:
  """(median, min, max) of per-round ratios."""
  return statistics.median(rs), min(rs), max(rs)


def ratio_line(label: str, rs) -> str:
  median, low, high = summary(rs)
  return (f"ratio {label}: median {median:.3f} [min {low:.3f}, max {high:.3f}] over "
          f"{len(rs)} interleaved rounds")


def report(values: dict, pairs, unit="samples/s", out=print):
  """Prints each side's median and one ratio line per (label, ours, peer) pair."""
  for name, vs in values.items():
    out(f"  {name:16s} median {statistics.median(vs):10.3f} {unit}")
  for label, ours, peer in pairs:
    out(ratio_line(label, ratios(values, ours, peer)))


def subprocess_rate(script: str, worker: str, flags, env) -> float:
  """Runs `python SCRIPT --worker WORKER FLAGS` (its own process: Keras fixes its backend at
  import) and returns the samples_per_s of the JSON line it prints last."""
  proc = subprocess.run([sys.executable, script, "--worker", worker, *flags],
                        capture_output=True, text=True, env=env)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
  if proc.returncode or not lines:
    raise SystemExit(f"{worker} failed:\n{proc.stderr[-2000:]}")
  return json.loads(lines[-1])["samples_per_s"]
