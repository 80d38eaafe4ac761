"""Change points in a result history across commits: E-divisive means, as MongoDB's and Apache
Otava's performance CI find them.

The method is Matteson & James (2014), "A Nonparametric Approach for Multiple Change Point
Analysis of Multivariate Data" (JASA 109:505), in the form MongoDB's CI uses (Daly et al.,
ICPE 2020): the end of the second segment fixed at the end of the current one (no search over
kappa). For a series Z_a..Z_{b-1} and a split tau (X = Z_a..Z_{tau-1}, Y = Z_tau..Z_{b-1},
n and m points),

  E(X, Y) = 2/(nm) sum |X_i - Y_j|^alpha - C(n,2)^-1 sum_{i<k} |X_i - X_k|^alpha
                                          - C(m,2)^-1 sum_{j<k} |Y_j - Y_k|^alpha
  Q(tau)  = nm/(n+m) E(X, Y)

(the energy distance, alpha = 1: it sees a change of the mean and of the spread alike). The
split with the largest Q over every current segment is a candidate; its significance is a
permutation test: the points are permuted within each current segment and the largest Q over
all segments recomputed, p = (exceedances + 1) / (permutations + 1); below the level it becomes
a change point and the search repeats on the segments it made, else the search stops.

Written here rather than imported: MongoDB's `signal-processing-algorithms` (2.1.6, the
latest) requires numpy < 2 (this project pins 2.4.6; pip's resolver refuses the pair) and pulls
gevent and structlog; Apache Otava (0.8.0) pins numpy 2.2.0 and scipy < 1.17 and pulls
BigQuery, Postgres and Slack clients. The permutations stop early once the p-value can no
longer reach the level (the decision is that of running them all: more exceedances only raise
p), so a flat series costs a few hundred permutations, not thousands.

A history's series: per (system, workload, framework, preset) and measure (throughput, time to
train, samples to target), one point per commit, the median of its successful runs, the commits
in the order they first appear (the CI appends each push's rows). One point per commit, not
per run: runs of one commit ran together on one machine, and their shared conditions would make
a test over single runs take a machine's day for a change. Every series of an analysis is
tested at alpha / (the number of series) (Bonferroni), so alpha bounds the chance that a flat
history shows any change point at all.
"""
import dataclasses
import math

import numpy as np
import pandas as pd

DEFAULT_ALPHA = 0.05
MIN_SIZE = 3          # commits on each side of a change: one odd commit is not a change
EXPONENT = 1.0        # alpha of the energy distance, in (0, 2); 1: the Euclidean distance
MIN_PERMUTATIONS = 199
CHUNK = 64            # permutations computed together (memory: CHUNK x n x n doubles)

# measure -> (column, label, units, higher is better)
MEASURES = {"throughput": ("throughput", "throughput", "samples/s", True),
            "time_to_train_s": ("time_to_train_s", "time to train", "s", False),
            "samples_to_converge": ("samples_to_converge", "samples to target", "samples",
                                    False)}
SERIES_KEYS = ["system", "workload", "framework", "preset"]


# --------------------------------------------------------------------------- the statistic

def q_statistics(values, min_size: int = MIN_SIZE, exponent: float = EXPONENT) -> np.ndarray:
  """Q(tau) for tau = 0..n (X = values[:tau], Y = values[tau:]) of one series, or of a batch
  (shape (..., n)); -inf where a side has fewer than min_size points."""
  x = np.asarray(values, dtype=float)
  n = x.shape[-1]
  d = np.abs(x[..., :, None] - x[..., None, :]) ** exponent          # (..., n, n)
  # With S(t) = sum of d over i, k < t (the whole symmetric block): the X side's pairs are
  # S(tau)/2, the cross pairs R(tau) - S(tau) with R(tau) = sum_{i<tau} of row sums, and the
  # Y side's pairs what is left of the total. S grows by twice the new point's distances to
  # the points before it: the upper triangle's column sums.
  upper_cols = np.triu(d, 1).sum(axis=-2)                             # (..., n)
  zero = np.zeros(x.shape[:-1] + (1,))
  s = np.concatenate([zero, np.cumsum(2 * upper_cols, axis=-1)], axis=-1)          # (..., n+1)
  r = np.concatenate([zero, np.cumsum(d.sum(axis=-1), axis=-1)], axis=-1)
  total = s[..., -1:]
  within_x, cross = s / 2, r - s
  within_y = (total - s - 2 * cross) / 2
  tau = np.arange(n + 1, dtype=float)
  m = n - tau
  with np.errstate(divide="ignore", invalid="ignore"):
    e = (2 * cross / (tau * m) - within_x / (tau * (tau - 1) / 2)
         - within_y / (m * (m - 1) / 2))
    q = tau * m / n * e
  valid = (tau >= min_size) & (m >= min_size)
  return np.where(valid, q, -np.inf)


