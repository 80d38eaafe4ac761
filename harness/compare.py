"""Compare two result CSVs: the regression gate CI calls.

Rows are matched on (workload, framework, preset). Time to train is samples-to-target over speed,
and the two are checked apart, each with a stated error rate:

- Speed, per group: the successful runs' throughput (samples/s over the timed training blocks)
  and time-to-train speed (samples to target / time to train: evals and all, what time to train
  is made of besides convergence). One exact permutation test per group of "the new side is
  slower": its statistic is the larger of the two measures' Mann-Whitney U counts (with one
  measure it is the exact one-sided Mann-Whitney U test), its null every split of the pooled
  runs into the two sides' sizes, which keeps the measures' correlation (Monte Carlo beyond
  EXACT_LIMIT splits). The ratio new/base is the Hodges-Lehmann estimate (median of the
  pairwise ratios) with its distribution-free interval (Bauer's, from the Mann-Whitney null)
  at 1 - alpha.
- Convergence, per group: where both sides ran the same seeds with the same framework versions,
  run by run and exactly (with fixed seeds the samples to target are deterministic: any
  difference is a change of numerics, reported with its seeds and, where both runs' logs are
  found, the first eval where the curves part; curves that part while the samples to target stay
  the same are reported, not failed); where not, the MLPerf RCP
  checker's comparison of mean samples to target (rcp_checker._find_p_value: olympic means over
  n-2 runs, a pooled-variance t-test), two-sided, with the standard deviation pooled from both
  sides (an RCP's reference has 10-40 runs; a baseline here has 5).

Every statistical test of the comparison (speed per group, convergence where not exact) is one
family, corrected by Holm's step-down method, so that `alpha` is the chance that a comparison
of unchanged code flags anything at all, not the chance per group. A group regresses on speed
when its corrected test rejects AND a measure's ratio shows a loss of at least `threshold`
(smaller changes are not worth a red CI). A changed samples-to-target is a verdict of its own,
"convergence changed", that fails the gate. A group whose run counts cannot reach the corrected
level at all (e.g. 1 run against 1) is "too few runs", not a silent pass. The new side without
a successful run where the baseline had one is "regression (no successful run)"; a key the new
CSV lacks is `missing`. Both "too few runs" and `missing` fail the gate only with require_all (a
CI job that must gate every baseline workload). With speed=False (`--convergence-only`) only
convergence decides: for CSVs from two machines, whose speeds measure the machines (the CI gates
speed by a same-machine A/B, harness/ab.py, and checks convergence against the committed
baseline).
"""
import dataclasses
import functools
import itertools
import math

import numpy as np
import pandas as pd

from harness import results, run_logs

KEYS = ["workload", "framework", "preset"]
MEASURES = ("throughput", "time-to-train speed")   # the speed measures, in the table's order
EXACT_LIMIT = 200_000        # splits enumerated (10 vs 10 is 184,756); beyond, Monte Carlo
MONTE_CARLO_SPLITS = 20_000  # p resolution 5e-5, far below any corrected level of a CI run
DEFAULT_THRESHOLD = 0.03
DEFAULT_ALPHA = 0.05
LOG = "resolved_log"         # the column compare() adds: each row's log where it was found


@dataclasses.dataclass
class Side:
  """One side's runs of one group: the successful runs' figures (same length, run order)."""
  runs: int                          # all rows, successful or not
  seeds: np.ndarray
  throughput: np.ndarray
  ttt_s: np.ndarray
  samples: np.ndarray                # samples (or epochs, where samples are absent) to target
  versions: frozenset = frozenset()
  logs: tuple = ()                   # each run's MLPerf log where compare() found it, else None

  @property
  def success(self) -> int:
    return len(self.seeds)

  def speeds(self) -> dict:
    return {"throughput": self.throughput,
            "time-to-train speed": self.samples / self.ttt_s}


