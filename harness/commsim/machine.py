"""The machine a collective runs on: chips, directed links, failures and routes.

Topologies (`--topology`):
  ring:N           N chips in a ring
  mesh:XxY         2-D grid, chip (x, y) linked to its 4 neighbours, no wrap-around
  torus:XxY        2-D grid with wrap-around links (TPU v2/v3 pods)
  torus:XxYxZ      3-D grid with wrap-around links, 6 neighbours a chip (TPU v4/v5p slices);
                   mesh:XxYxZ likewise without them
  multinode:NxG    N nodes of G accelerators; inside a node every accelerator has a port on the
                   node's switch (NVSwitch); each accelerator also has its own port on a
                   non-blocking network switch (one InfiniBand rail per GPU, as DGX nodes),
                   or, with nics_per_node K < G, G/K accelerators share each of K NICs

Every physical link is full duplex: two directed links, each with its own bandwidth (bytes/s)
and latency (s per hop). Switches are vertices that forward but hold no data. A message's
latency is the per-message overhead plus the latencies of the hops on its route; its
bandwidth share is decided by the timing model (timing.py). Chips are numbered row-major:
chip (x, y) of a mesh is y * X + x, (x, y, z) is (z * Y + y) * X + x; GPU g of node n is
n * G + g.
"""
import collections
import dataclasses
import math
import re

import numpy as np

from harness.errors import UsageError

TOPOLOGY_SYNTAX = ("ring:N, mesh:XxY[xZ], torus:XxY[xZ] or multinode:NxG (e.g. torus:32x32, "
                   "torus:8x8x8)")


@dataclasses.dataclass(frozen=True)
class Protocol:
  """How a collective library moves a message (NCCL's LL, LL128, Simple): each piece of at
  most `piece_bytes` pays `step_latency` (the flag/synchronisation a step waits for), and the
  payload gets `bandwidth_fraction` of the link (LL sends a 4-byte flag with every 4 bytes of
  data: 1/2; LL128 120 of every 128 bytes: 15/16; Simple the whole line: 1)."""
  name: str
  step_latency: float
  bandwidth_fraction: float = 1.0
  piece_bytes: float = math.inf


@dataclasses.dataclass(frozen=True)
class Efficiency:
  """What the ideal alpha-beta model leaves out, as named terms (figures fitted to
  measurements.csv by calibrate.py, see docs/commsim.md):
  link, network  achievable fraction of a link's (NVLink/ICI) or rail's (InfiniBand)
                 bandwidth: protocol headers, packet and flow-control overhead
  launch         seconds a collective costs before its first message (kernel launch, set-up)
  protocols      the library's protocols; a collective runs the fastest for its size, so
                 small messages go with low latency and large ones at full bandwidth
  nvls           NVSwitch in-network reduction (NVLink SHARP, H100): achievable fraction of a
                 port's bandwidth for it, 0 where the machine has none; nvls_latency its launch;
                 nvls_piece the pieces its two phases (reduce in the switch, multicast the sum)
                 are pipelined in: the multicast trails the reduce by one piece
  """
  link: float = 1.0
  network: float = 1.0
  launch: float = 0.0
  protocols: tuple = ()
  nvls: float = 0.0
  nvls_latency: float = 0.0
  nvls_piece: float = 0.0


@dataclasses.dataclass(frozen=True)
class Preset:
  """Link figures of a real machine, with where they come from."""
  topology: str
  link_bandwidth: float          # bytes/s per direction (chip links; intra-node ports)
  link_latency: float            # s per hop
  overhead: float                # s per message (DMA/launch set-up)
  injection_bandwidth: float     # bytes/s a chip can send in total (inf: no limit)
  network_bandwidth: float = 0.0  # multinode: bytes/s per direction of one rail
  network_latency: float = 0.0
  source: str = ""
  peak_flops: float = 0.0         # FLOP/s per chip (bf16 dense), for a pipeline step's compute
  nics_per_node: int = 0          # multinode: network ports per node (0: one per accelerator)
  efficiency: Efficiency | None = None   # None: the ideal model
  # bytes/s of a chip's own memory (HBM): what a memory-bound part of a step (the optimizer's
  # update, an embedding lookup) runs at; 0 where no spec gives it
  memory_bandwidth: float = 0.0


