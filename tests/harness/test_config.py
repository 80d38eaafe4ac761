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
    ("train.target=1.0", "train.target=1.0 is out of range for top1_accuracy"),
    ("train.target=25", "train.target=25.0 is out of range for top1_accuracy (fraction); "
                        "allowed: 0 < target < 1"),
    ("optimizer.lars_eta=0", "optimizer.lars_eta=0.0 is out of range"),
    ("optimizer.name=adam", "choose one of: lars, sgd"),
    ("train.precision=fp8", "choose one of: float32, bfloat16"),
    ("novalue", "expected KEY=VALUE"),
])
def test_bad_overrides_name_the_value_and_what_is_allowed(override, message):
  with pytest.raises(UsageError, match=message.replace(".", r"\.").replace("(", r"\(")
                     .replace(")", r"\)")):
    spec.SPEC.configure("mini", [override])


def test_flatten_lists_every_leaf():
  flat = config.flatten(spec.reference())
  assert flat["train.global_batch_size"] == 4096
  assert flat["optimizer.base_learning_rate"] == 10.0
  assert flat["model.stage_sizes"] == (3, 4, 6, 3)


def test_validators_name_the_dotted_key_the_user_typed():
  from workloads.bert import spec as bert_spec
  with pytest.raises(UsageError, match=r"^optimizer\.epsilon=0\.0 is out of range"):
    bert_spec.SPEC.configure("mini", ["optimizer.epsilon=0"])
  with pytest.raises(UsageError, match=r"^model\.dropout=1\.5 is out of range"):
    bert_spec.SPEC.configure("mini", ["model.dropout=1.5"])


@pytest.mark.parametrize("gbs, interval, steps", [
    (256, 150_000, 13_700), (1024, 150_000, 3425), (3072, 175_000, 1142),
    (4096, 175_000, 857), (8192, 225_000, 429)])
def test_bert_derived_values_follow_the_batch_after_set(gbs, interval, steps):
  """rules/bert.yaml's example table of FLOOR(0.05 * (230.23 * GBS + 3e6), 25000), and the LAMB
  decay steps covering the reference sample budget (256 x 13,700)."""
  from workloads.bert import spec as bert_spec
  cfg = bert_spec.SPEC.configure("reference", [f"train.global_batch_size={gbs}"])
  assert cfg.train.eval_every_samples == interval
  assert cfg.optimizer.training_steps == steps == -(-256 * 13_700 // gbs)
  assert bert_spec.mllog_hyperparameters(cfg, 0)["eval_interval_samples"] == interval
  given = bert_spec.SPEC.configure("reference", [f"train.global_batch_size={gbs}",
                                                 "train.eval_every_samples=50000"])
  assert given.train.eval_every_samples == 50_000          # a value the user set is kept


def test_rules_examples_table_matches_the_formula():
  from harness import rules
  from workloads.bert import spec as bert_spec
  for gbs, interval in rules.load("bert").eval_cadence["examples"].items():
    assert bert_spec.eval_interval_samples(gbs) == interval
