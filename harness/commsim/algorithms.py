"""Collective algorithms as schedules (schedule.py), built for the live chips of a machine.

ring          one ring through every live chip (machine.ring_order); a hop between ring
              neighbours that are not linked (a failed chip between them) is routed around it.
bidir         two rings, one each way round, half the data each.
multiring     several rings on disjoint links, the data split between them (PowerAI DDL,
              NCCL): on a square KxK torus the two edge-disjoint Hamiltonian cycles that
              decompose it, each run both ways (4 rings, every link busy); on a mesh or another
              torus a comb along x and one along y (in 3-D each both ways); on multinode one
              ring per rail, each leaving a node through its own network port; on a ring,
              both directions.
2d            the 2-D scheme of the TPU pod (arXiv 1811.06992): reduce-scatter along the rows
              (x), all-reduce along the columns, all-gather along the rows; 2(X+Y-2) latency
              steps instead of 2(XY-1).
2d-bidir      the same with every row and column ring run both ways on half the data.
3d            its 3-D form (TPU v4 slices): reduce-scatter along x, then along y, all-reduce
              along z, all-gather along y, then along x; 2(X+Y+Z-3) latency steps.
hierarchical  multinode: reduce-scatter inside each node, all-reduce across nodes per rail,
              all-gather inside the node (2d on the nodes x GPUs grid).
direct        all-to-all: every chip sends each other chip its block in one step.
nvls          all-reduce in the NVSwitch (NVLink SHARP, H100 nodes): the switch sums each slice
              and multicasts it; timed in closed form (timing._in_network), its data moves as
              a direct reduce-scatter then all-gather through the switch (what ends where).

Failed chips (Kumar & Jouppi, arXiv 2011.03605: route gradient all-reduce traffic around the
holes of a 2-D mesh). Rings skip dead chips and their hops are routed around them. In the 2-D
schemes a dead chip's share of its row (its column's part of the vector) is cut into slices
that the row's live chips reduce in turn, so the long row phase stays balanced; the slices
are then gathered on the nearest live chip of the row, which stands in for the dead one in
its column's ring, and scattered back before the row all-gather. Rings that detour run the
other way round, so their detours take links the healthy rings leave idle. Every live chip's
data is summed exactly once; dead chips contribute nothing; a row with no live chip drops out
of the column rings. The paper's full text was not at hand: the slicing, the stand-in and the
reversed detour rings are ours, built to its stated goal (all-reduce traffic routed around
failed chips on a 2-D mesh with minimal throughput impact).
"""
import numpy as np

from harness.commsim.machine import comb_cycle
from harness.commsim.schedule import COPY, REDUCE, Schedule, Stage, Track, ring_stage
from harness.errors import UsageError

COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all")
ALGORITHMS = ("ring", "bidir", "multiring", "2d", "2d-bidir", "3d", "hierarchical", "direct",
              "nvls")


def applicable(machine, collective) -> list[str]:
  """The algorithms that run `collective` on this machine."""
  if collective == "all-to-all":
    names = ["direct"]
    if machine.kind in ("mesh", "torus") and len(machine.shape) == 2 and machine.alive.all():
      names.append("2d")
    return names
  names = ["ring", "bidir", "multiring"]
  if machine.kind in ("mesh", "torus") and len(machine.shape) == 2:
    names += ["2d", "2d-bidir"]
  if machine.kind in ("mesh", "torus") and len(machine.shape) == 3 and machine.alive.all():
    names.append("3d")
  if machine.kind == "multinode":
    names.append("hierarchical")
    if (collective == "all-reduce" and machine.shape[0] == 1 and machine.efficiency.nvls > 0
        and machine.alive.all()):
      names.append("nvls")
  return names