def side_of(frame: pd.DataFrame) -> Side:
  ok = frame[frame["status"] == "success"]
  samples = pd.to_numeric(ok["samples_to_converge"], errors="coerce")
  if samples.isna().all():                       # a CSV without samples: epochs measure it
    samples = pd.to_numeric(ok["epochs_to_converge"], errors="coerce")
  versions = frozenset(str(v) for v in ok["versions"].dropna())
  logs = tuple(ok[LOG]) if LOG in ok else (None,) * len(ok)
  return Side(runs=len(frame), seeds=pd.to_numeric(ok["seed"], errors="coerce").to_numpy(float),
              throughput=pd.to_numeric(ok["throughput"], errors="coerce").to_numpy(float),
              ttt_s=pd.to_numeric(ok["time_to_train_s"], errors="coerce").to_numpy(float),
              samples=samples.to_numpy(float), versions=versions, logs=logs)


# ------------------------------------------------------------------------------------ speed

@functools.lru_cache(maxsize=16)
def runs_to_test(groups: int, alpha: float = DEFAULT_ALPHA) -> int:
  """The fewest runs a side (equal sides) whose speed test can reject in a family of `groups`
  tests at Holm's strictest level alpha / groups: the exact one-sided test's smallest p,
  1 / C(2n, n), must reach it (5 a side up to 12 groups: 1/252 = 0.00397 <= 0.05 / 12; 6 a side
  up to 46: 1/924). Fewer, and the group's verdict is "too few runs" whatever it measures."""
  n = 1
  while 1 / math.comb(2 * n, n) > alpha / groups:
    n += 1
  return n


@functools.lru_cache(maxsize=16)
def _splits(n_total: int, n_base: int):
  """Which runs form the base side, for every split of n_total runs (or MONTE_CARLO_SPLITS
  random ones): (splits, exact). The first row is the observed split (runs 0..n_base-1).
  Kept per run counts (read-only): a gate's groups mostly share theirs, and C(20, 10) splits
  take a third of a second to list."""
  if math.comb(n_total, n_base) <= EXACT_LIMIT:
    flat = itertools.chain.from_iterable(itertools.combinations(range(n_total), n_base))
    splits, exact = np.fromiter(flat, dtype=np.int16).reshape(-1, n_base), True
  else:
    rng = np.random.default_rng(0)               # seeded: the same CSVs give the same p
    random = np.argsort(rng.random((MONTE_CARLO_SPLITS, n_total)), axis=1)[:, :n_base]
    splits, exact = np.vstack([np.arange(n_base)[None], random]).astype(np.int16), False
  splits.flags.writeable = False
  return splits, exact


@functools.lru_cache(maxsize=64)
def _u_counts(n_base: int, n_new: int) -> np.ndarray:
  """The Mann-Whitney U null without ties: how many of the C(n, n_base) arrangements give U = u,
  u = 0..n_base*n_new (the Gaussian binomial coefficient's coefficients)."""
  poly = np.zeros(n_base * n_new + 1)
  poly[0] = 1.0
  for i in range(1, n_base + 1):                 # * (1 - q^(n_new+i)) / (1 - q^i), mod q^(mn+1)
    if n_new + i < len(poly):
      poly[n_new + i:] = poly[n_new + i:] - poly[:len(poly) - n_new - i].copy()
    for residue in range(i):                     # / (1 - q^i): a running sum in steps of i
      poly[residue::i] = np.cumsum(poly[residue::i])
  return poly


def hodges_lehmann(base: np.ndarray, new: np.ndarray, alpha: float):
  """new/base: the median of the pairwise ratios and its two-sided 1 - alpha interval (Bauer
  1972: the k-th smallest and largest pairwise ratio, k from the Mann-Whitney null); the
  interval is (nan, nan) when no k reaches the level (too few runs)."""
  diffs = np.sort(np.subtract.outer(np.log(new), np.log(base)).ravel())
  estimate = float(np.exp(np.median(diffs)))
  counts = _u_counts(len(base), len(new))
  cdf = np.cumsum(counts) / counts.sum()
  below = np.nonzero(cdf <= alpha / 2 + 1e-12)[0]
  if not len(below):
    return estimate, math.nan, math.nan
  k = int(below[-1]) + 1                          # 1-based rank of the lower bound
  return estimate, float(np.exp(diffs[k - 1])), float(np.exp(diffs[len(diffs) - k]))


@dataclasses.dataclass
class SpeedTest:
  p_loss: float          # one-sided: the new side is slower
  p_gain: float          # one-sided: the new side is faster (reported, never gates)
  min_p: float           # the smallest p_loss these run counts can give
  measures: tuple        # the measures tested
  exact: bool


