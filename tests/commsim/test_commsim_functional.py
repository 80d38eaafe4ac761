"""Functional simulation: every algorithm x topology x collective, with and without failed
chips, ends with exactly the right data on every live chip."""
import numpy as np
import pytest

from harness.commsim import algorithms, functional
from harness.commsim.machine import Machine
from harness.errors import UsageError

TOPOLOGIES = ["ring:7", "ring:8", "mesh:4x4", "mesh:3x5", "torus:4x4", "torus:5x3",
              "torus:4x6", "multinode:3x4"]
LINKS = dict(link_bandwidth=1e9, link_latency=1e-6, network_bandwidth=1e8, network_latency=2e-6)


def _failure_sets(topology, counts=(1, 2, 3), draws=2, seed=0):
  """Random failed-chip sets (seeded) that leave the machine connected."""
  healthy = Machine(topology, **LINKS)
  rng = np.random.default_rng(seed)
  sets = [()]
  for count in counts:
    for _ in range(draws):
      chips = tuple(healthy.coords(int(c))
                    for c in rng.choice(healthy.num_chips, count, replace=False))
      try:
        Machine(topology, **LINKS, failed_chips=chips)
      except UsageError:
        continue                           # disconnected: the test below covers that error
      sets.append(chips)
  return sets


CASES = [(t, f) for t in TOPOLOGIES for f in _failure_sets(t)]


@pytest.mark.parametrize("topology,failed", CASES, ids=[f"{t}-{len(f)}failed-{i}"
                                                        for i, (t, f) in enumerate(CASES)])
def test_every_algorithm_ends_with_the_exact_result(topology, failed):
  machine = Machine(topology, **LINKS, failed_chips=failed)
  ran = 0
  for collective in algorithms.COLLECTIVES:
    for name in algorithms.applicable(machine, collective):
      schedule = algorithms.build(machine, collective, name)
      check = functional.run(machine, schedule, elements=97, dtype="int64", seed=len(failed))
      assert check.ok, (collective, name, check.detail)
      ran += 1
  assert ran >= 4


@pytest.mark.parametrize("topology", ["torus:5x3", "mesh:4x4", "multinode:3x4"])
def test_float64_sums_within_the_summation_order_bound(topology):
  machine = Machine(topology, **LINKS, failed_chips=_failure_sets(topology)[-1])
  for name in algorithms.applicable(machine, "all-reduce"):
    check = functional.run(machine, algorithms.build(machine, "all-reduce", name),
                           elements=64, dtype="float64", seed=3)
    assert check.ok and check.max_error <= check.bound, (name, check)


def test_a_wrong_schedule_is_caught():
  """The check can fail: drop the last all-gather step of a ring and chips miss data."""
  machine = Machine("ring:6", **LINKS)
  schedule = algorithms.build(machine, "all-reduce", "ring")
  track = schedule.stages[-1].tracks[0]
  track.steps -= 1
  assert not functional.run(machine, schedule, elements=12).ok


def test_256_chips_with_1024_elements(topology="torus:16x16"):
  machine = Machine(topology, **LINKS, failed_chips=[(3, 5), (9, 12)])
  for name in algorithms.applicable(machine, "all-reduce"):
    check = functional.run(machine, algorithms.build(machine, "all-reduce", name), 1024)
    assert check.ok, name


@pytest.mark.parametrize("topology,failed,unreachable", [
    ("mesh:3x3", [(1, 0), (0, 1)], "0,0"),
    ("ring:6", [2, 4], "3"),
    ("mesh:4x4", [(0, 2), (1, 2), (2, 2), (3, 2)], "0,3"),
])
def test_failures_that_disconnect_the_machine_are_one_line_errors(topology, failed,
                                                                   unreachable):
  failed = [c if isinstance(c, tuple) else (c,) for c in failed]
  with pytest.raises(UsageError, match="disconnect") as e:
    Machine(topology, **LINKS, failed_chips=failed)
  assert "\n" not in str(e.value) and unreachable in str(e.value)
