"""One contract over every registered workload x framework, on its `tiny` preset: the Trainer
API the driver relies on (init, train, evaluate with the spec's metric over the whole eval
split, describe), and the same parameter count in both frameworks."""
import math

import pytest

from harness import config, registry
from harness.workload import Description, RunContext



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
  for attr in ("num_devices", "data_replicas", "mesh_description", "device_kind",
               "train_examples", "eval_examples"):
    assert getattr(trainer, attr) is not None, attr
  trainer.init()
  metrics = trainer.train(2)
  assert math.isfinite(metrics["loss"]) and metrics["step"] == 2 and "lr" in metrics
  result = trainer.evaluate()
  assert set(result) >= {spec.metric.name, "count"}
  assert result["count"] > 0 and spec.metric.low <= result[spec.metric.name] <= spec.metric.high
  if spec.name != "bert":            # every eval example once (BERT counts masked tokens)
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