# NCCL on DGX nodes: the terms calibrate.py fits to measurements.csv (`python -m
# harness.commsim.calibrate --fit` prints them; a test checks they are still its fit).
A100_NCCL = Efficiency(
    link=0.8014, network=1.0, launch=27.69e-6,
    protocols=(Protocol("LL", 0.0067e-6, 0.5), Protocol("LL128", 42.05e-6, 15 / 16, 1.0e6),
               Protocol("Simple", 7.09e-6, 1.0, 16.52e6)))
H100_NCCL = dataclasses.replace(A100_NCCL, nvls=0.6652, nvls_latency=5.570e-6, launch=28.25e-6,
                                nvls_piece=12.52e6)

# TPU ICI: the link efficiency fitted to the v5e all-gather profile of measurements.csv.
TPU_ICI = Efficiency(link=0.7468)


def _node_preset(node_bandwidth, network_bandwidth, **figures) -> Preset:
  """A server of 8 accelerators (a DGX node, an HLS Gaudi server) joined by a switch or
  all-to-all ports at `node_bandwidth` a direction, with `network_bandwidth` a direction a rail
  out of the node; 1 us a hop, 5 us a message, 2.5 us on the network (assumed, as every node
  preset's)."""
  return Preset("multinode:4x8", node_bandwidth, 1e-6, 5e-6, math.inf,
                network_bandwidth=network_bandwidth, network_latency=2.5e-6, **figures)


def _torus_preset(topology, link_bandwidth, **figures) -> Preset:
  """A TPU slice: chips on an ICI torus, `link_bandwidth` a link and direction, 1 us a hop (the
  scaling book), no per-message overhead modelled."""
  return Preset(topology, link_bandwidth, 1e-6, 0.0, math.inf, **figures)


