"""The simulator's real-machine terms, each against its own closed form: 3-D tori, shared
NICs, the efficiency terms (link efficiency, protocols, launch) and NVLS in-network
reduction; with the terms off the ideal model is unchanged (test_commsim_timing.py)."""
import math

import numpy as np
import pytest

from harness.commsim import algorithms, functional, timing
from harness.commsim.machine import PRESETS, Efficiency, Machine, Protocol

B, ALPHA, N = 40e9, 2e-6, 64e6


@pytest.mark.parametrize("topology", ["torus:4x4x4", "torus:4x3x2", "mesh:4x4x2", "torus:2x2x2"])
def test_3d_schedules_sum_exactly(topology):
  machine = Machine(topology, link_bandwidth=B)
  for name in algorithms.applicable(machine, "all-reduce"):
    for collective in ("all-reduce", "reduce-scatter", "all-gather"):
      verdict = functional.run(machine, algorithms.build(machine, collective, name), 1024)
      assert verdict.ok, (topology, name, collective, verdict.detail)
  assert "3d" in algorithms.applicable(machine, "all-reduce")


@pytest.mark.parametrize("X,Y,Z", [(4, 4, 4), (8, 4, 2), (6, 4, 4)])
def test_3d_torus_closed_form(X, Y, Z):
  """Reduce-scatter along x, then y, all-reduce along z, all-gather back: 2(X+Y+Z-3) steps,
  [2(X-1)/X + 2(Y-1)/(XY) + 2(Z-1)/(XYZ)] n/B."""
  machine = Machine(f"torus:{X}x{Y}x{Z}", link_bandwidth=B, link_latency=ALPHA)
  t = timing.simulate(machine, algorithms.build(machine, "all-reduce", "3d"), N)
  assert t.steps == 2 * (X + Y + Z - 3)
  want = (2 * (X + Y + Z - 3) * ALPHA
          + (2 * (X - 1) / X + 2 * (Y - 1) / (X * Y) + 2 * (Z - 1) / (X * Y * Z)) * N / B)
  assert t.time_s == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("topology", ["torus:4x4x4", "torus:4x3x2", "mesh:4x4x2"])
def test_3d_ring_is_a_neighbour_cycle(topology):
  """The comb snakes through the z-layers, so every hop of the ring is one link and a ring
  all-reduce meets the ring's closed form, as on 2-D."""
  machine = Machine(topology, link_bandwidth=B, link_latency=ALPHA)
  order = machine.ring_order()
  assert sorted(order) == list(range(machine.num_chips))
  assert all(len(machine.route(a, b)) == 1 for a, b in zip(order, order[1:] + order[:1]))
  p = machine.num_chips
  t = timing.simulate(machine, algorithms.build(machine, "all-reduce", "ring"), N)
  assert t.time_s == pytest.approx(2 * (p - 1) * ALPHA + 2 * (p - 1) / p * N / B, rel=1e-9)


def test_3d_coordinates_and_routes():
  machine = Machine("torus:4x3x2", link_bandwidth=B)
  assert machine.chip_id((1, 2, 1)) == (1 * 3 + 2) * 4 + 1
  assert machine.coords(machine.chip_id((3, 1, 1))) == (3, 1, 1)
  # x first, then y, then z, the short way round: (0,0,0) -> (3,1,1) is 1 + 1 + 1 hops
  assert len(machine.route(machine.chip_id((0, 0, 0)), machine.chip_id((3, 1, 1)))) == 3
  # x (4 a line, 6 lines) and y (3 a line, 8 lines) wrap round; z of 2: 1 a line, 12 lines
  assert machine.num_links == 2 * (4 * 6 + 3 * 8 + 1 * 12)


def test_shared_nics_cap_the_network_at_the_node_s_ports():
  """3 nodes of 8 GPUs, 4 NICs a node: one ring per rail, two rails on each NIC, so the
  network carries nics x bandwidth a node: a bus bandwidth of 4 x 25 GB/s for a large
  vector (no latency), where one NIC a GPU gives 8 x 25."""
  for nics, want in ((4, 100e9), (8, 200e9)):
    machine = Machine("multinode:3x8", link_bandwidth=300e9, network_bandwidth=25e9,
                      nics_per_node=nics)
    t = timing.simulate(machine, algorithms.build(machine, "all-reduce", "multiring"), 1e12)
    assert t.busbw == pytest.approx(want, rel=1e-9)
    assert functional.run(machine, algorithms.build(machine, "all-reduce", "multiring"),
                          1024).ok
  shared = Machine("multinode:3x8", link_bandwidth=300e9, network_bandwidth=25e9,
                   nics_per_node=4)
  assert "4 NICs a node" in shared.describe()
  assert any(name.startswith("nic") for name in map(shared.vertex_name,
                                                     range(shared.num_vertices)))


def test_routes_through_switches_equal_the_search():
  for nics in (2, 4):
    machine = Machine("multinode:3x4", link_bandwidth=B, network_bandwidth=B / 8,
                      nics_per_node=nics)
    for u in range(machine.num_chips):
      for v in range(machine.num_chips):
        if u != v:
          assert len(machine.route(u, v)) == len(machine._shortest(u, v))


