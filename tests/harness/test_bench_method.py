"""bench/method.py: interleaving order, per-round ratios, median and min-max."""
import pytest

from bench import method


def test_rounds_alternate_the_order_and_ratios_pair_within_a_round():
  calls = []
  clock = iter(range(100))

  def side(name, rates):
    values = iter(rates)
    def measure():
      calls.append(name)
      next(clock)
      return next(values)
    return measure

  values = method.interleaved({"ours": side("ours", [10, 12, 9]),
                               "peer": side("peer", [5, 4, 10])}, 3, log=None)
  assert calls == ["ours", "peer", "peer", "ours", "ours", "peer"]
  assert values == {"ours": [10, 12, 9], "peer": [5, 4, 10]}
  rs = method.ratios(values, "ours", "peer")
  assert rs == [2.0, 3.0, 0.9]
  assert method.summary(rs) == (2.0, 0.9, 3.0)
  assert method.ratio_line("x", rs) == ("ratio x: median 2.000 [min 0.900, max 3.000] over 3 "
                                        "interleaved rounds")


def test_at_least_one_round():
  with pytest.raises(ValueError, match="--repeats 0"):
    method.interleaved({"a": lambda: 1.0}, 0)
