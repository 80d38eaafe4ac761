"""Functional simulation: every chip holds a vector, the schedule's messages run step by step
(all reads of a step before its writes, as on real links), and the result is checked.

After an all-reduce every live chip must hold exactly the sum of the live chips' inputs
(integer data: exact; float64: within the summation-order bound |error| <= g(p-1) * sum|x|,
g(k) = k u / (1 - k u), u = 2**-53, against a correctly rounded sum). Reduce-scatter: each
chunk's owner holds its sum; all-gather: every live chip holds every owner's chunk;
all-to-all: chip j holds block (i, j) of every chip i.
"""
import dataclasses
import math

import numpy as np

from harness.commsim.schedule import REDUCE

_SENTINEL = 1 << 40           # what a chip holds where it has no data yet: any use of it shows


@dataclasses.dataclass
class Check:
  ok: bool
  max_error: float
  bound: float
  detail: str


def execute(schedule, buf: np.ndarray) -> np.ndarray:
  """Runs the schedule on buf [chips, num_chunks, chunk_len] in place and returns it."""
  for stage in schedule.stages:
    for s in range(stage.steps):
      reads = []
      for track in stage.tracks:
        if s < track.steps:
          counts, ids = track.chunks(s)
          src, dst = np.repeat(track.src, counts), np.repeat(track.dst, counts)
          reads.append((dst, ids, buf[src, ids], track.op))
      for dst, ids, values, op in reads:
        if op == REDUCE:
          np.add.at(buf, (dst, ids), values)
        else:
          buf[dst, ids] = values
  return buf


def run(machine, schedule, elements: int = 1024, dtype: str = "int64", seed: int = 0) -> Check:
  """Executes the schedule on random data of `elements` per chip and checks the result."""
  rng = np.random.default_rng(seed)
  live = schedule.participants
  p = len(live)
  length = math.ceil(elements / schedule.vector_chunks)
  shape = (machine.num_chips, schedule.num_chunks, length)
  if dtype == "int64":
    inputs = rng.integers(-1000, 1000, shape)
  else:
    inputs = rng.standard_normal(shape)
  buf = np.full(shape, _SENTINEL, inputs.dtype)
  collective = schedule.collective
  if collective in ("all-reduce", "reduce-scatter"):
    buf[live] = inputs[live]
  elif collective == "all-gather":
    chunks = np.arange(schedule.num_chunks)
    buf[schedule.owner, chunks] = inputs[schedule.owner, chunks]
  else:                                   # all-to-all: chip i holds blocks i*p .. i*p + p-1
    for i, chip in enumerate(live):
      buf[chip, i * p:(i + 1) * p] = inputs[chip, i * p:(i + 1) * p]
  execute(schedule, buf)

  if collective in ("all-reduce", "reduce-scatter"):
    exact = _exact_sum(inputs[live])
    if collective == "all-reduce":
      got, want = buf[live], np.broadcast_to(exact, buf[live].shape)
    else:
      got, want = buf[schedule.owner, np.arange(schedule.num_chunks)], exact
    scale = np.broadcast_to(np.abs(inputs[live]).sum(axis=0), got.shape)
  elif collective == "all-gather":
    chunks = np.arange(schedule.num_chunks)
    want = np.broadcast_to(inputs[schedule.owner, chunks], buf[live].shape)
    got, scale = buf[live], np.zeros(want.shape)
  else:
    i, j = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
    ids = i * p + j
    got, want = buf[live[j], ids], inputs[live[i], ids]
    scale = np.zeros(want.shape)
  error = np.abs(got.astype(np.float64) - want.astype(np.float64))
  if dtype == "int64":
    bound = np.zeros(error.shape)
  else:
    u = 2.0 ** -53
    gamma = (p - 1) * u / (1 - (p - 1) * u)
    bound = gamma * scale
  bad = error > bound
  detail = "" if not bad.any() else (f"{int(bad.sum())} of {bad.size} elements wrong, "
                                     f"max error {error.max():.3g}")
  return Check(not bad.any(), float(error.max()), float(bound.max()), detail)


def _exact_sum(values: np.ndarray) -> np.ndarray:
  """Sum over axis 0: exact for integers; correctly rounded (math.fsum) for floats."""
  if values.dtype.kind == "i":
    return values.sum(axis=0)
  flat = values.reshape(values.shape[0], -1)
  return np.array([math.fsum(flat[:, k]) for k in range(flat.shape[1])]).reshape(values.shape[1:])