def _best_split(values, min_size, exponent):
  q = q_statistics(values, min_size, exponent)
  tau = int(np.argmax(q))
  return tau, float(q[tau])


@dataclasses.dataclass
class Found:
  index: int          # the change's first point (the series' position)
  q: float
  p: float
  permutations: int


def e_divisive(values, level: float = DEFAULT_ALPHA, min_size: int = MIN_SIZE,
               exponent: float = EXPONENT, permutations: int | None = None,
               seed: int = 0) -> list[Found]:
  """The change points of a series, in the order found (most significant first), each with its
  permutation p-value: the first point after each change. `permutations` defaults to enough
  for the Monte Carlo p to resolve `level` to a twentieth of it (at least MIN_PERMUTATIONS)."""
  x = np.asarray(values, dtype=float)
  if permutations is None:
    permutations = max(MIN_PERMUTATIONS, math.ceil(20 / level) - 1)
  rng = np.random.default_rng(seed)          # seeded: the same history gives the same answer
  found: list[Found] = []
  while True:
    bounds = [0] + sorted(f.index for f in found) + [len(x)]
    segments = [(a, b) for a, b in zip(bounds, bounds[1:]) if b - a >= 2 * min_size]
    if not segments:
      return found
    best = None
    for a, b in segments:
      tau, q = _best_split(x[a:b], min_size, exponent)
      if best is None or q > best[1]:
        best = (a + tau, q)
    if not math.isfinite(best[1]) or best[1] <= 0:
      return found                          # a constant stretch: nothing to split
    p, used = _permutation_p(x, segments, best[1], level, permutations, min_size, exponent,
                             rng)
    if p > level:
      return found
    found.append(Found(best[0], best[1], p, used))


def _permutation_p(x, segments, observed, level, permutations, min_size, exponent, rng):
  """(p, permutations run): the share of within-segment permutations whose largest Q over all
  segments reaches the observed one (the observed arrangement counted, as one of them).
  Stops once (exceedances + 1) / (permutations + 1) > level is certain."""
  limit = level * (permutations + 1)          # reject iff exceedances + 1 <= limit
  exceed, done = 0, 0
  while done < permutations:
    size = min(CHUNK, permutations - done)
    largest = np.full(size, -np.inf)
    for a, b in segments:
      batch = rng.permuted(np.broadcast_to(x[a:b], (size, b - a)), axis=1)
      largest = np.maximum(largest, q_statistics(batch, min_size, exponent).max(axis=1))
    # a relative tolerance: a permutation equal to the observed arrangement gives the same Q
    # up to rounding in another summation order
    exceed += int(np.count_nonzero(largest >= observed * (1 - 1e-12)))
    done += size
    if exceed + 1 > limit:
      return (exceed + 1) / (done + 1), done
  return (exceed + 1) / (permutations + 1), permutations


# ------------------------------------------------------------------------------ the history

def commit_order(frame: pd.DataFrame) -> pd.DataFrame:
  """The commits of a history in the order they first appear (by started_at): columns commit,
  first (the first row's time), position. Rows without a commit (runs outside git) are left
  out."""
  when = pd.to_datetime(frame["started_at"], utc=True, errors="coerce")
  commits = frame["git_commit"].astype("string").fillna("").str.strip()
  table = pd.DataFrame({"commit": commits, "when": when})
  table = table[table["commit"] != ""]
  first = table.groupby("commit")["when"].min().sort_values(kind="mergesort")
  return pd.DataFrame({"commit": first.index, "first": first.to_numpy(),
                       "position": range(len(first))})


