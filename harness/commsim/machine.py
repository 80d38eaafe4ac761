"""The machine a collective runs on: chips, directed links, failures and routes.

Topologies (`--topology`):
  ring:N           N chips in a ring
  mesh:XxY         2-D grid, chip (x, y) linked to its 4 neighbours, no wrap-around
  torus:XxY        2-D grid with wrap-around links (TPU v2/v3 pods)
  multinode:NxG    N nodes of G accelerators; inside a node every accelerator has a port on the
                   node's switch (NVSwitch); each accelerator also has its own port on a
                   non-blocking network switch (one InfiniBand rail per GPU, as DGX nodes)

Every physical link is full duplex: two directed links, each with its own bandwidth (bytes/s)
and latency (s per hop). Switches are vertices that forward but hold no data. A message's
latency is the per-message overhead plus the latencies of the hops on its route; its
bandwidth share is decided by the timing model (timing.py). Chips are numbered row-major:
chip (x, y) of a mesh is y * X + x; GPU g of node n is n * G + g.
"""
import collections
import dataclasses
import math
import re

import numpy as np

from harness.errors import UsageError

TOPOLOGY_SYNTAX = "ring:N, mesh:XxY, torus:XxY or multinode:NxG (e.g. torus:32x32)"


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


PRESETS = {
    # 6.4 TB/s bisection (Cloud TPU v3 docs) over the 2 x 32 links a 32x32 torus cut crosses,
    # both directions counted: 50 GB/s per direction and link. Latency and overhead: assumed.
    "tpu-v3": Preset("torus:32x32", 50e9, 1e-6, 5e-6, math.inf,
                     source="Cloud TPU v3 docs: 1024 chips, 2-D torus, 6.4 TB/s bisection "
                            "(per-link figure derived; latencies assumed); 123 TFLOP/s bf16 "
                            "per chip", peak_flops=123e12),
    # DGX A100: NVLink 3 through NVSwitch, 600 GB/s per GPU both directions together; 8 HDR
    # InfiniBand NICs of 200 Gb/s, one per GPU (25 GB/s per direction). Latencies assumed.
    "dgx-a100": Preset("multinode:4x8", 300e9, 1e-6, 5e-6, math.inf,
                       network_bandwidth=25e9, network_latency=2.5e-6,
                       source="NVIDIA DGX A100 datasheet: NVLink 600 GB/s per GPU, 8 x 200 Gb/s "
                              "HDR InfiniBand (latencies assumed); A100: 312 TFLOP/s bf16 dense",
                       peak_flops=312e12),
}


def parse_topology(text: str) -> tuple[str, tuple[int, ...]]:
  m = re.fullmatch(r"(ring):(\d+)|(mesh|torus|multinode):(\d+)x(\d+)", text.strip())
  if not m:
    raise UsageError(f"--topology {text!r} is not a topology; allowed: {TOPOLOGY_SYNTAX}")
  kind = m.group(1) or m.group(3)
  shape = (int(m.group(2)),) if m.group(1) else (int(m.group(4)), int(m.group(5)))
  low = {"ring": (2,), "mesh": (1, 1), "torus": (1, 1), "multinode": (1, 1)}[kind]
  if any(s < lo for s, lo in zip(shape, low)) or math.prod(shape) < 2:
    raise UsageError(f"--topology {text!r} has fewer than 2 chips; allowed: {TOPOLOGY_SYNTAX}")
  return kind, shape