def _usable(speeds: dict) -> set:
  return {m for m, v in speeds.items()
          if len(v) and np.all(np.isfinite(v)) and np.all(np.asarray(v) > 0)}


def speed_test(base: dict, new: dict) -> SpeedTest | None:
  """The permutation test of the new side being slower, over the measures both sides have for
  every successful run (dicts measure -> speeds, higher is faster).

  The statistic is the largest over the measures of the Mann-Whitney count of (base, new) pairs
  where the base run is faster (with one measure: the exact one-sided Mann-Whitney U test); its
  null is every split of the same runs, so the two measures' correlation is kept. The largest
  rather than O'Brien's sum: a time-to-train-only slowdown (slower evals at the same step
  speed) is diluted by a sum with the unchanged throughput, and a measure with a stray run
  (a cold first run's time to train) drags a sum down. Measured (bench/gate_rates.py, 300
  trials), the largest found more of the planted 10% and 20% throughput losses in the CI's
  same-seed case (57% and 92%, the sum 51% and 88%) and fewer with other seeds (28%, 84%
  against 37%, 84%: in a family of 10, 5 runs against 5 then need both measures at the
  extreme)."""
  measures = tuple(m for m in MEASURES if m in _usable(base) & _usable(new))
  if not measures:
    return None
  n_base, n_new = len(base[measures[0]]), len(new[measures[0]])
  pooled = np.log(np.array([np.concatenate([base[m], new[m]]) for m in measures]))
  ranks = np.array([_midranks(values) for values in pooled])   # midranks where runs tie
  splits, exact = _splits(n_base + n_new, n_base)
  rank_sums = ranks[:, splits].sum(axis=2)       # (measures, splits)
  u_each = rank_sums - n_base * (n_base + 1) / 2  # base-faster pairs, per measure
  u_loss = u_each.max(axis=0)
  u_gain = (n_base * n_new - u_each).max(axis=0)
  # exact: the observed split is one of the splits; Monte Carlo: it is added to them
  null_loss, null_gain = (u_loss, u_gain) if exact else (u_loss[1:], u_gain[1:])
  return SpeedTest(p_loss=_p(null_loss, u_loss[0], exact), p_gain=_p(null_gain, u_gain[0], exact),
                   min_p=1 / len(splits),   # the observed split alone at the extreme
                   measures=measures, exact=exact)


def _p(null, observed, exact):
  count = len(null) - np.searchsorted(np.sort(null), observed - 1e-9, side="left")
  return count / len(null) if exact else (count + 1) / (len(null) + 1)


def _midranks(values):
  order = values.argsort(kind="mergesort")
  ranks = np.empty(len(values))
  sorted_values = values[order]
  i = 0
  while i < len(values):
    j = i
    while j + 1 < len(values) and sorted_values[j + 1] == sorted_values[i]:
      j += 1
    ranks[order[i:j + 1]] = (i + j) / 2 + 1
    i = j + 1
  return ranks


def critical_u(n_base: int, n_new: int, level: float) -> float:
  """The smallest Mann-Whitney count of base-faster pairs whose one-sided p (no ties) is
  <= level; inf where none is."""
  counts = _u_counts(n_base, n_new)
  tail = np.cumsum(counts[::-1])[::-1] / counts.sum()     # P(U >= u)
  reached = np.nonzero(tail <= level + 1e-12)[0]
  return float(reached[0]) if len(reached) else math.inf


def detectable_loss(base: dict, new: dict, test: SpeedTest, level: float) -> float:
  """The smallest loss this comparison could flag at `level`, by a stated method: each side's
  log speeds (the first measure tested: throughput) centered on their median (the observed
  spread, no change), the new side then shifted down until its Mann-Whitney count reaches the
  exact critical value: the k-th smallest pairwise difference, k that value; inf where no
  count reaches the level. Exact for a loss that both measures show alike and that rank the
  runs alike (the largest count's p is then the Mann-Whitney p)."""
  measure = test.measures[0]
  b, n = np.log(base[measure]), np.log(new[measure])
  crit = critical_u(len(b), len(n), level)
  if not math.isfinite(crit):
    return math.inf
  diffs = np.sort(np.subtract.outer(n - np.median(n), b - np.median(b)).ravel())
  return max(0.0, float(1 - np.exp(-diffs[max(1, math.ceil(crit - 1e-9)) - 1])))


