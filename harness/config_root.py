"""The root of a workload's config tree, one shape for every workload: its own `model`, `data`
and `optimizer` sections, then the harness's `train` and `parallel`. Apart from harness/config.py
because it joins config's TrainConfig with mesh's ParallelConfig (mesh imports config's
validators)."""
import dataclasses

from harness.config import TrainConfig
from harness.mesh import ParallelConfig

WORKLOAD_SECTIONS = ("model", "data", "optimizer")   # what a workload's root names itself


def workload_config(cls):
  """Makes `cls` the root of a workload's config tree (a dataclass): the class annotates its
  own sections, `model`, `data` and `optimizer`, with their dataclasses (an optimizer that may
  be one of two gives its default as a field), and every root then has the same `train`
  (TrainConfig) and `parallel` (harness.mesh.ParallelConfig) sections, in that order, each
  section built from its own defaults. The `--set` keys are the sections' fields."""
  own = dict(cls.__dict__.get("__annotations__", {}))
  if tuple(own) != WORKLOAD_SECTIONS:
    raise TypeError(f"{cls.__name__} declares {', '.join(own) or 'nothing'}; a workload's "
                    f"config root declares {', '.join(WORKLOAD_SECTIONS)}, in that order")
  cls.__annotations__ = {**own, "train": TrainConfig, "parallel": ParallelConfig}
  for name, kind in cls.__annotations__.items():
    if name not in cls.__dict__:
      setattr(cls, name, dataclasses.field(default_factory=kind))
  return dataclasses.dataclass(cls)
