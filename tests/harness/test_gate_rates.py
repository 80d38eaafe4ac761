"""bench/gate_rates.py, the gate's error-rate estimator, on a seeded synthetic noise model: the
gate's false alarms per comparison stay within a binomial bound of alpha, and the same estimate
with the family correction taken out does not (so this test sees the correction)."""
import numpy as np
import scipy.stats

from bench import gate_rates
from harness import compare

TRIALS = 300
ALPHA = 0.05


def _false_alarm(monkeypatch=None, uncorrected=False):
  rng = np.random.default_rng(7)
  groups = gate_rates.synthetic_groups(rng, n_groups=8)
  if uncorrected:                 # each p against alpha alone: the gate without the correction
    monkeypatch.setattr(compare, "holm", lambda p: np.asarray(p, dtype=float))
  # threshold 0: the practical-significance floor would hide what the correction does
  gate = gate_rates.new_gate(threshold=0.0, alpha=ALPHA)
  return gate_rates.estimate(groups, gate, TRIALS, rng, same_seeds=True, plants=False)


def test_false_alarms_per_comparison_are_within_a_binomial_bound_of_alpha(monkeypatch):
  """8 unchanged groups, 5 runs against 5, 300 comparisons: with Holm each comparison fails
  with probability <= alpha (here 1 - (1 - 1/252)^8 = 3.1%); the count stays below the 99.9%
  quantile of Binomial(300, alpha). Each group tested at alpha alone fails a comparison
  1 - (1 - 12/252)^8 = 32% of the time, far above that bound."""
  bound = scipy.stats.binom.ppf(0.999, TRIALS, ALPHA) / TRIALS
  corrected = _false_alarm()["false_alarm"]
  assert corrected <= bound, (corrected, bound)
  uncorrected = _false_alarm(monkeypatch, uncorrected=True)["false_alarm"]
  assert uncorrected > bound, (uncorrected, bound)
  assert 0.2 < uncorrected < 0.45                  # the per-group rate the arithmetic above says


def test_planted_changes_are_found_as_planted():
  """A 20% loss at 1% noise is found in every trial, as is a changed samples-to-target of one
  seed (runs compared seed by seed); no loss planted in a group is not found in it."""
  rng = np.random.default_rng(1)
  groups = gate_rates.synthetic_groups(rng, n_groups=3, cv=0.01)
  rates = gate_rates.estimate(groups, gate_rates.new_gate(0.03, ALPHA), 20, rng,
                              same_seeds=True)
  assert (rates[("loss", 0.20)] == 1).all() and (rates["convergence"] == 1).all()
  assert rates["false_alarm"] == 0
