"""What a user asks the simulator: one collective, the algorithms side by side, the scaling
from 8 to 1024 chips, the slowdown with failed chips, and a heat map of link load."""
import math

import numpy as np

from harness.commsim import algorithms, functional, timing
from harness.commsim.machine import Machine, parse_topology
from harness.errors import UsageError

SCALING_CHIPS = (8, 16, 32, 64, 128, 256, 512, 1024)


def simulate(machine: Machine, collective: str, algorithm: str, nbytes: float,
             check: bool = False) -> dict:
  """Timing of one collective (and, with check, the functional sum test on 1,024 elements)."""
  schedule = algorithms.build(machine, collective, algorithm)
  result = timing.simulate(machine, schedule, nbytes)
  row = {"topology": machine.topology, "collective": collective, "algorithm": algorithm,
         **result.as_dict(machine)}
  if check:
    verdict = functional.run(machine, schedule, elements=1024)
    row["functional_check"] = "exact" if verdict.ok else f"WRONG: {verdict.detail}"
  return row


def scaling_shape(kind: str, chips: int, gpus_per_node: int = 8, dims: int = 2) -> str:
  """The topology of `chips` chips of a kind: the squarest X x Y with X >= Y for 2-D, the
  most cubic X x Y x Z with X >= Y >= Z for 3-D."""
  if kind == "ring":
    return f"ring:{chips}"
  if kind == "multinode":
    if chips % gpus_per_node:
      raise UsageError(f"{chips} chips do not fill nodes of {gpus_per_node}")
    return f"multinode:{chips // gpus_per_node}x{gpus_per_node}"
  if dims == 3:
    e = int(math.log2(chips))
    z, y = 2 ** (e // 3), 2 ** ((e - e // 3) // 2)
    return f"{kind}:{chips // (y * z)}x{y}x{z}"
  y = 2 ** (int(math.log2(chips)) // 2)
  return f"{kind}:{chips // y}x{y}"


def scaling(machine_args: dict, kind: str, collective: str, algorithms_, nbytes,
            chips=SCALING_CHIPS, gpus_per_node: int = 8, dims: int = 2) -> list[dict]:
  rows = []
  for n in chips:
    topology = scaling_shape(kind, n, gpus_per_node, dims)
    machine = Machine(topology, **machine_args)
    for name in algorithms_:
      if name in algorithms.applicable(machine, collective):
        rows.append(simulate(machine, collective, name, nbytes))
  return rows


def pick_failures(topology: str, count: int, seed: int, machine_args: dict):
  """`count` chips chosen at random (seeded) that leave the machine connected."""
  kind, shape = parse_topology(topology)
  rng = np.random.default_rng(seed)
  total = math.prod(shape)
  probe = Machine(topology, **machine_args)
  for _ in range(100):
    chips = [probe.coords(int(c)) for c in rng.choice(total, count, replace=False)]
    try:
      Machine(topology, **machine_args, failed_chips=chips)
      return chips
    except UsageError:
      continue
  raise UsageError(f"found no {count} failed chips that leave {topology} connected")


def failure_sweep(topology, machine_args, collective, algorithms_, nbytes,
                  counts=(1, 2, 4, 8), seed=0) -> list[dict]:
  """Each algorithm's time with 0, then `counts` failed chips (random, seeded), and the
  slowdown against the healthy machine."""
  healthy = Machine(topology, **machine_args)
  base = {a: simulate(healthy, collective, a, nbytes)["time_s"] for a in algorithms_}
  rows = []
  for count in (0, *counts):
    chips = pick_failures(topology, count, seed + count, machine_args) if count else []
    machine = Machine(topology, **machine_args, failed_chips=chips)
    for name in algorithms_:
      if name not in algorithms.applicable(machine, collective):
        continue
      row = simulate(machine, collective, name, nbytes)
      rows.append({"topology": topology, "failed": count,
                   "failed_chips": " ".join(",".join(map(str, c)) for c in chips),
                   "algorithm": name, "time_s": row["time_s"],
                   "slowdown": row["time_s"] / base[name], "busbw_GBps": row["busbw_GBps"]})
  return rows


def heatmap(machine: Machine, link_bytes: np.ndarray, path: str, title: str = "") -> str:
  """A PNG of a 2-D mesh/torus: every directed link as an arrow-side segment coloured by the
  bytes it carried, dead chips crossed out. Wrap-around links of a torus are drawn as stubs
  leaving the edge."""
  if machine.kind not in ("mesh", "torus") or len(machine.shape) != 2:
    raise UsageError(f"--heatmap draws a 2-D mesh or torus; {machine.topology} is not one")
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.collections import LineCollection

  X, Y = machine.shape
  segments, loads = [], []
  for link in range(machine.num_links):
    (x0, y0), (x1, y1) = machine.coords(int(machine.link_src[link])), machine.coords(
        int(machine.link_dst[link]))
    dx, dy = x1 - x0, y1 - y0
    if abs(dx) > 1 or abs(dy) > 1:           # wrap-around: a stub off the edge
      dx, dy = -np.sign(dx), -np.sign(dy)
      x1, y1 = x0 + 0.45 * dx, y0 + 0.45 * dy
    # The two directions of a link side by side: offset to the right of travel.
    ox, oy = 0.12 * dy, -0.12 * dx
    segments.append([(x0 + 0.15 * dx + ox, y0 + 0.15 * dy + oy),
                     (x1 - 0.15 * (x1 - x0) + ox, y1 - 0.15 * (y1 - y0) + oy)])
    loads.append(link_bytes[link] if machine.link_alive[link] else np.nan)
  size = max(4.0, min(14.0, 0.35 * max(X, Y)))
  fig, ax = plt.subplots(figsize=(size * 1.15, size))
  lines = LineCollection(segments, array=np.array(loads) / 1e6, cmap="viridis",
                         linewidths=max(0.8, 60 / max(X, Y)))
  ax.add_collection(lines)
  fig.colorbar(lines, ax=ax, label="MB carried per link direction")
  live = machine.alive
  coords = np.array([machine.coords(c) for c in range(machine.num_chips)])
  ax.scatter(coords[live, 0], coords[live, 1], s=max(4, 900 / (X * Y) ** 0.5), c="0.6", zorder=3)
  dead = coords[~live]
  if len(dead):
    ax.scatter(dead[:, 0], dead[:, 1], marker="X", s=max(40, 2400 / (X * Y) ** 0.5), c="red",
               zorder=4, label="failed chip")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), fontsize=8, frameon=False)
  ax.set_xlim(-0.7, X - 0.3), ax.set_ylim(-0.7, Y - 0.3)
  ax.set_aspect("equal"), ax.invert_yaxis()
  ax.set_xlabel("x"), ax.set_ylabel("y")
  ax.set_title(title or machine.describe(), fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
