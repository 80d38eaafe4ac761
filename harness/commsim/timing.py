"""Timing simulation on a schedule: alpha-beta per message with link contention.

A message of b bytes on route R takes  overhead + sum of R's hop latencies
+ max(max over links l of R: load(l) / bandwidth(l),  injected(src) / injection bandwidth),
where load(l) is every byte that crosses l in that step (messages sharing a link share its
bandwidth: two equal messages on one link take twice as long) and injected(src) every byte
its chip sends in the step. A step ends with its slowest message; stages run one after the
other. Wormhole routing: a multi-hop message pays the bandwidth term once.

A machine's efficiency terms (machine.Efficiency, fitted to published measurements) turn this
into a model of a collective library on real links: bandwidth(l) is the link's achievable
bandwidth (x the link or network efficiency); the collective runs under each of the library's
protocols, where a message is sent in pieces of at most piece_bytes, each paying the
protocol's step latency in place of the overhead, at the protocol's fraction of the bandwidth;
the fastest protocol's time plus the launch is the collective's. With no efficiency terms
there is one protocol (the overhead, the whole bandwidth, one piece) and no launch: the ideal
model whose closed forms the tests check.

Bus bandwidth follows NCCL's convention: algorithm bandwidth (bytes per chip / time) times
2(p-1)/p for all-reduce and (p-1)/p for reduce-scatter, all-gather and all-to-all.
"""
import dataclasses

import numpy as np


@dataclasses.dataclass
class Timing:
  time_s: float
  steps: int
  bytes: float                       # each chip's vector
  algbw: float                       # bytes / s
  busbw: float
  link_bytes: np.ndarray             # [links] bytes that crossed each directed link
  participants: int
  protocol: str = "ideal"

  def as_dict(self, machine) -> dict:
    busiest = int(np.argmax(self.link_bytes))
    top = np.argsort(-self.link_bytes, kind="stable")[:10]
    return {"time_s": self.time_s, "steps": self.steps, "bytes": self.bytes,
            "algbw_GBps": self.algbw / 1e9, "busbw_GBps": self.busbw / 1e9,
            "participants": self.participants, "protocol": self.protocol,
            "max_link_bytes": float(self.link_bytes[busiest]),
            "busiest_link": _link_name(machine, busiest),
            "mean_link_bytes": float(self.link_bytes[machine.link_alive].mean()),
            "top_links": [[_link_name(machine, int(l)), float(self.link_bytes[l])] for l in top]}


def _link_name(machine, link):
  return (f"{machine.vertex_name(int(machine.link_src[link]))}->"
          f"{machine.vertex_name(int(machine.link_dst[link]))}")


def bus_factor(collective: str, p: int) -> float:
  return 2 * (p - 1) / p if collective == "all-reduce" else (p - 1) / p


class _Routes:
  """A track's routes as flat arrays (its endpoints never change from step to step)."""

  def __init__(self, machine, track):
    routes = [machine.route(int(a), int(b)) for a, b in zip(track.src, track.dst)]
    self.lengths = np.array([len(r) for r in routes])
    self.links = np.fromiter((l for r in routes for l in r), np.int64, self.lengths.sum())
    self.latency = np.add.reduceat(machine.link_latency[self.links], _starts(self.lengths))


def _starts(lengths):
  return np.concatenate([[0], np.cumsum(lengths)[:-1]])


def _step(machine, active, chunk_bytes, protocol):
  """(step time, bytes per link) of one step of the (track, routes, counts) triples."""
  load = np.zeros(machine.num_links)
  parts = []
  for track, routes, counts in active:
    msg_bytes = counts * chunk_bytes
    load += np.bincount(routes.links, weights=np.repeat(msg_bytes, routes.lengths),
                        minlength=machine.num_links)
    parts.append((track, routes, msg_bytes))
  link_time = load / (machine.achievable_bandwidth * protocol.bandwidth_fraction)
  injected = np.zeros(machine.num_chips)
  for track, _, msg_bytes in parts:
    injected += np.bincount(track.src, weights=msg_bytes, minlength=machine.num_chips)
  worst = 0.0
  for track, routes, msg_bytes in parts:
    busy = np.maximum.reduceat(link_time[routes.links], _starts(routes.lengths))
    busy = np.maximum(busy, injected[track.src] / (machine.injection_bandwidth
                                                   * protocol.bandwidth_fraction))
    pieces = np.maximum(1.0, msg_bytes / protocol.piece_bytes)     # a fraction: a smooth fit
    times = np.where(msg_bytes > 0, routes.latency + protocol.step_latency * pieces + busy, 0.0)
    worst = max(worst, float(times.max()))
  return worst, load


