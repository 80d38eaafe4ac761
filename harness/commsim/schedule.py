"""An algorithm's messages, as both simulations read them.

The vector every chip holds is cut into `num_chunks` equal chunks. A schedule is a list of
stages run one after the other (a barrier between them); a stage is a set of tracks run side
by side, step by step; a track is a fixed set of (src, dst) messages repeated `steps` times,
each step carrying its own chunks (a ring's step s moves chunk k - s). A step ends when its
slowest message arrives (synchronous steps, as the closed forms assume).
"""
import dataclasses
from typing import Callable

import numpy as np

REDUCE, COPY = "reduce", "copy"


@dataclasses.dataclass
class Track:
  src: np.ndarray                     # [m] chip ids
  dst: np.ndarray                     # [m]
  steps: int
  # step -> (chunks per message [m], chunk ids of message 0, then 1, ...)
  chunks: Callable[[int], tuple[np.ndarray, np.ndarray]]
  op: str                             # REDUCE: dst += src's chunks; COPY: dst = src's chunks
  uniform: bool                       # the per-message chunk counts are the same every step
  # its routes on the machine it was built for (timing.py's _Routes, made at its first timing:
  # a schedule timed at many sizes, as predict's buckets are, routes once)
  routes: object = None


@dataclasses.dataclass
class Stage:
  tracks: list[Track]

  @property
  def steps(self) -> int:
    return max((t.steps for t in self.tracks), default=0)


@dataclasses.dataclass
class Schedule:
  collective: str                     # all-reduce | reduce-scatter | all-gather | all-to-all
  algorithm: str
  participants: np.ndarray            # live chip ids
  num_chunks: int
  stages: list[Stage]
  # reduce-scatter: the chip that ends with chunk c summed; all-gather: the chip that holds
  # chunk c at the start. all-to-all: chunk c = origin position * p + destination position.
  owner: np.ndarray | None = None
  vector_chunks: int = 0              # chunks in one chip's vector (all-to-all: p; else all)

  def __post_init__(self):
    self.vector_chunks = self.vector_chunks or self.num_chunks

  @property
  def steps(self) -> int:
    return sum(stage.steps for stage in self.stages)


def ring_track(rings: list[list[int]], owned: list[list[np.ndarray]], op: str) -> Track:
  """Rings of equal length m running side by side: a reduce-scatter (op REDUCE) brings each
  position k the ring's sum of its chunks owned[r][k] in m - 1 steps (they start at k + 1 and
  travel round to k); an all-gather (COPY) spreads them from k to every position."""
  m = len(rings[0])
  assert all(len(r) == m for r in rings) and m >= 2
  src = np.concatenate([np.asarray(r) for r in rings])
  dst = np.concatenate([np.roll(np.asarray(r), -1) for r in rings])
  counts = np.array([[len(c) for c in ring_owned] for ring_owned in owned])   # [rings, m]
  positions = np.arange(m)
  shift = 1 if op == REDUCE else 0

  def chunks(s):
    owner = (positions - shift - s) % m          # the owner whose chunks position j sends
    per_msg = [owned[r][k] for r in range(len(rings)) for k in owner]
    return (np.array([len(c) for c in per_msg]),
            np.concatenate(per_msg) if per_msg else np.zeros(0, np.int64))

  uniform = bool((counts == counts[:, :1]).all())
  return Track(src, dst, m - 1, chunks, op, uniform)


def ring_stage(rings, owned, op) -> Stage:
  """Rings of any lengths side by side: one track per length (rings of one live chip have
  nothing to send)."""
  by_length = {}
  for ring, own in zip(rings, owned):
    if len(ring) >= 2:
      by_length.setdefault(len(ring), ([], []))
      by_length[len(ring)][0].append(ring)
      by_length[len(ring)][1].append(own)
  return Stage([ring_track(r, o, op) for _, (r, o) in sorted(by_length.items())])