class Machine:
  def __init__(self, topology: str, link_bandwidth: float, link_latency: float = 0.0,
               overhead: float = 0.0, injection_bandwidth: float = math.inf,
               network_bandwidth: float = 0.0, network_latency: float = 0.0,
               failed_chips=(), failed_links=()):
    self.topology = topology
    self.kind, self.shape = parse_topology(topology)
    self.num_chips = math.prod(self.shape)
    self.overhead = float(overhead)
    self.injection_bandwidth = float(injection_bandwidth)
    if link_bandwidth <= 0 or (self.kind == "multinode" and network_bandwidth <= 0):
      raise UsageError("link bandwidth must be > 0 (and the network's, for multinode)")
    self._src, self._dst, self._bw, self._lat = [], [], [], []
    self._index = {}
    self.num_vertices = self.num_chips
    self._build(link_bandwidth, link_latency, network_bandwidth, network_latency)
    self.link_src = np.array(self._src, np.int64)
    self.link_dst = np.array(self._dst, np.int64)
    self.link_bandwidth = np.array(self._bw, np.float64)
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
  def _link(self, u, v, bw, lat):
    for a, b in ((u, v), (v, u)):
      if (a, b) not in self._index:
        self._index[(a, b)] = len(self._src)
        self._src.append(a), self._dst.append(b), self._bw.append(bw), self._lat.append(lat)

  def _build(self, bw, lat, net_bw, net_lat):
    if self.kind == "ring":
      n = self.shape[0]
      for i in range(n):
        self._link(i, (i + 1) % n, bw, lat)
    elif self.kind in ("mesh", "torus"):
      X, Y = self.shape
      wrap = self.kind == "torus"
      for y in range(Y):
        for x in range(X):
          if x + 1 < X or (wrap and X > 2):
            self._link(self.chip_id((x, y)), self.chip_id(((x + 1) % X, y)), bw, lat)
          if y + 1 < Y or (wrap and Y > 2):
            self._link(self.chip_id((x, y)), self.chip_id((x, (y + 1) % Y)), bw, lat)
    else:                                  # multinode: node switches, then the network switch
      nodes, gpus = self.shape
      network = self.num_chips + nodes
      self.num_vertices = network + 1
      for n in range(nodes):               # node-switch links first: BFS prefers them
        for g in range(gpus):
          self._link(n * gpus + g, self.num_chips + n, bw, lat / 2)
      for chip in range(self.num_chips):
        self._link(chip, network, net_bw, net_lat / 2)

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
      ok = len(coords) == 2 and all(0 <= c < s for c, s in zip(coords, self.shape))
      if ok:
        a, b = coords
        return b * self.shape[0] + a if self.kind != "multinode" else a * self.shape[1] + b
    want = ("I with 0 <= I < %d" % self.shape[0] if self.kind == "ring" else
            "NODE,GPU" if self.kind == "multinode" else "X,Y with X < %d, Y < %d" % self.shape)
    raise UsageError(f"chip {','.join(map(str, coords))} is not on {self.topology}; "
                     f"allowed: {want}")

  def coords(self, chip: int) -> tuple[int, ...]:
    if self.kind == "ring":
      return (chip,)
    if self.kind == "multinode":
      return divmod(chip, self.shape[1])
    return chip % self.shape[0], chip // self.shape[0]

  def format(self, chip: int) -> str:
    return ",".join(map(str, self.coords(chip)))

  @property
  def live_chips(self) -> np.ndarray:
    return np.flatnonzero(self.alive)

  def grid(self) -> np.ndarray:
    """Chip ids as [rows, columns]: a mesh's rows along x; a multinode's nodes."""
    if self.kind == "ring":
      raise ValueError("a ring has no rows")
    if self.kind == "multinode":
      return np.arange(self.num_chips).reshape(self.shape)
    X, Y = self.shape
    return np.arange(self.num_chips).reshape(Y, X)

  def ring_order(self) -> list[int]:
    """A cycle through every chip (live or not) whose consecutive chips are neighbours where
    the topology allows: a comb on a mesh (exact when Y is even), node-major on multinode."""
    if self.kind in ("ring", "multinode"):
      return list(range(self.num_chips))
    return [self.chip_id(xy) for xy in comb_cycle(*self.shape)]

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
    return self._shortest(u, v)

  def _dimension_ordered(self, u, v):
    (x0, y0), (x1, y1) = self.coords(u), self.coords(v)
    links, x, y = [], x0, y0
    for axis, target, size in ((0, x1, self.shape[0]), (1, y1, self.shape[1])):
      here = (x, y)[axis]
      delta = target - here
      if self.kind == "torus" and size > 2 and abs(delta) > size / 2:
        delta -= int(math.copysign(size, delta))
      step = 1 if delta > 0 else -1
      for _ in range(abs(delta)):
        nxt = ((x + step) % self.shape[0], y) if axis == 0 else (x, (y + step) % self.shape[1])
        a, b = self.chip_id((x, y)), self.chip_id(nxt)
        link = self._index[(a, b)]
        if not self.link_alive[link] or not self.alive[b]:
          return None
        links.append(link)
        x, y = nxt
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

  def describe(self) -> str:
    dead = [self.format(c) for c in np.flatnonzero(~self.alive)]
    cut = self.num_links - int(self.link_alive.sum())
    return (f"{self.topology}, {len(self.live_chips)} live chips"
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
