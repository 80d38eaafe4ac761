"""The input-pipeline and evaluator protocols (harness/workload.py) are what every workload
supplies, reached through its spec: each input_pipeline module has the protocol's functions
with its parameters, each spec's evaluator has its three parts, and the default one counts."""
import inspect

import numpy as np
import pytest

from harness import registry
from harness.workload import CountEvaluator, Evaluator, InputPipeline

PIPELINE_FUNCTIONS = ("data_source", "train_dataset", "eval_dataset", "synthetic_batch")


def _parameters(fn, drop_self=False):
  names = list(inspect.signature(fn).parameters)
  return names[1:] if drop_self else names


@pytest.mark.parametrize("name", registry.names())
def test_every_input_pipeline_has_the_protocol_s_functions(name):
  module = registry.get(name).input_pipeline
  for fn in PIPELINE_FUNCTIONS:
    want = _parameters(getattr(InputPipeline, fn), drop_self=True)
    got = _parameters(getattr(module, fn))
    assert got[:len(want)] == want, (name, fn, got)


@pytest.mark.parametrize("name", registry.names())
def test_every_spec_s_evaluator_has_the_three_parts(name):
  spec = registry.get(name)
  evaluator = spec.evaluator(spec.configure("tiny"), None)
  assert isinstance(evaluator.on_host, bool)
  for part in ("accumulate", "finalize"):
    assert _parameters(getattr(evaluator, part)) == _parameters(getattr(Evaluator, part), True)
  # The default, CountEvaluator, sums [hits, counted] on the device; an evaluator a workload
  # supplies (spec.host_evaluator: BLEU, COCO mAP, AUC) is its own host-side code, in its folder.
  if spec.host_evaluator is None:
    assert type(evaluator) is CountEvaluator and not evaluator.on_host
    assert evaluator.finalize(np.array([1.0, 4.0])) == {spec.metric.name: 0.25, "count": 4}
  else:
    assert evaluator.on_host and not isinstance(evaluator, CountEvaluator), name
    assert type(evaluator).__module__.startswith(spec.package + "."), (name, type(evaluator))


def test_both_eval_paths_are_in_use():
  """The trainer bases' two eval paths (device sums, host accumulation) each serve a workload."""
  on_host = {registry.get(n).evaluator(registry.get(n).configure("tiny"), None).on_host
             for n in registry.names()}
  assert on_host == {True, False}


def test_the_count_evaluator_sums_then_divides():
  evaluator = CountEvaluator("top1_accuracy")
  acc = None
  for batch in ([3, 4], [5, 4], [0, 2]):
    acc = evaluator.accumulate(acc, np.array(batch, np.float32))
  assert evaluator.finalize(acc) == {"top1_accuracy": 8 / 10, "count": 10}


def test_a_trainer_that_does_not_set_what_the_driver_reads_fails_when_built():
  """harness.workload.Trainer: its abstract methods and the attributes its `built_with` names
  are checked at construction, each missing piece named."""
  from harness.workload import Trainer  # pylint: disable=import-outside-toplevel

  class Methods(Trainer):
    def init(self): ...
    def train(self, num_steps=None, *, samples=None): ...
    def describe(self, pipeline=True): ...

  with pytest.raises(TypeError, match="evaluate"):
    Methods()

  class NoEpoch(Methods):
    num_devices, data_replicas, device_kind, mesh_description, eval_examples = 1, 1, "x", "", 1
    def evaluate(self): ...

  with pytest.raises(TypeError, match=r"NoEpoch was built without train_examples: its "
                                      r"__init__ must set it \(declared by Trainer.built_with\)"):
    NoEpoch()
  NoEpoch.train_examples = 8
  assert NoEpoch().variable_samples is False and NoEpoch().process_hosts is None