def simulate(machine, schedule, nbytes: float) -> Timing:
  """The collective's time under the machine's fastest protocol, its launch included."""
  if schedule.algorithm == "nvls":
    return _in_network(machine, schedule, nbytes)
  best = min((_simulate(machine, schedule, nbytes, p) for p in machine.protocols),
             key=lambda t: t.time_s)
  if machine.efficiency.launch:
    best = dataclasses.replace(best, time_s=best.time_s + machine.efficiency.launch)
    best.algbw = nbytes / best.time_s
    best.busbw = best.algbw * bus_factor(schedule.collective, best.participants)
  return best


def _in_network(machine, schedule, nbytes) -> Timing:
  """NVLink SHARP (NVLS) on one NVSwitch node: the switch reads every GPU's part of each
  slice and returns the sum (multimem load-reduce), then multicasts each reduced slice
  (multimem store), so a GPU's port carries n (1 + 1/p) bytes each way where a ring carries
  2 n (p-1)/p. The two phases run pipelined in pieces (at least two, at most nvls_piece
  bytes), the multicast one piece behind the reduce: time = launch + NVLS latency
  + (n (1 + 1/p) + min(n / 2, piece)) / (port bandwidth x NVLS efficiency). The link bytes
  are those of the schedule's direct messages."""
  eff = machine.efficiency
  p = len(schedule.participants)
  port = float(machine.link_bandwidth[0])          # GPU -> its node switch
  per_way = nbytes * (1 + 1 / p) if schedule.collective == "all-reduce" else nbytes
  trail = min(nbytes / 2, eff.nvls_piece)
  time_s = eff.launch + eff.nvls_latency + (per_way + trail) / (port * eff.nvls)
  link_bytes = np.zeros(machine.num_links)
  for stage in schedule.stages:
    for track in stage.tracks:
      counts, _ = track.chunks(0)
      for a, b, c in zip(track.src, track.dst, counts):
        for link in machine.route(int(a), int(b)):
          link_bytes[link] += c * nbytes / schedule.vector_chunks
  algbw = nbytes / time_s
  return Timing(time_s, schedule.steps, nbytes, algbw, algbw * bus_factor(schedule.collective, p),
                link_bytes, p, "nvls")


def _simulate(machine, schedule, nbytes, protocol) -> Timing:
  chunk_bytes = nbytes / schedule.vector_chunks
  total, link_bytes = 0.0, np.zeros(machine.num_links)
  for stage in schedule.stages:
    for track in stage.tracks:
      if track.routes is None:
        track.routes = _Routes(machine, track)
    ends = sorted({t.steps for t in stage.tracks})
    start = 0
    for end in ends:                         # tracks active over [start, end) do not change
      active = [t for t in stage.tracks if t.steps > start]
      if all(t.uniform for t in active):     # every step alike: time one, count it end-start
        steps = [(start, end - start)]
      else:
        steps = [(s, 1) for s in range(start, end)]
      for s, repeat in steps:
        t, load = _step(machine, [(t, t.routes, t.chunks(s)[0]) for t in active],
                        chunk_bytes, protocol)
        total += t * repeat
        link_bytes += load * repeat
      start = end
  p = len(schedule.participants)
  algbw = nbytes / total if total > 0 else float("inf")
  return Timing(total, schedule.steps, nbytes, algbw, algbw * bus_factor(schedule.collective, p),
                link_bytes, p, protocol.name)
