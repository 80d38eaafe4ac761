"""Workload name -> spec. Spec modules are framework-neutral, so importing them is cheap."""
import importlib

from harness.errors import UsageError
from harness.workload import WorkloadSpec

_SPEC_MODULES = {
    "resnet50": "workloads.resnet.spec",
    "bert": "workloads.bert.spec",
    "efficientnet": "workloads.efficientnet.spec",
    "transformer": "workloads.transformer.spec",
    "ssd": "workloads.ssd.spec",
    "dlrm": "workloads.dlrm.spec",
    "llama31_8b": "workloads.llama31_8b.spec",
}


def names() -> list[str]:
  return sorted(_SPEC_MODULES)


def get(name: str) -> WorkloadSpec:
  if name not in _SPEC_MODULES:
    raise UsageError(f"unknown workload {name!r}; choose one of: {', '.join(names())}")
  return importlib.import_module(_SPEC_MODULES[name]).SPEC
