import pytest

from harness import config
from harness.errors import UsageError
from workloads.resnet import spec


def test_override_types_are_parsed_from_the_declared_field_type():
  cfg = spec.mini()
  config.apply_overrides(cfg, ["train.global_batch_size=128", "optimizer.name=sgd",
                               "model.stage_sizes=2,2,2,2", "train.target=0.5",
                               "optimizer.momentum=0.8"])
  assert cfg.train.global_batch_size == 128
  assert cfg.optimizer.name == "sgd"
  assert cfg.model.stage_sizes == (2, 2, 2, 2)
  assert cfg.train.target == 0.5 and cfg.optimizer.momentum == 0.8


@pytest.mark.parametrize("override, message", [
    ("train.nope=1", "train.nope: no such key"),
    ("train=1", "train: no such key"),
    ("train.global_batch_size=abc", "not a valid int"),
    ("train.global_batch_size=0", "train.global_batch_size=0 is out of range"),
    ("train.target=1.0", "train.target=1.0 is out of range"),
    ("optimizer.name=adam", "choose one of: lars, sgd"),
    ("train.precision=fp8", "choose one of: float32, bfloat16"),
    ("novalue", "expected KEY=VALUE"),
])
def test_bad_overrides_name_the_value_and_what_is_allowed(override, message):
  with pytest.raises(UsageError, match=message.replace(".", r"\.").replace("(", r"\(")):
    config.apply_overrides(spec.mini(), [override])


def test_flatten_lists_every_leaf():
  flat = config.flatten(spec.reference())
  assert flat["train.global_batch_size"] == 4096
  assert flat["optimizer.base_learning_rate"] == 10.0
  assert flat["model.stage_sizes"] == (3, 4, 6, 3)