# ------------------------------------------------------------------------------ convergence

def _olympic(values: np.ndarray):
  """MLPerf's olympic mean (the fastest and slowest run dropped) at MLPerf's run counts (>= 5),
  the plain mean below (dropping 2 of 3 or 4 runs leaves too little): (mean, runs averaged)."""
  values = np.sort(values)
  if len(values) >= 5:
    values = values[1:-1]
  return float(values.mean()), len(values)


def convergence_rcp(base: np.ndarray, new: np.ndarray) -> dict:
  """Different seeds: the RCP comparison of mean samples to target, two-sided: p, the means."""
  from scipy import stats
  mean_b, n_b = _olympic(base)
  mean_n, n_n = _olympic(new)
  out = {"mean_base": mean_b, "mean_new": mean_n, "p": math.nan}
  df = len(base) + len(new) - 2
  if df < 1:
    return out                                    # no spread to test against: untestable
  spread = math.sqrt(((len(base) - 1) * np.var(base, ddof=1 if len(base) > 1 else 0) +
                      (len(new) - 1) * np.var(new, ddof=1 if len(new) > 1 else 0)) / df)
  if spread == 0:
    # Every run the same on both sides: nothing to test, any difference of the means is a
    # change (out["same"]), and no p joins the family (it has no error rate to spend).
    out["same"] = mean_b == mean_n
    return out
  _, p = stats.ttest_ind_from_stats(mean_n, spread, n_n, mean_b, spread, n_b, equal_var=True)
  out["p"] = float(p)
  return out


def convergence_exact(base: Side, new: Side) -> tuple[list, dict]:
  """Same seeds: [(seed, base samples, new samples)] for every shared seed that differs, and
  {seed: run_logs.first_parting(...)} for every shared seed whose eval curves differ (where both
  sides' logs were found; the first run of the seed on each side)."""
  changed, parted = [], {}
  for seed in sorted(set(base.seeds) & set(new.seeds)):
    b = sorted(set(base.samples[base.seeds == seed]))
    n = sorted(set(new.samples[new.seeds == seed]))
    if b != n:
      changed.append((int(seed), b, n))
    base_log, new_log = _first_log(base, seed), _first_log(new, seed)
    if base_log and new_log:
      parting = run_logs.first_parting(base_log, new_log)
      if parting is not None:
        parted[int(seed)] = parting
  return changed, parted


def _first_log(side: Side, seed):
  return next((log for s, log in zip(side.seeds, side.logs) if s == seed and log), None)


def _same_seeds(base: Side, new: Side) -> bool:
  return bool(set(base.seeds) & set(new.seeds)) and (
      not base.versions or not new.versions or base.versions == new.versions)


# ------------------------------------------------------------------------------- the family

def holm(pvalues) -> np.ndarray:
  """Holm's step-down adjusted p-values (reject where <= alpha); nan stays nan, uncounted."""
  p = np.asarray(pvalues, dtype=float)
  out = np.full(len(p), math.nan)
  valid = np.nonzero(~np.isnan(p))[0]
  m = len(valid)
  order = valid[np.argsort(p[valid], kind="mergesort")]
  running = 0.0
  for rank, index in enumerate(order):
    running = max(running, min(1.0, (m - rank) * p[index]))
    out[index] = running
  return out


@dataclasses.dataclass
class Group:
  """One group's figures before the family is corrected."""
  base: Side
  new: Side | None
  speed: SpeedTest | None = None
  ratios: dict = dataclasses.field(default_factory=dict)    # measure -> (hl, lo, hi)
  exact: bool = False                                        # convergence compared run by run
  changed_seeds: list = dataclasses.field(default_factory=list)
  parted: dict = dataclasses.field(default_factory=dict)    # seed -> where the curves part
  rcp: dict | None = None


def group_figures(base: Side, new: Side | None, alpha: float) -> Group:
  group = Group(base, new)
  if new is None or base.success == 0 or new.success == 0:
    return group
  bs, ns = base.speeds(), new.speeds()
  group.speed = speed_test(bs, ns)
  if group.speed is not None:
    for m in group.speed.measures:
      group.ratios[m] = hodges_lehmann(bs[m], ns[m], alpha)
  have = np.isfinite(base.samples).all() and np.isfinite(new.samples).all()
  if have and _same_seeds(base, new):
    group.exact = True
    group.changed_seeds, group.parted = convergence_exact(base, new)
  elif have:
    group.rcp = convergence_rcp(base.samples, new.samples)
  return group