PRESETS = {
    # 6.4 TB/s bisection (Cloud TPU v3 docs) over the 2 x 32 links a 32x32 torus cut crosses,
    # both directions counted: 50 GB/s per direction and link. 1 us a hop: ASTRA-sim's TPU v3
    # validation (astra-sim-docs, validation/hardware/tpu-validation.md: "Link Latency is 1 us
    # [as per TPU research team]"), whose setup for its v3-8 and v3-32 all-reduce checks names no
    # other latency; so, as every TPU preset here, no per-message overhead (it was an assumed
    # 5 us, which the steps of v0.7's 4,096-chip logs contradict: docs/simulator.md).
    # HBM: 32 GiB at 900 GB/s a chip (Cloud TPU system architecture, v3 table).
    "tpu-v3": _torus_preset(
        "torus:32x32", 50e9,
        source="Cloud TPU v3 docs: 1024 chips, 2-D torus, 6.4 TB/s bisection "
               "(per-link figure derived); 1 us a hop: ASTRA-sim's TPU v3 validation "
               "(the TPU research team's figure); 123 TFLOP/s bf16, 900 GB/s HBM per chip",
        peak_flops=123e12, memory_bandwidth=900e9),
    # DGX A100: NVLink 3 through NVSwitch, 600 GB/s per GPU both directions together; 8 HDR
    # InfiniBand NICs of 200 Gb/s, one per GPU (25 GB/s per direction). Latencies assumed.
    # A100 SXM4 80GB: 2,039 GB/s HBM2e (the 40GB part: 1,555; the A100 datasheet).
    "dgx-a100": _node_preset(
        300e9, 25e9,
        source="NVIDIA DGX A100 datasheet: NVLink 600 GB/s per GPU, 8 x 200 Gb/s "
               "HDR InfiniBand (latencies assumed); A100 SXM4 80GB datasheet: "
               "312 TFLOP/s bf16 dense, 2,039 GB/s HBM2e",
        peak_flops=312e12, nics_per_node=8, efficiency=A100_NCCL,
        memory_bandwidth=2039e9),
    # DGX H100: NVLink 4 through NVSwitch, 900 GB/s per GPU both directions together, with
    # in-network reduction (NVLink SHARP); 8 NDR InfiniBand NICs of 400 Gb/s (50 GB/s).
    # H100 SXM5: 3.35 TB/s HBM3 (H100 datasheet).
    "dgx-h100": _node_preset(
        450e9, 50e9,
        source="NVIDIA DGX H100 datasheet: NVLink 900 GB/s per GPU, 8 x 400 Gb/s "
               "NDR InfiniBand; H100 SXM datasheet: 989 TFLOP/s bf16 dense, "
               "3.35 TB/s HBM3",
        peak_flops=989e12, nics_per_node=8, efficiency=H100_NCCL,
        memory_bandwidth=3.35e12),
    # HGX H200: the H100's NVLink 4 / NVSwitch (900 GB/s a GPU) and compute, HBM3e at 4.8 TB/s
    # (H200 datasheet); 8 ConnectX-7 NDR NICs as DGX H100. Its NVLink hardware is the H100's,
    # so the H100's measured NCCL terms apply; no H200 collective measurement was reachable.
    "dgx-h200": _node_preset(
        450e9, 50e9,
        source="NVIDIA H200 datasheet: 989 TFLOP/s bf16 dense (1,979 with "
               "sparsity), 4.8 TB/s HBM3e, NVLink 900 GB/s; DGX H200: 8 x 400 Gb/s "
               "ConnectX-7; NCCL terms: the H100's (the same NVLink 4 switch)",
        peak_flops=989e12, nics_per_node=8, efficiency=H100_NCCL,
        memory_bandwidth=4.8e12),
    # DGX B200: NVLink 5 through NVSwitch, 1.8 TB/s per GPU both directions together (900 GB/s
    # a direction); 8 ConnectX-7 NICs of 400 Gb/s. B200 (HGX, 1,000 W): 2,250 TFLOP/s bf16
    # dense (4,500 with sparsity), 8 TB/s HBM3e. No B200 NCCL measurement was reachable: the
    # H100's terms (NVLink SHARP included) are assumed, said so in the source.
    "dgx-b200": _node_preset(
        900e9, 50e9,
        source="NVIDIA DGX B200 / HGX B200 datasheets: NVLink 5 1.8 TB/s per GPU, "
               "8 x 400 Gb/s ConnectX-7, 2,250 TFLOP/s bf16 dense, 8 TB/s HBM3e; "
               "NCCL terms: the H100's (assumed, no B200 measurement)",
        peak_flops=2250e12, nics_per_node=8, efficiency=H100_NCCL,
        memory_bandwidth=8e12),
    # TPU v4: a 3-D torus of 4,096 chips, 6 ICI ports a chip. 45 GB/s a link and direction
    # (the scaling book's table; 24 TB/s bisection over the 2 x 16 x 16 links a cut of a
    # 16x16x16 torus crosses gives 46.9), 1 us a hop (the book: "typically around 1us").
    # No TPU v4 collective measurement was reachable: the ICI efficiency is v5e's (below).
    "tpu-v4": _torus_preset(
        "torus:16x16x16", 45e9,
        source="Cloud TPU v4 docs: 4096 chips, 3-D torus, 24 TB/s bisection, 275 "
               "TFLOP/s bf16, 1,200 GB/s HBM2; link and hop figures: the scaling "
               "book (jax-ml); ICI efficiency measured on v5e",
        peak_flops=275e12, efficiency=TPU_ICI, memory_bandwidth=1200e9),
    # TPU v5e: a 2-D torus of 256 chips, 4 ports a chip, 400 GB/s ICI a chip both ways
    # together (Cloud TPU v5e docs): 50 GB/s a link and direction; 1 us a hop.
    "tpu-v5e": _torus_preset(
        "torus:16x16", 50e9,
        source="Cloud TPU v5e docs: 256 chips, 2-D torus, 400 GB/s ICI a chip, "
               "197 TFLOP/s bf16, 819 GB/s HBM2; hop latency: the scaling book",
        peak_flops=197e12, efficiency=TPU_ICI, memory_bandwidth=819e9),
    # TPU v5p: a 3-D torus (8,960 chips a pod, 6,144 in one slice), 6 ICI ports a chip, 1,200
    # GB/s ICI a chip both directions together (Cloud TPU v5p docs): 100 GB/s a link and
    # direction; 459 TFLOP/s bf16, 2,765 GB/s HBM2e. ICI efficiency: v5e's measurement.
    "tpu-v5p": _torus_preset(
        "torus:16x16x16", 100e9,
        source="Cloud TPU v5p docs: 3-D torus, 1,200 GB/s bidirectional ICI a chip "
               "(6 ports), 459 TFLOP/s bf16, 2,765 GB/s HBM2e; hop latency: the "
               "scaling book; ICI efficiency measured on v5e",
        peak_flops=459e12, efficiency=TPU_ICI, memory_bandwidth=2765e9),
    # Trillium (TPU v6e): a 2-D torus of 256 chips, 4 ICI ports, 800 GB/s ICI a chip both
    # directions together (Cloud TPU v6e docs): 100 GB/s a link and direction; 918 TFLOP/s
    # bf16, 1,638 GB/s HBM.
    "tpu-v6e": _torus_preset(
        "torus:16x16", 100e9,
        source="Cloud TPU v6e (Trillium) docs: 256 chips, 2-D torus, 800 GB/s "
               "bidirectional ICI a chip (4 ports), 918 TFLOP/s bf16, 1,638 GB/s "
               "HBM; ICI efficiency measured on v5e",
        peak_flops=918e12, efficiency=TPU_ICI, memory_bandwidth=1638e9),
    # Gaudi (HL-205): RoCE on the chip, 10 x 100 GbE; in the HLS-1 server 7 of them join the
    # 8 cards all-to-all (one port to each peer: 12.5 GB/s a direction to each, 87.5 GB/s a
    # card in all, drawn as a node switch) and 3 go out (37.5 GB/s a card). 32 GB HBM2 at
    # 1 TB/s. Habana publishes no bf16 peak for it: peak 0 (no chip-speed ratio to or from
    # it). No HCCL measurement: the ideal model.
    "gaudi": _node_preset(
        87.5e9, 37.5e9,
        source="Habana Gaudi white paper / HLS-1: 10 x 100 GbE RoCE on chip (7 "
               "all-to-all in the server, 3 out), 32 GB HBM2 at 1 TB/s; no bf16 "
               "peak published; latencies assumed; ideal (no HCCL measurement)",
        memory_bandwidth=1e12),
    # Gaudi2 (HL-225): 24 x 100 GbE RoCE on chip; in the HLS-Gaudi2 server 21 join the 8
    # cards all-to-all (3 to each peer: 37.5 GB/s a direction to each, 262.5 GB/s a card)
    # and 3 go out (37.5 GB/s). 432 TFLOP/s bf16 (MME), 2.45 TB/s HBM2e.
    "gaudi2": _node_preset(
        262.5e9, 37.5e9,
        source="Intel Gaudi 2 / Gaudi 3 white papers: 24 x 100 GbE RoCE on chip "
               "(21 all-to-all in the server, 3 out), 432 TFLOP/s bf16 (MME), "
               "2.45 TB/s HBM2e; latencies assumed; ideal (no HCCL measurement)",
        peak_flops=432e12, memory_bandwidth=2.45e12),
    # Gaudi3 (HL-325): 24 x 200 GbE RoCE on chip, 21 all-to-all in the server (75 GB/s a
    # direction to each peer, 525 GB/s a card), 3 out (75 GB/s). 1,835 TFLOP/s bf16 (MME),
    # 3.7 TB/s HBM2e.
    "gaudi3": _node_preset(
        525e9, 75e9,
        source="Intel Gaudi 3 white paper: 24 x 200 GbE RoCE on chip (21 "
               "all-to-all in the server, 3 out), 1,835 TFLOP/s bf16 (MME), 3.7 TB/s "
               "HBM2e; latencies assumed; ideal (no HCCL measurement)",
        peak_flops=1835e12, memory_bandwidth=3.7e12),
}


