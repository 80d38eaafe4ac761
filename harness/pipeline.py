"""GPipe's schedule, framework-neutral (Huang et al. 2019): the stage cut, the micro-batch
check and the bubble, read by both runtimes, `describe` and `simulate`, and checked before any
framework loads.

A pipelined network is a list of layers (a workload's `pipeline_layers(cfg)`: ResNet's
bottleneck blocks, the stem riding with the first and the classifier with the last; the
Transformer's encoder layers then its decoder layers, one list as Lingvo's GPipe cuts it) cut
into K consecutive stages, one per device of the `stage` axis. Each data replica's batch is
split into M micro-batches that flow through the stages: iteration i runs micro-batch i - k on
stage k, so a step takes M + K - 1 iterations, of which each stage is busy for M; the idle
fraction, the bubble, is (K - 1) / (M + K - 1). Gradients of all M micro-batches are summed
before one update, so the update does not depend on K or M (batch norm aside: GPipe normalises
each micro-batch, and the moving averages take the mean of the M micro-batches' statistics).
"""
import re

from harness.errors import UsageError


def stage_cut(layers, stages: int, explicit: str = "") -> tuple[int, ...]:
  """Layers per stage: `explicit` ('5,4,4,3', parallel.stage_layers) or as equal as the count
  allows, the earlier stages taking one more (GPipe's partitioner balances cost; ours balances
  layers, and says so in `describe`). A one-line UsageError for a cut that does not fit."""
  n = len(layers)
  if explicit:
    try:
      cut = tuple(int(part) for part in explicit.split(","))
    except ValueError:
      cut = ()
    if len(cut) != stages or sum(cut) != n or min(cut, default=0) < 1:
      raise UsageError(f"parallel.stage_layers={explicit!r} does not cut {n} layers into "
                       f"{stages} stages; allowed: {stages} counts >= 1 summing to {n}")
    return cut
  if stages > n:
    raise UsageError(f"--mesh stage={stages} leaves a stage empty: the model has {n} layers "
                     f"to cut; allowed: stage <= {n}")
  base, extra = divmod(n, stages)
  return tuple(base + (k < extra) for k in range(stages))


def stage_ranges(cut) -> list[tuple[int, int]]:
  """[(first layer, end layer)) per stage."""
  ranges, start = [], 0
  for count in cut:
    ranges.append((start, start + count))
    start += count
  return ranges


def iterations(stages: int, microbatches: int) -> int:
  return microbatches + stages - 1


def bubble_fraction(stages: int, microbatches: int) -> float:
  return (stages - 1) / iterations(stages, microbatches)


def schedule(stages: int, microbatches: int) -> list[list[int | None]]:
  """[iteration][stage] -> the micro-batch that stage runs then, or None (a bubble)."""
  return [[i - k if 0 <= i - k < microbatches else None for k in range(stages)]
          for i in range(iterations(stages, microbatches))]


def check(parallel, *, workload: str, layers, global_batch_size: int, data: int):
  """The pipeline's fit check (harness.mesh.check_fits calls it): a workload that can be cut,
  a cut with no empty stage, and a per-replica batch that M micro-batches divide. Which axes
  a pipeline combines with is harness.mesh.COMPOSITION's."""
  axes = parallel.axes()
  stages, m = axes["stage"], parallel.microbatches
  if (stages > 1 or m > 1 or parallel.stage_layers) and layers is None:
    raise UsageError(f"--mesh stage={stages} / parallel.microbatches={m}: {workload} has no "
                     "pipeline layers; allowed: stage=1 and microbatches=1 for it")
  if layers is None:
    return
  stage_cut(layers, stages, parallel.stage_layers)
  per_replica = global_batch_size // max(data, 1)
  if per_replica % m:
    raise UsageError(f"parallel.microbatches={m} does not divide the per-replica batch "
                     f"({per_replica} = {global_batch_size} / {max(data, 1)} data replicas); "
                     f"allowed: a divisor of {per_replica}")


def stage_summary(layers, cut, param_sizes: dict) -> list[dict]:
  """Per stage: its layers and the parameters it computes with (`layers`: the workload's
  [(name, regex of its parameter paths)]; `param_sizes`: {path: element count}). A parameter
  two stages read (the Transformer's shared embedding) counts on each."""
  out = []
  for start, end in stage_ranges(cut):
    mine = [layers[i] for i in range(start, end)]
    used = [path for path in param_sizes
            if any(re.fullmatch(pattern, path) for _, pattern in mine)]
    out.append({"layers": [name for name, _ in mine],
                "parameters": int(sum(param_sizes[p] for p in used))})
  return out