def decide(groups: list, threshold: float, alpha: float, detectable: bool = True,
           speed: bool = True) -> list:
  """Each group's verdict and figures, the family corrected: a list of dicts (without the
  detectable loss when not `detectable`: the gate's estimator needs only the verdicts). Not
  `speed`: convergence alone decides (two machines' CSVs: their speeds measure the machines),
  the speed figures are printed but no speed test joins the family."""
  # A speed test whose run counts cannot reach alpha even alone is left out of the family: no
  # procedure could reject it, so it cannot add a false alarm, and counting it would only
  # tighten the others' level (Tarone 1990).
  family = [g.speed.p_loss if speed and g.speed and g.speed.min_p <= alpha else math.nan
            for g in groups] + [g.rcp["p"] if g.rcp else math.nan for g in groups]
  adjusted = holm(family)
  m = int(np.count_nonzero(~np.isnan(adjusted)))
  level = alpha / m if m else alpha                # Holm's first (strictest) step
  out = []
  for i, g in enumerate(groups):
    p_speed, p_conv = adjusted[i], adjusted[len(groups) + i]
    row = {"p_speed": g.speed.p_loss if g.speed else math.nan, "p_speed_adj": p_speed,
           "p_conv": g.rcp["p"] if g.rcp else math.nan, "p_conv_adj": p_conv,
           "detectable_loss": math.nan}
    for name, key in (("throughput", "throughput"), ("time-to-train speed", "ttt_speed")):
      hl, lo, hi = g.ratios.get(name, (math.nan,) * 3)
      row[f"{key}_ratio"], row[f"{key}_lo"], row[f"{key}_hi"] = hl, lo, hi
    reasons = []
    if g.speed is not None and detectable and speed:
      row["detectable_loss"] = max(threshold, detectable_loss(
          g.base.speeds(), g.new.speeds(), g.speed, level))
    if g.speed is not None and p_speed <= alpha:   # nan (left out) compares False
      reasons = [mm for mm in g.speed.measures if g.ratios[mm][0] <= 1 - threshold]
    conv = _convergence_text(g, p_conv, alpha)
    row["convergence"] = conv
    if g.new is None:
      verdict = "missing"
    elif g.base.success > 0 and g.new.success == 0:
      verdict = "regression (no successful run)"
    elif g.base.success == 0:
      verdict = "ok (no successful baseline run)"
    else:
      parts = []
      if reasons:
        parts.append("regression (" + ", ".join(reasons) + ")")
      if conv.startswith("changed"):
        parts.append("convergence " + conv)
      if parts:
        verdict = "; ".join(parts)
      elif not speed:
        verdict = "ok"
      elif g.speed is not None and g.speed.min_p > level:
        verdict = (f"too few runs ({g.base.success} vs {g.new.success}: the smallest possible p, "
                   f"{g.speed.min_p:.3g}, is above the corrected level {level:.3g})")
      elif g.speed is None:
        verdict = "too few runs (no speed figures on both sides)"
      elif g.speed.p_gain <= alpha and any(r[0] >= 1 + threshold for r in g.ratios.values()):
        verdict = "improvement"
      else:
        verdict = "ok"
    row["verdict"] = verdict
    out.append(row)
  return out


