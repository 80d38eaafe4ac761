"""Timing simulation against the closed forms (no contention) to 1e-9 relative, and the
contention model itself."""
import numpy as np
import pytest

from harness.commsim import algorithms, timing
from harness.commsim.machine import Machine
from harness.commsim.schedule import COPY, Schedule, Stage, Track

B, ALPHA, N = 40e9, 2e-6, 64e6          # bytes/s per link direction, s per hop, bytes per chip


def _time(topology, collective, algorithm, **kw):
  machine = Machine(topology, link_bandwidth=kw.pop("bw", B), link_latency=ALPHA, **kw)
  return timing.simulate(machine, algorithms.build(machine, collective, algorithm), N)


@pytest.mark.parametrize("topology,p", [("ring:8", 8), ("ring:5", 5), ("torus:4x4", 16),
                                        ("torus:6x4", 24), ("mesh:4x6", 24)])
def test_ring_all_reduce_closed_form(topology, p):
  """2(p-1) alpha + 2(p-1)/p n/B (the comb ring has neighbours all the way round when Y is
  even); NCCL's bus bandwidth of a ring with no latency equals the link bandwidth."""
  t = _time(topology, "all-reduce", "ring")
  assert t.time_s == pytest.approx(2 * (p - 1) * ALPHA + 2 * (p - 1) / p * N / B, rel=1e-9)
  assert t.steps == 2 * (p - 1)
  machine = Machine(topology, link_bandwidth=B)
  t0 = timing.simulate(machine, algorithms.build(machine, "all-reduce", "ring"), N)
  assert t0.busbw == pytest.approx(B, rel=1e-9)


@pytest.mark.parametrize("collective", ["reduce-scatter", "all-gather"])
def test_ring_reduce_scatter_and_all_gather_closed_form(collective):
  p = 12
  t = _time("ring:12", collective, "ring")
  assert t.time_s == pytest.approx((p - 1) * ALPHA + (p - 1) / p * N / B, rel=1e-9)


def test_bidirectional_ring_closed_form():
  p = 10
  t = _time("ring:10", "all-reduce", "bidir")
  assert t.time_s == pytest.approx(2 * (p - 1) * ALPHA + (p - 1) / p * N / B, rel=1e-9)


@pytest.mark.parametrize("X,Y", [(4, 4), (8, 4), (6, 10)])
def test_2d_torus_closed_form_and_latency_steps(X, Y):
  """Reduce-scatter along x, all-reduce along y, all-gather along x:
  2(X+Y-2) alpha + [2(X-1)/X + 2(Y-1)/(XY)] n/B, against 2(XY-1) steps for one ring."""
  t = _time(f"torus:{X}x{Y}", "all-reduce", "2d")
  assert t.steps == 2 * (X + Y - 2)
  assert _time(f"torus:{X}x{Y}", "all-reduce", "ring").steps == 2 * (X * Y - 1)
  want = 2 * (X + Y - 2) * ALPHA + (2 * (X - 1) / X + 2 * (Y - 1) / (X * Y)) * N / B
  assert t.time_s == pytest.approx(want, rel=1e-9)
  both = _time(f"torus:{X}x{Y}", "all-reduce", "2d-bidir")
  half = 2 * (X + Y - 2) * ALPHA + ((X - 1) / X + (Y - 1) / (X * Y)) * N / B
  assert both.time_s == pytest.approx(half, rel=1e-9)


@pytest.mark.parametrize("k", [3, 4, 8])
def test_multiring_on_a_square_torus_uses_every_link_once(k):
  """Two edge-disjoint Hamiltonian cycles, each both ways: four rings, no shared link, so
  each ring's quarter of the data moves at full link bandwidth."""
  p = k * k
  t = _time(f"torus:{k}x{k}", "all-reduce", "multiring")
  assert t.time_s == pytest.approx(2 * (p - 1) * ALPHA + 2 * (p - 1) / p * (N / 4) / B,
                                   rel=1e-9)
  assert np.allclose(t.link_bytes, t.link_bytes[0])      # every directed link equally loaded