def parse_topology(text: str) -> tuple[str, tuple[int, ...]]:
  m = re.fullmatch(r"(ring):(\d+)|(multinode):(\d+)x(\d+)|(mesh|torus):(\d+)x(\d+)(?:x(\d+))?",
                   text.strip())
  if not m:
    raise UsageError(f"--topology {text!r} is not a topology; allowed: {TOPOLOGY_SYNTAX}")
  kind = m.group(1) or m.group(3) or m.group(6)
  shape = tuple(int(g) for g in m.groups()[{"ring": 1, "multinode": 3}.get(kind, 6):]
                [:{"ring": 1, "multinode": 2}.get(kind, 3)] if g is not None)
  low = 2 if kind == "ring" else 1
  if min(shape) < low or math.prod(shape) < 2:
    raise UsageError(f"--topology {text!r} has fewer than 2 chips; allowed: {TOPOLOGY_SYNTAX}")
  return kind, shape


class Machine:
  def __init__(self, topology: str, link_bandwidth: float, link_latency: float = 0.0,
               overhead: float = 0.0, injection_bandwidth: float = math.inf,
               network_bandwidth: float = 0.0, network_latency: float = 0.0,
               failed_chips=(), failed_links=(), nics_per_node: int = 0,
               efficiency: Efficiency | None = None):
    self.topology = topology
    self.kind, self.shape = parse_topology(topology)
    self.num_chips = math.prod(self.shape)
    self.overhead = float(overhead)
    self.injection_bandwidth = float(injection_bandwidth)
    if link_bandwidth <= 0 or (self.kind == "multinode" and network_bandwidth <= 0):
      raise UsageError("link bandwidth must be > 0 (and the network's, for multinode)")
    gpus = self.shape[-1]
    self.nics_per_node = nics_per_node if self.kind == "multinode" and nics_per_node else gpus
    if self.kind == "multinode" and (self.nics_per_node < 1 or gpus % self.nics_per_node):
      raise UsageError(f"{nics_per_node} NICs per node do not divide {gpus} accelerators a "
                       "node; allowed: a divisor of the accelerators per node")
    self.efficiency = efficiency or Efficiency()
    # The ideal model: one protocol whose steps cost the per-message overhead.
    self.protocols = self.efficiency.protocols or (Protocol("ideal", self.overhead),)
    self._src, self._dst, self._bw, self._lat, self._net = [], [], [], [], []
    self._index = {}
    self.num_vertices = self.num_chips
    self._build(link_bandwidth, link_latency, network_bandwidth, network_latency)
    self.link_src = np.array(self._src, np.int64)
    self.link_dst = np.array(self._dst, np.int64)
    self.link_bandwidth = np.array(self._bw, np.float64)
    self.link_is_network = np.array(self._net, bool)
    # what a link carries at best: its bandwidth x the achievable fraction (1 when ideal)
    self.achievable_bandwidth = self.link_bandwidth * np.where(
        self.link_is_network, self.efficiency.network, self.efficiency.link)
    self.link_latency = np.array(self._lat, np.float64)
    self.num_links = len(self._src)
    self.alive = np.ones(self.num_chips, bool)
    self.link_alive = np.ones(self.num_links, bool)
    for chip in failed_chips:
      self.alive[self.chip_id(chip)] = False
    for a, b in failed_links:
      self._fail_link(a, b)
    self._adjacency = None
    self._routes = {}
    self._check_connected()

  # ------------------------------------------------------------------ construction
  def _link(self, u, v, bw, lat, network=False):
    for a, b in ((u, v), (v, u)):
      if (a, b) not in self._index:
        self._index[(a, b)] = len(self._src)
        self._src.append(a), self._dst.append(b), self._bw.append(bw), self._lat.append(lat)
        self._net.append(network)

  def _build(self, bw, lat, net_bw, net_lat):
    if self.kind == "ring":
      n = self.shape[0]
      for i in range(n):
        self._link(i, (i + 1) % n, bw, lat)
    elif self.kind in ("mesh", "torus"):
      wrap = self.kind == "torus"
      for chip in range(self.num_chips):
        here = self.coords(chip)
        for axis, size in enumerate(self.shape):
          if here[axis] + 1 < size or (wrap and size > 2):
            there = list(here)
            there[axis] = (here[axis] + 1) % size
            self._link(chip, self.chip_id(there), bw, lat)
    else:             # multinode: node switches, [shared NICs,] then the network switch
      nodes, gpus = self.shape
      nics = self.nics_per_node
      shared = nics < gpus
      network = self.num_chips + nodes + (nodes * nics if shared else 0)
      self.num_vertices = network + 1
      for n in range(nodes):               # node-switch links first: BFS prefers them
        for g in range(gpus):
          self._link(n * gpus + g, self.num_chips + n, bw, lat / 2)
      for chip in range(self.num_chips):
        if not shared:
          self._link(chip, network, net_bw, net_lat / 2, network=True)
          continue
        n, g = divmod(chip, gpus)           # GPUs g*K//G share NIC: the NIC's rail is shared
        nic = self.num_chips + nodes + n * nics + g * nics // gpus
        self._link(chip, nic, net_bw, 0.0, network=True)
        self._link(nic, network, net_bw, net_lat / 2, network=True)

  def _fail_link(self, a, b):
    u, v = self.chip_id(a), self.chip_id(b)
    if (u, v) not in self._index:
      raise UsageError(f"--failed-link {self.format(u)}-{self.format(v)} joins no linked "
                       f"chips of {self.topology}; allowed: two neighbouring chips")
    self.link_alive[self._index[(u, v)]] = False
    self.link_alive[self._index[(v, u)]] = False

  # ------------------------------------------------------------------ coordinates
  def chip_id(self, coords) -> int:
    coords = tuple(int(c) for c in coords)
    if self.kind == "ring":
      ok = len(coords) == 1 and 0 <= coords[0] < self.shape[0]
      if ok:
        return coords[0]
    else:
      ok = len(coords) == len(self.shape) and all(0 <= c < s for c, s in zip(coords, self.shape))
      if ok:
        if self.kind == "multinode":
          return coords[0] * self.shape[1] + coords[1]
        chip = 0
        for c, size in zip(reversed(coords), reversed(self.shape)):
          chip = chip * size + c
        return chip
    letters = "XYZ"[:len(self.shape)]
    want = ("I with 0 <= I < %d" % self.shape[0] if self.kind == "ring" else
            "NODE,GPU" if self.kind == "multinode" else
            ",".join(letters) + " with " + ", ".join(f"{a} < {n}" for a, n in zip(letters,
                                                                               self.shape)))
    raise UsageError(f"chip {','.join(map(str, coords))} is not on {self.topology}; "
                     f"allowed: {want}")

  def coords(self, chip: int) -> tuple[int, ...]:
    if self.kind == "ring":
      return (chip,)
    if self.kind == "multinode":
      return divmod(chip, self.shape[1])
    out = []
    for size in self.shape:
      chip, c = divmod(chip, size)
      out.append(c)
    return tuple(out)

  def format(self, chip: int) -> str:
    return ",".join(map(str, self.coords(chip)))

  @property
  def live_chips(self) -> np.ndarray:
    return np.flatnonzero(self.alive)

  def grid(self) -> np.ndarray:
    """Chip ids as [rows, columns]: a 2-D mesh's rows along x; a multinode's nodes."""
    if self.kind == "ring" or len(self.shape) != 2:
      raise ValueError("only a 2-D machine has rows and columns")
    if self.kind == "multinode":
      return np.arange(self.num_chips).reshape(self.shape)
    X, Y = self.shape
    return np.arange(self.num_chips).reshape(Y, X)

  def ring_order(self) -> list[int]:
    """A cycle through every chip (live or not) whose consecutive chips are neighbours where
    the topology allows: a comb on a mesh (exact when Y is even), node-major on multinode."""
    if self.kind in ("ring", "multinode"):
      return list(range(self.num_chips))
    return self.comb(0)

  def comb(self, first_axis: int) -> list[int]:
    """comb_cycle over (the `first_axis` side, the other sides snaked into one): in 3-D the
    rows are the (y, z) lines taken boustrophedon (z-layers in turn, y back and forth), so
    consecutive rows are neighbours and the cycle is a neighbour cycle when it is one in 2-D."""
    sides = list(self.shape)
    rest = [a for a in range(len(sides)) if a != first_axis]
    lines = _snake(rest, sides)
    order = []
    for a, r in comb_cycle(sides[first_axis], len(lines)):
      coords = [0] * len(sides)
      coords[first_axis] = a
      for axis, c in zip(rest, lines[r]):
        coords[axis] = c
      order.append(self.chip_id(coords))
    return order

  # ------------------------------------------------------------------ routes
  def _live_adjacency(self):
    if self._adjacency is None:
      adj = [[] for _ in range(self.num_vertices)]
      for link in np.flatnonzero(self.link_alive):
        u, v = int(self.link_src[link]), int(self.link_dst[link])
        if (u >= self.num_chips or self.alive[u]) and (v >= self.num_chips or self.alive[v]):
          adj[u].append((v, int(link)))
      self._adjacency = adj
    return self._adjacency

  def _check_connected(self):
    live = self.live_chips
    if len(live) < 2:
      raise UsageError(f"{self.num_chips - len(live)} failed chips leave fewer than 2 live "
                       f"chips on {self.topology}")
    seen = self._bfs(int(live[0]))[0]
    cut = [c for c in live if seen[c] < 0]
    if cut:
      shown = " ".join(self.format(c) for c in cut[:5]) + (" ..." if len(cut) > 5 else "")
      raise UsageError(f"the failed chips/links disconnect {self.topology}: {len(cut)} live "
                       f"chips ({shown}) cannot reach chip {self.format(int(live[0]))}")

  def _bfs(self, source):
    adj = self._live_adjacency()
    parent = np.full(self.num_vertices, -1)
    via = np.full(self.num_vertices, -1)
    parent[source] = source
    queue = collections.deque([source])
    while queue:
      u = queue.popleft()
      for v, link in adj[u]:
        if parent[v] < 0:
          parent[v], via[v] = u, link
          queue.append(v)
    return parent, via

  def route(self, u: int, v: int) -> tuple[int, ...]:
    """Directed link ids from chip u to chip v over live chips and links: the direct link,
    else dimension-ordered (x then y, the shorter way round a torus), else a shortest path.
    Chips forward messages (TPU ICI routers do), so routes may pass through live chips."""
    key = (u, v)
    if key not in self._routes:
      self._routes[key] = self._find_route(u, v)
    return self._routes[key]

  def _find_route(self, u, v):
    link = self._index.get((u, v))
    if link is not None and self.link_alive[link]:
      return (link,)
    if self.kind in ("mesh", "torus"):
      path = self._dimension_ordered(u, v)
      if path is not None:
        return path
    if self.kind == "multinode":
      path = self._through_switches(u, v)
      if path is not None and all(self.link_alive[l] for l in path):
        return path
    return self._shortest(u, v)

  def _through_switches(self, u, v):
    """Multinode, the shortest route without a search (a search per pair is too slow at
    thousands of GPUs): through the node switch inside a node, else out through u's network
    port (or shared NIC) and in through v's."""
    nodes, gpus = self.shape
    (nu, gu), (nv, gv) = divmod(u, gpus), divmod(v, gpus)
    if nu == nv:
      switch = self.num_chips + nu
      return (self._index[(u, switch)], self._index[(switch, v)])
    network = self.num_vertices - 1
    if self.nics_per_node == gpus:
      return (self._index[(u, network)], self._index[(network, v)])
    first = self.num_chips + nodes
    nic_u = first + nu * self.nics_per_node + gu * self.nics_per_node // gpus
    nic_v = first + nv * self.nics_per_node + gv * self.nics_per_node // gpus
    return (self._index[(u, nic_u)], self._index[(nic_u, network)],
            self._index[(network, nic_v)], self._index[(nic_v, v)])

  def _dimension_ordered(self, u, v):
    start, target = list(self.coords(u)), self.coords(v)
    links, here = [], start
    for axis, size in enumerate(self.shape):
      delta = target[axis] - here[axis]
      if self.kind == "torus" and size > 2 and abs(delta) > size / 2:
        delta -= int(math.copysign(size, delta))
      step = 1 if delta > 0 else -1
      for _ in range(abs(delta)):
        nxt = list(here)
        nxt[axis] = (here[axis] + step) % size
        a, b = self.chip_id(here), self.chip_id(nxt)
        link = self._index[(a, b)]
        if not self.link_alive[link] or not self.alive[b]:
          return None
        links.append(link)
        here = nxt
    return tuple(links)

  def _shortest(self, u, v):
    parent, via = self._bfs(u)
    if parent[v] < 0:
      raise UsageError(f"no live route from chip {self.format(u)} to {self.format(v)}")
    links = []
    while v != u:
      links.append(int(via[v]))
      v = int(parent[v])
    return tuple(reversed(links))

  def vertex_name(self, v: int) -> str:
    if v < self.num_chips:
      return self.format(int(v))
    if v == self.num_vertices - 1 and self.kind == "multinode":
      return "network"
    nodes = self.shape[0]
    if v < self.num_chips + nodes:
      return f"switch{v - self.num_chips}"
    n, k = divmod(v - self.num_chips - nodes, self.nics_per_node)
    return f"nic{n}.{k}"

  def describe(self) -> str:
    dead = [self.format(c) for c in np.flatnonzero(~self.alive)]
    cut = self.num_links - int(self.link_alive.sum())
    nics = (f", {self.nics_per_node} NICs a node" if self.kind == "multinode"
            and self.nics_per_node < self.shape[-1] else "")
    return (f"{self.topology}, {len(self.live_chips)} live chips{nics}"
            + (f", failed chips {' '.join(dead)}" if dead else "")
            + (f", {cut // 2} failed links" if cut else ""))