def build(machine, collective: str, algorithm: str) -> Schedule:
  if collective not in COLLECTIVES:
    raise UsageError(f"--collective {collective!r} is not a collective; allowed: "
                     f"{', '.join(COLLECTIVES)}")
  allowed = applicable(machine, collective)
  if algorithm not in allowed:
    raise UsageError(f"--algorithm {algorithm!r} does not run {collective} on "
                     f"{machine.describe()}; allowed: {', '.join(allowed)}")
  if collective == "all-to-all":
    return _direct_all_to_all(machine) if algorithm == "direct" else _all_to_all_2d(machine)
  if algorithm in ("ring", "bidir", "multiring"):
    return _rings(machine, collective, algorithm, _ring_orders(machine, algorithm))
  if algorithm == "3d":
    return _dimension_by_dimension(machine, collective)
  if algorithm == "nvls":
    return _through_the_switch(machine)
  return _two_level(machine, collective, algorithm, both_ways=algorithm == "2d-bidir")


# ----------------------------------------------------------------------------- rings

def _ring_orders(machine, algorithm):
  live = machine.alive
  def keep(order):
    return [c for c in order if live[c]]
  base = keep(machine.ring_order())
  if algorithm == "ring":
    return [base]
  if algorithm == "bidir" or machine.kind == "ring":
    return [base, base[::-1]]
  if machine.kind == "multinode":
    nodes, gpus = machine.shape
    return [keep([n * gpus + (r + g) % gpus for n in range(nodes) for g in range(gpus)])
            for r in range(gpus)]
  if len(machine.shape) == 3:               # combs along x and along y, each both ways
    return [keep(machine.comb(0)), keep(machine.comb(0))[::-1], keep(machine.comb(1)),
            keep(machine.comb(1))[::-1]]
  X, Y = machine.shape
  if machine.kind == "torus" and X == Y and X >= 3:
    h1, h2 = _torus_hamiltonian_cycles(machine)
    return [keep(h1), keep(h1)[::-1], keep(h2), keep(h2)[::-1]]
  along_y = [machine.chip_id((x, y)) for y, x in comb_cycle(Y, X)]   # the comb, transposed
  return [base, keep(along_y)]


def _torus_hamiltonian_cycles(machine):
  """The two edge-disjoint Hamiltonian cycles of a KxK torus: H1 steps +x except on the
  anti-diagonal x + y = K - 1, where it steps +y; H2 is H1 with x and y swapped. They use
  complementary links, so H1, H2 and their reverses use every directed link once."""
  k = machine.shape[0]
  cycles = []
  for first, second in ((0, 1), (1, 0)):
    xy, order = [0, 0], []
    for _ in range(k * k):
      order.append(machine.chip_id(xy))
      axis = second if (xy[0] + xy[1]) % k == k - 1 else first
      xy[axis] = (xy[axis] + 1) % k
    assert len(set(order)) == k * k and xy == [0, 0]
    cycles.append(order)
  return cycles


def _rings(machine, collective, algorithm, rings) -> Schedule:
  p = len(rings[0])
  num_chunks = len(rings) * p
  owned = [[np.array([r * p + k]) for k in range(p)] for r in range(len(rings))]
  owner = np.concatenate([np.asarray(ring) for ring in rings])
  stages = []
  if collective in ("all-reduce", "reduce-scatter"):
    stages.append(ring_stage(rings, owned, REDUCE))
  if collective in ("all-reduce", "all-gather"):
    stages.append(ring_stage(rings, owned, COPY))
  return Schedule(collective, algorithm, machine.live_chips, num_chunks, stages, owner)


# ----------------------------------------------------------------------------- 2-D schemes

