"""A JAX train step's model FLOPs, as the program states them before a backend rewrites it.

On a GPU the compiled program's convolutions and matmuls are cuDNN/cuBLAS custom calls that
XLA's cost analysis does not count (an H200: ResNet-50 0.41 GFLOP a sample compiled, 23.75
lowered; 3 x the forward's 8.2 is 24.6), so the lowered program's cost analysis. Where the
backend answers nothing for it (an H100 and an H200 under JAX 0.11.2, 2026-11; PJRT plugins
may raise), the step's jaxpr counted by jax.experimental.roofline: the same ops before any
backend sees them, on every platform (at the reference shapes on CPU 0.94-0.998 of the lowered
count: the roofline has no rule for a few elementwise ops). Used by the trainers' describe
(the result row's MFU) and bench/gpu_models.py's bare step.
"""
import logging

import jax


def flops_of(analysis):
  """The 'flops' of a cost_analysis() answer (a dict, or a list of dicts per program)."""
  if analysis is None:
    return None
  if isinstance(analysis, (list, tuple)):
    values = [a.get("flops") for a in analysis if a]
    values = [v for v in values if v is not None]
    return float(sum(values)) if values else None
  value = analysis.get("flops")
  return None if value is None else float(value)


def step_flops(train_step, lowered, *args):
  """(FLOPs of one call of `train_step(*args)`, where the figure comes from): the lowered
  program's cost analysis, else the jaxpr's roofline count, else (None, 'no count')."""
  try:
    flops = flops_of(lowered.cost_analysis())
  except Exception:  # pylint: disable=broad-except  # NotImplementedError on some plugins
    flops = None
  if flops:
    return flops, "lowered cost analysis"
  from jax.experimental import roofline    # pylint: disable=import-outside-toplevel
  level = logging.getLogger().level
  logging.getLogger().setLevel(logging.ERROR)   # it warns once per op it has no rule for
  try:
    flops = roofline.roofline(train_step)(*args)[1].unfused_flops
  except Exception:  # pylint: disable=broad-except  # an op it cannot trace: no count, no abort
    flops = None
  finally:
    logging.getLogger().setLevel(level)
  return (float(flops), "jaxpr roofline") if flops else (None, "no count")