def _convergence_text(g: Group, p_adj: float, alpha: float) -> str:
  if g.exact:
    n = len(set(g.base.seeds) & set(g.new.seeds))
    if not g.changed_seeds:
      if not g.parted:
        return f"same ({n} seeds)"
      seed = min(g.parted)
      return (f"same ({n} seeds; numerics changed: seed {seed}'s curves part at "
              f"{_parting_text(g.parted[seed])})")
    what = ", ".join(f"seed {s}: {_fmt(b)} -> {_fmt(nn)}"
                     + (f", curves part at {_parting_text(g.parted[s])}" if s in g.parted else "")
                     for s, b, nn in g.changed_seeds)
    return f"changed ({what})"
  if g.rcp is None:
    return "not compared"
  mean_b, mean_n = g.rcp["mean_base"], g.rcp["mean_new"]
  if "same" in g.rcp:
    return (f"same (every run {mean_b:.6g})" if g.rcp["same"] else
            f"changed (every run {mean_b:.6g} -> mean {mean_n:.6g})")
  if math.isnan(g.rcp["p"]):
    return f"not compared (too few runs: mean {mean_b:.6g} -> {mean_n:.6g})"
  if p_adj <= alpha:
    return f"changed (mean {mean_b:.6g} -> {mean_n:.6g}, RCP p={g.rcp['p']:.2g})"
  return f"same (mean {mean_b:.6g} -> {mean_n:.6g}, RCP p={g.rcp['p']:.2g})"


def _parting_text(parting):
  index, epoch, b, n = parting
  value = lambda v: "no eval" if v is None else repr(v)    # noqa: E731  (every digit: they differ)
  where = f"epoch {epoch:g}" if isinstance(epoch, (int, float)) else "epoch not logged"
  return f"eval {index} ({where}: {value(b)} -> {value(n)})"


def _fmt(values):
  return "/".join(f"{v:.6g}" for v in values) or "none"


# ------------------------------------------------------------------------------- the table

COLUMNS = ["runs_base", "runs_new", "ttt_s_base", "ttt_s_new", "ttt_ratio", "throughput_base",
           "throughput_new", "throughput_ratio", "throughput_lo", "throughput_hi",
           "ttt_speed_ratio", "p_speed", "p_speed_adj", "detectable_loss", "convergence",
           "verdict"]


def compare_frames(base_frame: pd.DataFrame, new_frame: pd.DataFrame,
                   threshold: float = DEFAULT_THRESHOLD, alpha: float = DEFAULT_ALPHA,
                   speed: bool = True) -> pd.DataFrame:
  new_groups = {key: rows for key, rows in new_frame.groupby(KEYS)}
  keys, groups, rows = [], [], []
  for key, rows_base in base_frame.groupby(KEYS):  # keys only the new side has: not gated
    rows_new = new_groups.get(key)
    base, new = side_of(rows_base), side_of(rows_new) if rows_new is not None else None
    keys.append(key)
    groups.append(group_figures(base, new, alpha))
    rows.append({"runs_base": base.runs, "runs_new": new.runs if new else math.nan,
                 "ttt_s_base": _median(base.ttt_s), "ttt_s_new": _median(new.ttt_s) if new
                 else math.nan, "throughput_base": _median(base.throughput),
                 "throughput_new": _median(new.throughput) if new else math.nan})
  for row, decided in zip(rows, decide(groups, threshold, alpha, speed=speed)):
    row.update(decided)
    row["ttt_ratio"] = row["ttt_s_new"] / row["ttt_s_base"]
  table = pd.DataFrame(rows, columns=COLUMNS)
  table.insert(0, "preset", [k[2] for k in keys])
  table.insert(0, "framework", [k[1] for k in keys])
  table.insert(0, "workload", [k[0] for k in keys])
  tests = sum(pd.notna(r["p_speed_adj"]) + pd.notna(r["p_conv_adj"]) for r in rows)
  table.attrs.update(threshold=threshold, alpha=alpha, tests=int(tests), speed=speed)
  return table


def _median(values):
  values = values[np.isfinite(values)]
  return float(np.median(values)) if len(values) else math.nan


def compare(baseline_path: str, new_path: str, threshold: float = DEFAULT_THRESHOLD,
            alpha: float = DEFAULT_ALPHA, speed: bool = True) -> pd.DataFrame:
  return compare_frames(_with_logs(baseline_path), _with_logs(new_path), threshold, alpha, speed)


def _with_logs(csv_path: str) -> pd.DataFrame:
  """The CSV's rows with each row's MLPerf log found (or None) in column LOG."""
  frame = results.read_csv(csv_path)
  frame[LOG] = [run_logs.resolve_log(p, csv_path) for p in frame["log_path"]]
  return frame


FAILING = ("regression", "convergence changed")


def is_regression(table: pd.DataFrame, require_all: bool = False) -> bool:
  failing = FAILING + (("missing", "too few runs") if require_all else ())
  return bool(table["verdict"].str.startswith(failing).any())