def _two_level(machine, collective, algorithm, both_ways) -> Schedule:
  grid = machine.grid()                         # [rows, columns]; phase 1 runs along a row
  alive = machine.alive[grid]
  rows = [r for r in range(grid.shape[0]) if alive[r].any()]
  n_rows, columns = len(rows), grid.shape[1]
  healthy = bool(alive[rows].all())
  # A dead chip's share of its row (its column's part of the vector) is reduced in slices by
  # the row's live chips in turn, so the row phase stays balanced (a single stand-in would
  # carry two shares in every step and double it). For the short column phase the slices are
  # gathered on the nearest live chip of the row, the stand-in, which joins the column's ring.
  slices = 1 if healthy else max(1, columns - 1)
  holder = np.empty((n_rows, columns, slices), np.int64)
  stand_in = np.empty((n_rows, columns), np.int64)
  for i, r in enumerate(rows):
    live, turn = grid[r][alive[r]], 0
    for c in range(columns):
      stand_in[i, c] = _nearest_live(grid[r], alive[r], c)
      if alive[r, c]:
        holder[i, c] = grid[r, c]
      else:
        for s in range(slices):
          holder[i, c, s], turn = live[turn % len(live)], turn + 1
  ways = 2 if both_ways else 1

  def chunk(way, c, s, i):                      # slice s of column c, reduced over live row i
    return ((way * columns + c) * slices + s) * n_rows + i

  # A ring along a line (a mesh has no wrap-around) runs folded: out over the even places,
  # back over the odd ones, so every hop spans at most 2 links, each link direction carries
  # one message per step, and no hop crosses the whole line.
  fold = _folded if machine.kind == "mesh" else (lambda places: list(places))
  row_rings, row_owned, col_rings, col_owned, moves = [], [], [], [], []
  for way in range(ways):
    for i, r in enumerate(rows):
      ring = [int(grid[r, c]) for c in fold(range(columns)) if alive[r, c]]
      owned = [(chunk(way, *np.nonzero(holder[i] == chip), 0)[:, None]
                + np.arange(n_rows)).ravel() for chip in ring]
      # A ring that detours round a hole runs against the healthy rings of its way, so its
      # detour takes links they leave idle (when every ring runs both ways, it shares them).
      backwards = way == 1 or (not both_ways and not alive[r].all())
      row_rings.append(ring[::-1] if backwards else ring)
      row_owned.append(owned[::-1] if backwards else owned)
    for c in range(columns):
      places = fold(range(n_rows))
      ring = [int(stand_in[i, c]) for i in places]
      owned = [np.array([chunk(way, c, s, i) for s in range(slices)]) for i in places]
      backwards = way == 1 or (not both_ways and not alive[rows, c].all())
      col_rings.append(ring[::-1] if backwards else ring)
      col_owned.append(owned[::-1] if backwards else owned)
      for i in np.flatnonzero(~alive[rows, c]):
        for s in range(slices):
          if holder[i, c, s] != stand_in[i, c]:
            ids = np.array([chunk(way, c, s, k) for k in range(n_rows)])
            moves.append((int(holder[i, c, s]), int(stand_in[i, c]), ids))

  gather = _moves_stage(moves, forward=True)
  scatter = _moves_stage(moves, forward=False)
  stages = []
  if collective in ("all-reduce", "reduce-scatter"):
    stages += [ring_stage(row_rings, row_owned, REDUCE), gather,
               ring_stage(col_rings, col_owned, REDUCE)]
  if collective in ("all-reduce", "all-gather"):
    stages += [ring_stage(col_rings, col_owned, COPY), scatter,
               ring_stage(row_rings, row_owned, COPY)]
  num_chunks = ways * columns * slices * n_rows
  owner = np.zeros(num_chunks, np.int64)
  for ring, owned in zip(col_rings, col_owned):
    for chip, chunks in zip(ring, owned):
      owner[chunks] = chip
  return Schedule(collective, algorithm, machine.live_chips, num_chunks,
                  [s for s in stages if s.tracks], owner)


def _dimension_by_dimension(machine, collective) -> Schedule:
  """A healthy D-dimensional mesh or torus, one axis at a time. Chunk c's digits (x fastest,
  as chip ids) name the chip that ends with it reduced; reducing along axis d, the chip at
  position k of its line takes the chunks whose first d digits are its own coordinates and
  whose digit d is k (prod(shape[d+1:]) of them)."""
  shape = machine.shape
  chips = np.arange(machine.num_chips).reshape(shape[::-1])     # [z, y, x]: chip ids
  digits = np.stack(np.unravel_index(np.arange(machine.num_chips), shape[::-1])[::-1])
  fold = _folded if machine.kind == "mesh" else (lambda places: list(places))
  phases = []
  for d in range(len(shape)):
    lines = np.moveaxis(chips, len(shape) - 1 - d, -1).reshape(-1, shape[d])
    rings, owned = [], []
    for line in lines:
      ring = [int(line[k]) for k in fold(range(shape[d]))]
      mine = []
      for chip in ring:
        here = machine.coords(chip)
        keep = np.ones(machine.num_chips, bool)
        for e in range(d + 1):
          keep &= digits[e] == here[e]
        mine.append(np.flatnonzero(keep))
      rings.append(ring), owned.append(mine)
    phases.append((rings, owned))
  stages = []
  if collective in ("all-reduce", "reduce-scatter"):
    stages += [ring_stage(r, o, REDUCE) for r, o in phases]
  if collective in ("all-reduce", "all-gather"):
    stages += [ring_stage(r, o, COPY) for r, o in phases[::-1]]
  return Schedule(collective, "3d", machine.live_chips, machine.num_chips,
                  [s for s in stages if s.tracks], np.arange(machine.num_chips))