@dataclasses.dataclass
class Analysis:
  changes: pd.DataFrame   # one row per change point
  series: int             # series analysed (enough commits to split)
  commits: int
  level: float            # each series' level: alpha / series
  alpha: float
  left_out: int           # rows without a commit


CHANGE_COLUMNS = SERIES_KEYS + ["measure", "commit", "first_seen", "before", "after",
                                "change", "p", "commits_before", "commits_after"]


def analyse(frame: pd.DataFrame, alpha: float = DEFAULT_ALPHA, min_size: int = MIN_SIZE,
            seed: int = 0) -> Analysis:
  """Every series of the history (successful runs), E-divisive at alpha / series each: the
  change points with the commit where each began, the medians of the segments on either side
  (per-commit medians' median) and its p-value."""
  order = commit_order(frame)
  position = dict(zip(order["commit"], order["position"]))
  first = dict(zip(order["commit"], order["first"]))
  commits = frame["git_commit"].astype("string").fillna("").str.strip()
  ok = frame[(frame["status"] == "success") & (commits != "")].assign(_commit=commits).copy()
  for key in SERIES_KEYS:
    ok[key] = ok[key].astype("string").fillna("")
  series = []
  for key, rows in ok.groupby(SERIES_KEYS, sort=True):
    for measure, (column, _, _, _) in MEASURES.items():
      values = pd.to_numeric(rows[column], errors="coerce")
      points = (pd.DataFrame({"commit": rows["_commit"], "value": values}).dropna()
                .groupby("commit")["value"].median())
      if len(points) < 2 * min_size:
        continue
      points = points.iloc[np.argsort([position[c] for c in points.index], kind="stable")]
      series.append((key, measure, points))
  level = alpha / len(series) if series else alpha
  rows_out = []
  for key, measure, points in series:
    values = points.to_numpy(float)
    found = e_divisive(values, level, min_size, seed=seed)
    cuts = sorted(f.index for f in found)
    bounds = [0] + cuts + [len(values)]
    for f in found:
      at = bounds.index(f.index)
      before = float(np.median(values[bounds[at - 1]:f.index]))
      after = float(np.median(values[f.index:bounds[at + 1]]))
      commit = points.index[f.index]
      rows_out.append(dict(zip(SERIES_KEYS, key), measure=measure, commit=commit,
                           first_seen=first[commit], before=before, after=after,
                           change=after / before - 1 if before else math.nan, p=f.p,
                           commits_before=f.index - bounds[at - 1],
                           commits_after=bounds[at + 1] - f.index))
  changes = pd.DataFrame(rows_out, columns=CHANGE_COLUMNS)
  changes = changes.sort_values(SERIES_KEYS + ["measure", "first_seen"], kind="mergesort")
  return Analysis(changes.reset_index(drop=True), len(series), len(order), level, alpha,
                  int((commits == "").sum()))


def describe(analysis: Analysis) -> str:
  """The analysis's first line: what was tested, at which level."""
  if not analysis.series:
    return (f"no series to test: a (system, workload, framework, preset) needs {2 * MIN_SIZE} "
            f"commits with successful runs ({MIN_SIZE} on each side of a change); the history "
            f"has {analysis.commits} commits"
            + (f"; {analysis.left_out} rows without a commit left out" if analysis.left_out
               else ""))
  return (f"{analysis.series} series ((system, workload, framework, preset) x throughput, time "
          f"to train, samples to target; one point per commit, the median of its successful "
          f"runs) over {analysis.commits} commits, E-divisive means, each at alpha "
          f"{analysis.alpha:g} / {analysis.series} = {analysis.level:.3g}"
          + (f"; {analysis.left_out} rows without a commit left out" if analysis.left_out
             else ""))
