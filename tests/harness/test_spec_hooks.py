"""A spec module's hooks reach its WorkloadSpec by their names (harness.workload.from_module):
a hook defined in the module is the one the spec holds, and a misspelt one (which from_module
would pass over in silence) is refused here."""
import dataclasses
import difflib
import importlib
import inspect

import pytest

from harness import registry
from harness.workload import HOOKS, WorkloadSpec, from_module

FIELDS = {f.name for f in dataclasses.fields(WorkloadSpec)}


def _spec_module(name):
  return importlib.import_module(registry.get(name).package + ".spec")


def test_every_hook_is_a_field_of_the_spec():
  assert set(HOOKS) <= FIELDS, set(HOOKS) - FIELDS


@pytest.mark.parametrize("name", registry.names())
def test_a_hook_the_module_defines_is_the_spec_s(name):
  module = _spec_module(name)
  for hook in HOOKS:
    if callable(getattr(module, hook, None)):
      assert getattr(module.SPEC, hook) is getattr(module, hook), (name, hook)
  assert module.SPEC.package == module.__package__


@pytest.mark.parametrize("name", registry.names())
def test_no_public_function_looks_like_a_misspelt_hook(name):
  module = _spec_module(name)
  for fn_name, fn in vars(module).items():
    if fn_name.startswith("_") or fn_name in FIELDS or not inspect.isfunction(fn):
      continue
    close = difflib.get_close_matches(fn_name, HOOKS, n=1, cutoff=0.8)
    assert not close, f"{module.__name__}.{fn_name} looks like the hook {close[0]} misspelt"


def test_a_hook_given_both_ways_is_refused():
  def derive(cfg):
    del cfg
  with pytest.raises(TypeError, match="derive"):
    WorkloadSpec(name="w", title="", metric=None, presets={}, mllog_hyperparameters=None,
                 batch_layout=None, derive=derive,
                 **from_module({"__package__": "workloads.w", "derive": derive}))


def test_the_benchmark_is_the_name_unless_given():
  fields = dict(title="", metric=None, presets={}, package="p", mllog_hyperparameters=None,
                batch_layout=None)
  assert WorkloadSpec(name="ssd", **fields).mlperf_benchmark == "ssd"
  assert WorkloadSpec(name="resnet50", mlperf_benchmark="resnet", **fields).mlperf_benchmark \
      == "resnet"