def test_protocols_and_launch():
  """One protocol at half the bandwidth with a step latency, pieces of 1 MB: a ring on 8
  chips takes launch + 2(p-1) (hop + latency x pieces) + 2(p-1)/p n / (B eta / 2); with
  two protocols the faster one for each size."""
  p, eta, launch, lat, piece = 8, 0.8, 10e-6, 3e-6, 1e6
  slow = Protocol("half", lat, 0.5, piece)
  machine = Machine("ring:8", link_bandwidth=B, link_latency=ALPHA,
                    efficiency=Efficiency(link=eta, launch=launch, protocols=(slow,)))
  t = timing.simulate(machine, algorithms.build(machine, "all-reduce", "ring"), N)
  pieces = N / p / piece
  want = (launch + 2 * (p - 1) * (ALPHA + lat * pieces)
          + 2 * (p - 1) / p * N / (B * eta * 0.5))
  assert t.time_s == pytest.approx(want, rel=1e-12) and t.protocol == "half"
  quick = Protocol("quick", 0.1e-6, 0.25)
  both = Machine("ring:8", link_bandwidth=B, link_latency=ALPHA,
                 efficiency=Efficiency(link=eta, launch=launch, protocols=(slow, quick)))
  small = timing.simulate(both, algorithms.build(both, "all-reduce", "ring"), 1e3)
  large = timing.simulate(both, algorithms.build(both, "all-reduce", "ring"), 1e9)
  assert (small.protocol, large.protocol) == ("quick", "half")


def test_no_efficiency_terms_is_the_ideal_model():
  ideal = Machine("torus:4x4", link_bandwidth=B, link_latency=ALPHA, overhead=1e-6)
  same = Machine("torus:4x4", link_bandwidth=B, link_latency=ALPHA, overhead=1e-6,
                 efficiency=Efficiency())
  for name in ("ring", "2d"):
    a = timing.simulate(ideal, algorithms.build(ideal, "all-reduce", name), N)
    b = timing.simulate(same, algorithms.build(same, "all-reduce", name), N)
    assert a.time_s == b.time_s and a.protocol == "ideal"


def test_nvls_closed_form_and_data():
  """The switch sums and multicasts: a port carries n (1 + 1/p) each way, pipelined in
  pieces with the multicast one piece (at most half the vector) behind."""
  p, bw = 8, 450e9
  eff = Efficiency(nvls=0.6, nvls_latency=5e-6, launch=20e-6, nvls_piece=10e6)
  machine = Machine(f"multinode:1x{p}", link_bandwidth=bw, network_bandwidth=50e9,
                    efficiency=eff)
  assert "nvls" in algorithms.applicable(machine, "all-reduce")
  schedule = algorithms.build(machine, "all-reduce", "nvls")
  for n in (4e6, 1e9):
    t = timing.simulate(machine, schedule, n)
    want = 25e-6 + (n * (1 + 1 / p) + min(n / 2, 10e6)) / (bw * 0.6)
    assert t.time_s == pytest.approx(want, rel=1e-12)
    assert t.busbw == pytest.approx(n / want * 2 * (p - 1) / p, rel=1e-12)
  assert functional.run(machine, schedule, 1024).ok
  two_nodes = Machine("multinode:2x8", link_bandwidth=bw, network_bandwidth=50e9,
                      efficiency=eff)
  assert "nvls" not in algorithms.applicable(two_nodes, "all-reduce")
  assert "nvls" not in algorithms.applicable(
      Machine("multinode:1x8", link_bandwidth=bw, network_bandwidth=50e9), "all-reduce")


def test_efficiency_lowers_the_ideal_figure_to_the_link_s_share():
  """dgx-a100's 1 GB all-reduce: the ideal model gives the link's 300 GB/s bus bandwidth;
  with the fitted terms it is the link efficiency's share, about what NCCL reaches."""
  preset = PRESETS["dgx-a100"]
  kwargs = dict(link_bandwidth=preset.link_bandwidth, network_bandwidth=25e9)
  ideal = Machine("multinode:1x8", **kwargs)
  real = Machine("multinode:1x8", **kwargs, efficiency=preset.efficiency)
  best = lambda m: max(timing.simulate(m, algorithms.build(m, "all-reduce", a), 1e9).busbw
                       for a in algorithms.applicable(m, "all-reduce"))
  assert best(ideal) == pytest.approx(300e9, rel=1e-9)
  assert 0.7 * 300e9 < best(real) < preset.efficiency.link * 300e9 * (1 + 1e-9)
  assert math.isclose(np.float64(best(real)) / 1e9, best(real) / 1e9)


def test_the_tpu_v3_preset_pays_a_hop_a_step_and_no_message_overhead():
  """TPU v3 on 4,096 chips (a 64x64 torus, v0.7's tpu-v3-8192): the 2-D all-reduce of a 30 MiB
  bucket takes 2(64 + 64 - 2) = 252 steps of 1 us (ASTRA-sim's TPU v3 link latency, no
  per-message term) plus [2 x 63/64 + 2 x 63/4096] n / 50 GB/s, as written out by hand: 1.51 ms
  (with the 5 us a message it once assumed, 252 x 6 us alone were 1.51 ms)."""
  preset = PRESETS["tpu-v3"]
  assert (preset.link_latency, preset.overhead, preset.link_bandwidth) == (1e-6, 0.0, 50e9)
  machine = Machine("torus:64x64", link_bandwidth=preset.link_bandwidth,
                    link_latency=preset.link_latency, overhead=preset.overhead,
                    injection_bandwidth=preset.injection_bandwidth)
  n = 30 * 2 ** 20
  t = timing.simulate(machine, algorithms.build(machine, "all-reduce", "2d"), n)
  assert t.steps == 252
  want = 252 * 1e-6 + (2 * 63 / 64 + 2 * 63 / 4096) * n / 50e9
  assert t.time_s == pytest.approx(want, rel=1e-9)
  assert t.time_s == pytest.approx(1.51e-3, abs=0.005e-3)