def test_hierarchical_closed_form():
  """Inside a node: 2 hops through the switch (half the latency each); across nodes: 2 hops
  through the network switch, one rail per GPU."""
  nodes, gpus, bw_net, alpha_net, overhead = 4, 8, 12.5e9, 5e-6, 3e-6
  machine = Machine(f"multinode:{nodes}x{gpus}", link_bandwidth=B, link_latency=ALPHA,
                    overhead=overhead, network_bandwidth=bw_net, network_latency=alpha_net)
  t = timing.simulate(machine, algorithms.build(machine, "all-reduce", "hierarchical"), N)
  want = (2 * (gpus - 1) * (overhead + ALPHA) + 2 * (gpus - 1) / gpus * N / B
          + 2 * (nodes - 1) * (overhead + alpha_net)
          + 2 * (nodes - 1) / (nodes * gpus) * N / bw_net)
  assert t.time_s == pytest.approx(want, rel=1e-9)


def _one_step(machine, pairs, nbytes):
  src, dst = np.array([a for a, _ in pairs]), np.array([b for _, b in pairs])
  ids = np.arange(len(pairs))
  track = Track(src, dst, 1, lambda s: (np.ones(len(pairs), np.int64), ids), COPY, True)
  schedule = Schedule("all-gather", "test", machine.live_chips, len(pairs), [Stage([track])])
  return timing.simulate(machine, schedule, nbytes * len(pairs))


def test_two_messages_forced_onto_one_link_take_twice_as_long():
  """On a line 0-1-2-3 (mesh:4x1): 0->2 and 1->2 both cross link 1->2."""
  machine = Machine("mesh:4x1", link_bandwidth=B)
  one = _one_step(machine, [(1, 2)], N).time_s
  two = _one_step(machine, [(0, 2), (1, 2)], N).time_s
  apart = _one_step(machine, [(0, 1), (2, 3)], N).time_s
  assert one == pytest.approx(N / B, rel=1e-12)
  assert two == pytest.approx(2 * one, rel=1e-12)
  assert apart == pytest.approx(one, rel=1e-12)


def test_injection_limit_caps_what_one_chip_sends():
  machine = Machine("ring:4", link_bandwidth=B, injection_bandwidth=B)
  both_ways = _one_step(machine, [(0, 1), (0, 3)], N).time_s   # two links, one chip
  assert both_ways == pytest.approx(2 * N / B, rel=1e-12)
  free = Machine("ring:4", link_bandwidth=B)
  assert _one_step(free, [(0, 1), (0, 3)], N).time_s == pytest.approx(N / B, rel=1e-12)


def test_per_hop_latency_of_a_routed_message():
  machine = Machine("mesh:5x1", link_bandwidth=B, link_latency=ALPHA, overhead=1e-6)
  t = _one_step(machine, [(0, 4)], N).time_s
  assert t == pytest.approx(1e-6 + 4 * ALPHA + N / B, rel=1e-12)


def test_failed_chips_cost_little_with_the_2d_scheme():
  """Routing around two holes of a 16x16 torus: the 2-D scheme (slices spread over the row,
  stand-in, detours on idle links) stays within 25% of the healthy time; a single ring,
  whose detours share links it already uses, loses more than half its bandwidth."""
  healthy = _time("torus:16x16", "all-reduce", "2d").time_s
  holes = [(3, 5), (9, 12)]
  damaged = _time("torus:16x16", "all-reduce", "2d", failed_chips=holes).time_s
  assert healthy < damaged < 1.25 * healthy
  ring = _time("torus:16x16", "all-reduce", "ring").time_s
  ring_damaged = _time("torus:16x16", "all-reduce", "ring", failed_chips=holes).time_s
  assert ring_damaged > 1.5 * ring


@pytest.mark.parametrize("X,Y", [(6, 4), (8, 8)])
def test_2d_mesh_rings_run_folded(X, Y):
  """No wrap-around: each row and column ring runs out over the even chips and back over the
  odd ones, so every hop spans at most 2 links and each link direction carries one message
  per step: the torus's bandwidth term with twice its hop latency."""
  t = _time(f"mesh:{X}x{Y}", "all-reduce", "2d")
  want = 2 * (X + Y - 2) * 2 * ALPHA + (2 * (X - 1) / X + 2 * (Y - 1) / (X * Y)) * N / B
  assert t.steps == 2 * (X + Y - 2)
  assert t.time_s == pytest.approx(want, rel=1e-9)
