"""The change-point search's error rates (harness/changepoints.py), measured on seeded normal
series: how often a flat series of N points shows a change point at a level, and how often a
step of D standard deviations in its middle is found, and found at its point.

  python bench/changepoint_rates.py --trials 400 --seed 0

One series per trial, N in (8, 20, 40), at level 0.05 (one series: the level the analysis gives
each of its series is alpha / series). Prints one line per (N, step).
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import changepoints  # noqa: E402  pylint: disable=wrong-import-position


def rates(n: int, step: float, trials: int, level: float, seed: int):
  """Shares of `trials` series with a change point, with one at the planted point, and with
  one within a point of it."""
  rng = np.random.default_rng(seed)
  found = at = near = 0
  for trial in range(trials):
    x = rng.normal(size=n)
    x[n // 2:] += step
    points = changepoints.e_divisive(x, level, seed=trial)
    found += bool(points)
    at += any(p.index == n // 2 for p in points)
    near += any(abs(p.index - n // 2) <= 1 for p in points)
  return found / trials, at / trials, near / trials


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--trials", type=int, default=400)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--level", type=float, default=0.05)
  args = parser.parse_args(argv)
  print(f"{'points':>6} {'step (sd)':>9} {'found':>7} {'at the step':>11} {'within 1':>8}")
  for n in (8, 20, 40):
    for step in (0.0, 1.0, 1.5, 2.0):
      found, at, near = rates(n, step, args.trials, args.level, args.seed)
      placed = f"{at:>11.1%} {near:>8.1%}" if step else f"{'-':>11} {'-':>8}"
      print(f"{n:>6} {step:>9g} {found:>7.1%} {placed}")


if __name__ == "__main__":
  main()
