"""One contract over every registered workload x framework, on its `tiny` preset: the Trainer
API the driver relies on (init, train, evaluate with the spec's metric over the whole eval
split, describe), and the same parameter count in both frameworks."""
import math

import pytest

from harness import config, registry
from harness.workload import Description, RunContext, Trainer

BASES = {"jax": ("workloads.parallel.jax_trainer_base", "MeshTrainer"),
         "tf": ("workloads.parallel.tf_trainer_base", "StrategyTrainer")}


def _base(framework):
  import importlib  # pylint: disable=import-outside-toplevel
  module, name = BASES[framework]
  return getattr(importlib.import_module(module), name)



@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("contract_data"))


def _check_trainer(spec, framework, data_dir):
  # TF without XLA: the contract is the trainer API, and each workload's XLA-compiled TF step
  # is its end-to-end test's (tests/*/test_*_end_to_end.py run the mini preset with
  # train.jit_compile on, the default, through the CLI). Compiling it again here cost 63 of
  # the TF trainers' 112 s on 2 CPU cores; JAX ignores the key.
  cfg = spec.configure("tiny", ["parallel.mesh=data=1", "train.jit_compile=false"])
  trainer = spec.make_trainer(framework, cfg, RunContext(seed=0, preset="tiny",
                                                         data_dir=data_dir))
  assert isinstance(trainer, _base(framework)) and isinstance(trainer, Trainer)
  for attr in ("num_devices", "data_replicas", "mesh_description", "device_kind",
               "train_examples", "eval_examples"):
    assert getattr(trainer, attr) is not None, attr
  trainer.init()
  metrics = trainer.train(2)
  assert math.isfinite(metrics["loss"]) and metrics["step"] == 2 and "lr" in metrics
  result = trainer.evaluate()
  assert set(result) >= {spec.metric.name, "count"}
  assert result["count"] > 0 and spec.metric.low <= result[spec.metric.name] <= spec.metric.high
  if spec.metric.counts == "examples":      # every eval example once
    assert result["count"] == cfg.data.eval_examples
  info = trainer.describe()
  assert isinstance(info, Description) and info.parameters > 0
  assert info.parameter_bytes_per_device > 0 and info.optimizer_state_bytes_per_device > 0
  return info.parameters


@pytest.mark.parametrize("name", registry.names())
def test_trainer_contract_on_the_tiny_preset(name, data_dir):
  """Each framework's trainer honours the contract, and both count the same parameters."""
  spec = registry.get(name)
  assert set(spec.trainer_modules) == set(config.FRAMEWORKS)
  counts = {fw: _check_trainer(spec, fw, data_dir) for fw in config.FRAMEWORKS}
  assert counts["jax"] == counts["tf"], counts


@pytest.mark.parametrize("framework,hook", [("jax", "train_step_fn"), ("tf", "loss_and_grads")])
def test_a_trainer_missing_a_hook_fails_when_it_is_built_naming_the_hook(framework, hook):
  """Every hook a base leaves to its workload is abstract: a trainer without it is refused at
  construction, before any runtime, data or log exists."""
  base = _base(framework)
  others = {name: (lambda self, *a, **k: None) for name in base.__abstractmethods__
            if name != hook}
  incomplete = type("Incomplete", (base,), {"spec": registry.get("resnet50"), **others})
  with pytest.raises(TypeError, match=hook):
    incomplete(None, None)


def test_a_trainer_whose_init_misses_a_declared_attribute_fails_when_built(data_dir):
  """The attributes the bases read and a workload's __init__ supplies (Trainer.built_with and
  the bases' own: the schedule, the flax model) are checked once __init__ returns."""
  from workloads.parallel.jax_trainer_base import MeshTrainer  # pylint: disable=import-outside-toplevel
  from workloads.resnet import jax_trainer  # pylint: disable=import-outside-toplevel

  class WithoutSchedule(jax_trainer.ResNetTrainer):
    def __init__(self, cfg, ctx):                 # the base's part only: no model, no schedule
      MeshTrainer.__init__(self, cfg, ctx)        # pylint: disable=non-parent-init-called

  spec = registry.get("resnet50")
  cfg = spec.configure("tiny", ["parallel.mesh=data=1"])
  with pytest.raises(TypeError, match=r"WithoutSchedule was built without schedule: .*"
                                      r"WorkloadTrainer\.built_with"):
    WithoutSchedule(cfg, RunContext(seed=0, preset="tiny", data_dir=data_dir))