def comb_cycle(X: int, Y: int) -> list[tuple[int, int]]:
  """A cycle through every (x, y) of an X x Y grid: row 0 left to right, rows 1..Y-1 snaking
  over columns 1..X-1, back up column 0. Neighbours all the way round when Y is even."""
  if X == 1 or Y == 1:
    return [(x, y) for y in range(Y) for x in range(X)]
  order = [(x, 0) for x in range(X)]
  for y in range(1, Y):
    order += [(x, y) for x in (range(X - 1, 0, -1) if y % 2 else range(1, X))]
  return order + [(0, y) for y in range(Y - 1, 0, -1)]


def _snake(axes, sides) -> list[tuple[int, ...]]:
  """Every coordinate tuple over `axes`, the first fastest, each axis running back and forth
  so that consecutive tuples differ by one step along one axis."""
  if len(axes) == 1:
    return [(c,) for c in range(sides[axes[0]])]
  inner = _snake(axes[:-1], sides)
  return [t + (k,) for k in range(sides[axes[-1]]) for t in (inner if k % 2 == 0 else inner[::-1])]


def parse_chip(text: str) -> tuple[int, ...]:
  try:
    return tuple(int(part) for part in text.split(","))
  except ValueError:
    raise UsageError(f"chip {text!r} is not a coordinate; allowed: X,Y (mesh/torus), I (ring) "
                     "or NODE,GPU (multinode)") from None


def parse_link(text: str):
  a, sep, b = text.partition("-")
  if not sep:
    raise UsageError(f"--failed-link {text!r} is not a link; allowed: X,Y-X,Y (two neighbours)")
  return parse_chip(a), parse_chip(b)