def _through_the_switch(machine) -> Schedule:
  """NVLS's data movement: chip i's slice j summed on chip j, then chip j's sum copied to
  every chip (each a direct message through the node switch)."""
  live = machine.live_chips
  p = len(live)
  i, j = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
  off = i != j
  src, dst = live[i[off]], live[j[off]]
  ones = np.ones(int(off.sum()), np.int64)
  reduce = Track(src, dst, 1, lambda s: (ones, j[off]), REDUCE, True)
  gather = Track(dst, src, 1, lambda s: (ones, j[off]), COPY, True)
  return Schedule("all-reduce", "nvls", live, p, [Stage([reduce]), Stage([gather])], live)


def _moves_stage(moves, forward) -> Stage:
  """One step of copies: slices from their holders to the stand-in (or back)."""
  if not moves:
    return Stage([])
  src = np.array([m[0] if forward else m[1] for m in moves])
  dst = np.array([m[1] if forward else m[0] for m in moves])
  counts = np.array([len(m[2]) for m in moves])
  ids = np.concatenate([m[2] for m in moves])
  return Stage([Track(src, dst, 1, lambda s: (counts, ids), COPY, True)])


def _folded(places):
  places = list(places)
  return places[0::2] + places[1::2][::-1]


def _nearest_live(row, alive, c):
  """The live chip of `row` nearest to column c (c itself if alive; then c+1, c-1, c+2, ...)."""
  for d in range(len(row)):
    for cc in (c + d, c - d):
      if 0 <= cc < len(row) and alive[cc]:
        return int(row[cc])
  raise AssertionError("a live row has a live chip")


# ----------------------------------------------------------------------------- all-to-all

def _direct_all_to_all(machine) -> Schedule:
  live = machine.live_chips
  p = len(live)
  i, j = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
  off = i != j
  src, dst = live[i[off]], live[j[off]]
  ids = (i * p + j)[off]
  track = Track(src, dst, 1, lambda s: (np.ones(len(ids), np.int64), ids), COPY, True)
  return Schedule("all-to-all", "direct", live, p * p, [Stage([track])], vector_chunks=p)


def _all_to_all_2d(machine) -> Schedule:
  """Rows first: chip (x, y) sends chip (x', y) its blocks for column x'; then columns: chip
  (x', y) sends chip (x', y') the blocks (from every origin of its row) for (x', y')."""
  X, Y = machine.shape
  p = X * Y
  pos = {int(c): k for k, c in enumerate(machine.live_chips)}   # every chip is live here
  stages = []
  for phase in range(2):
    src, dst, per_msg = [], [], []
    for y in range(Y):
      for x in range(X):
        a = machine.chip_id((x, y))
        for other in (range(X) if phase == 0 else range(Y)):
          b = machine.chip_id((other, y) if phase == 0 else (x, other))
          if a == b:
            continue
          if phase == 0:                 # a's own blocks for every chip of column `other`
            blocks = [pos[a] * p + pos[machine.chip_id((other, yy))] for yy in range(Y)]
          else:                          # blocks of row y's origins now at a, bound for b
            blocks = [pos[machine.chip_id((xx, y))] * p + pos[b] for xx in range(X)]
          src.append(a), dst.append(b), per_msg.append(blocks)
    counts = np.array([len(b) for b in per_msg])
    ids = np.concatenate([np.array(b) for b in per_msg])
    stages.append(Stage([Track(np.array(src), np.array(dst), 1,
                               lambda s, c=counts, i=ids: (c, i), COPY, True)]))
  return Schedule("all-to-all", "2d", machine.live_chips, p * p, stages, vector_chunks=p)
