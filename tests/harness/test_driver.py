"""The driver's cadence, stopping and logging, with a scripted trainer (no framework needed),
and the logs it writes checked by the official compliance checker."""
import json
import os
import re
import math

import pandas as pd

from harness import cadence, compliance, driver
from harness.workload import Description, Trainer
from workloads.resnet import spec


class ScriptedTrainer(Trainer):
  """Returns a given accuracy after each eval; counts the steps it is asked to run."""
  num_devices, data_replicas, device_kind, mesh_description = 1, 1, "scripted", "data=1"

  def __init__(self, accuracies, losses=None, fail_at_eval=None, metric="top1_accuracy"):
    self.accuracies, self.losses, self.metric = list(accuracies), losses, metric
    self.fail_at_eval = fail_at_eval
    self.steps, self.evals, self.initialised, self.train_examples = [], 0, False, 640
    self.eval_examples = 100

  def init(self):
    self.initialised = True

  def train(self, num_steps=None, *, samples=None):
    assert self.initialised and samples is None
    self.steps.append(num_steps)
    loss = self.losses[len(self.steps) - 1] if self.losses else 1.0
    return {"loss": loss, "lr": 0.1, "step": sum(self.steps)}

  def evaluate(self):
    if self.evals == self.fail_at_eval:
      raise RuntimeError("device lost")
    self.evals += 1
    return {self.metric: self.accuracies[self.evals - 1], "count": 100}

  def describe(self, pipeline=True):  # pylint: disable=unused-argument
    return Description(parameters=1, parameter_bytes_per_device=4,
                       optimizer_state_bytes_per_device=0, train_flops_per_example=1.0)


def _run(tmp_path, trainer, cfg=None, preset="mini", steps=None, workload=spec.SPEC):
  cfg = cfg or spec.mini()
  cfg.train.global_batch_size = 64               # 640 examples -> 10 steps per epoch
  opts = driver.RunOptions(framework="jax", preset=preset, seed=7, steps=steps,
                           results_path=str(tmp_path / "r.csv"), log_dir=str(tmp_path / "logs"))
  rows = driver.run_all(workload, cfg, opts, lambda seed: trainer)
  events = [json.loads(l[9:]) for l in open(rows[0].log_path) if l.startswith(":::MLLOG")]
  return rows[0], events, pd.read_csv(tmp_path / "r.csv")


def test_blocks_follow_the_mlperf_cadence_with_offset():
  assert cadence.epoch_blocks(12, 4, 0) == [(0, 4), (4, 4), (8, 4)]
  assert cadence.epoch_blocks(10, 4, 2) == [(0, 2), (2, 4), (6, 4)]
  assert cadence.epoch_blocks(5, 4, 0) == [(0, 4), (4, 1)]


def test_stops_at_the_target_with_success(tmp_path):
  trainer = ScriptedTrainer([0.5, 0.8, 0.91, 0.95])
  row, events, frame = _run(tmp_path, trainer)
  assert row.status == "success" and row.epochs_to_converge == 3 and trainer.evals == 3
  assert trainer.steps == [10, 10, 10]
  evals = [e for e in events if e["key"] == "eval_accuracy"]
  assert [e["metadata"]["epoch_num"] for e in evals] == [1, 2, 3]
  assert events[-1]["key"] == "run_stop" and events[-1]["metadata"]["status"] == "success"
  assert len(frame) == 1 and frame.iloc[0]["samples_to_converge"] == 30 * 64
  assert compliance.check(row.log_path)[0]


def test_budget_spent_is_aborted_and_logged(tmp_path):
  cfg = spec.mini()
  cfg.train.max_epochs = 3
  row, events, _ = _run(tmp_path, ScriptedTrainer([0.1, 0.2, 0.3]), cfg)
  assert row.status == "aborted" and "not reached" in row.abort_reason
  assert events[-1]["metadata"]["status"] == "aborted"
  assert math.isnan(row.time_to_train_s) if isinstance(row.time_to_train_s, float) else \
      row.time_to_train_s is None
  assert compliance.check(row.log_path)[0]          # an aborted run's log is still compliant


def test_nan_loss_aborts_before_eval(tmp_path):
  trainer = ScriptedTrainer([0.5, 0.6], losses=[1.0, float("nan")])
  row, _, _ = _run(tmp_path, trainer)
  assert row.status == "aborted" and "non-finite loss" in row.abort_reason
  assert trainer.evals == 1


def test_an_exception_still_ends_in_a_row_and_run_stop(tmp_path):
  row, events, frame = _run(tmp_path, ScriptedTrainer([0.5], fail_at_eval=1))
  assert row.status == "aborted" and "RuntimeError: device lost" in row.abort_reason
  assert events[-1]["key"] == "run_stop" and len(frame) == 1


def test_steps_cap_truncates_the_block(tmp_path):
  trainer = ScriptedTrainer([0.1, 0.2])
  row, events, _ = _run(tmp_path, trainer, steps=15)
  assert trainer.steps == [10, 5]
  assert [e["metadata"]["epoch_num"] for e in events if e["key"] == "eval_accuracy"] == [1, 2]


def test_steps_per_loop_splits_blocks_for_progress(tmp_path):
  cfg = spec.mini()
  cfg.train.steps_per_loop = 4
  trainer = ScriptedTrainer([0.95])
  _run(tmp_path, trainer, cfg)
  assert trainer.steps == [4, 4, 2]


def test_efficientnet_rule_file_runs_in_the_official_checker(tmp_path):
  """rules/efficientnet_compliance.yaml in the official engine, on a log the driver writes for
  EfficientNet (its recipe's keys included)."""
  from workloads.efficientnet import spec as eff_spec
  cfg = eff_spec.mini()
  cfg.train.max_epochs = 3
  opts = driver.RunOptions(framework="jax", preset="mini", seed=7,
                           results_path=str(tmp_path / "r.csv"), log_dir=str(tmp_path / "logs"))
  row = driver.run_all(eff_spec.SPEC, cfg, opts,
                       lambda seed: ScriptedTrainer([0.5, 0.8, 0.91], metric="top1_accuracy"))[0]
  assert row.status == "success"
  text = open(row.log_path).read()
  open_log = tmp_path / "eff_open.log"
  open_log.write_text(text)
  assert compliance.check(str(open_log))[0]
  closed = tmp_path / "eff_closed.log"           # closed division: 0.91 >= 0.763 passes ...
  closed.write_text(text.replace('"value": "open"', '"value": "closed"'))
  assert compliance.check(str(closed))[0]
  def with_accuracies(source, path, value):
    lines = [re.sub(r'"value": [0-9.]+', f'"value": {value}', l) if '"eval_accuracy"' in l
             else l for l in source.splitlines(True)]
    path.write_text("".join(lines))
    return str(path)
  passed, report = compliance.check(with_accuracies(closed.read_text(), tmp_path / "low", 0.7))
  assert not passed, report                      # ... and a best accuracy below it fails
  assert not compliance.check(with_accuracies(text, tmp_path / "perfect", 1.0))[0]   # not 1.0
  short = tmp_path / "eff_short.log"             # the RMSProp recipe without one of its keys
  short.write_text("".join(l for l in text.splitlines(True) if '"opt_rmsprop_epsilon"' not in l))
  assert not compliance.check(str(short))[0]


def test_sample_blocks_round_eval_points_up_to_whole_batches():
  assert cadence.sample_blocks(1000, 250, 100) == [(0, 3), (3, 2), (5, 3), (8, 2)]
  assert cadence.sample_blocks(400, 50, 100) == [(0, 1), (1, 1), (2, 1), (3, 1)]


def _bert_sample_run(tmp_path, trainer, steps=None):
  """BERT's mini config at batch 100, evals every 250 samples up to 1000: (row, log events)."""
  from workloads.bert import spec as bert_spec
  cfg = bert_spec.mini()
  cfg.train.global_batch_size, cfg.train.eval_every_samples, cfg.train.max_samples = 100, 250, 1000
  opts = driver.RunOptions(framework="jax", preset="mini", seed=7, steps=steps,
                           results_path=str(tmp_path / "r.csv"), log_dir=str(tmp_path / "logs"))
  row = driver.run_all(bert_spec.SPEC, cfg, opts, lambda seed: trainer)[0]
  return row, [json.loads(l[9:]) for l in open(row.log_path) if l.startswith(":::MLLOG")]


def test_sample_cadence_logs_samples_trained_as_epoch_num(tmp_path):
  """BERT's cadence (rules/bert.yaml): evals every N samples, epoch_num = samples trained."""
  trainer = ScriptedTrainer([0.1, 0.2, 0.7], metric="masked_lm_accuracy")
  row, events = _bert_sample_run(tmp_path, trainer)
  assert trainer.steps == [3, 2, 3] and row.status == "success" and row.samples_to_converge == 800
  assert [e["metadata"]["epoch_num"] for e in events if e["key"] == "eval_accuracy"] == [300, 500, 800]
  assert [e["metadata"]["first_epoch_num"] for e in events if e["key"] == "block_start"] == [0, 300, 500]
  assert compliance.check(row.log_path)[0]


class PackedTrainer(ScriptedTrainer):
  """Trains packed rows: each step its own sample count (70, 90, 110, ... cycling)."""
  variable_samples = True

  def __init__(self, accuracies, **kw):
    super().__init__(accuracies, **kw)
    self.asked, self.step_samples, self.done_steps = [], [], 0

  def train(self, num_steps=None, *, samples=None):
    assert samples is not None
    self.asked.append(samples)
    trained, steps = 0, 0
    while trained < samples and (num_steps is None or steps < num_steps):
      steps += 1
      count = (70, 90, 110)[self.done_steps % 3]
      self.step_samples.append(count)
      trained, self.done_steps = trained + count, self.done_steps + 1
    return {"loss": 1.0, "lr": 0.1, "step": self.done_steps, "samples": trained}


def test_packed_steps_end_blocks_at_samples_and_log_those_trained(tmp_path):
  """Packed BERT rows: blocks end at the first step reaching each eval point (rounded to whole
  batches of the average size, as unpacked), epoch_num and the row count the samples trained."""
  trainer = PackedTrainer([0.1, 0.2, 0.7], metric="masked_lm_accuracy")
  row, events = _bert_sample_run(tmp_path, trainer)
  # eval points 300, 500, 800 (unpacked: [3, 2, 3] steps); steps of 70, 90, 110, 70, ...
  # reach 340 after 4 steps, 540 after 6, 810 after 9
  assert trainer.asked == [300, 500 - 340, 800 - 540]
  assert [e["metadata"]["epoch_num"] for e in events if e["key"] == "eval_accuracy"] == [340, 540, 810]
  assert [e["metadata"]["first_epoch_num"] for e in events if e["key"] == "block_start"] == [0, 300, 500]
  assert row.status == "success" and row.samples_to_converge == 810 == sum(trainer.step_samples)
  assert compliance.check(row.log_path)[0]


def test_packed_steps_honour_the_steps_cap_and_skip_eval_points_already_passed(tmp_path):
  trainer = PackedTrainer([0.1, 0.2, 0.3], metric="masked_lm_accuracy")
  row, events = _bert_sample_run(tmp_path, trainer, steps=5)
  # --steps 5: 4 steps reach 340, then one more step (90) of the second block: 430 samples
  assert trainer.asked == [300, 160] and trainer.done_steps == 5
  assert row.status == "aborted" and row.samples_completed == 430
  # steps of 400 samples, eval points 300, 500, 800, 1000: 400 (eval), 800 (eval; 800 passed
  # too, so no block of its own), 1200 (eval)
  big = PackedTrainer([0.1, 0.2, 0.3, 0.4], metric="masked_lm_accuracy")
  big.train = lambda num_steps=None, samples=None: big.asked.append(samples) or {
      "loss": 1.0, "lr": 0.1, "step": len(big.asked), "samples": 400}
  _, events = _bert_sample_run(tmp_path / "big", big)
  assert [e["metadata"]["epoch_num"] for e in events if e["key"] == "eval_accuracy"] == [400, 800,
                                                                                          1200]
  assert big.asked == [300, 100, 200]


def test_listed_epoch_schedule_evaluates_at_exactly_those_epochs(tmp_path):
  """SSD's schedule (rules/ssd.yaml, eval at 40, 50, 55, ...), scaled down: eval at 2, 4, 5."""
  cfg = spec.mini()
  cfg.train.eval_at_epochs, cfg.train.max_epochs = (2.0, 4.0, 5.0), 9
  trainer = ScriptedTrainer([0.1, 0.2, 0.3])
  row, events, _ = _run(tmp_path, trainer, cfg)
  # Blocks of 2, 2 and 1 epochs, each run one epoch per call (a progress line between).
  assert trainer.steps == [10] * 5 and row.status == "aborted"   # budget ends at epoch 5
  assert [e["metadata"]["epoch_num"] for e in events if e["key"] == "eval_accuracy"] == [2, 4, 5]
  blocks = [(e["metadata"]["first_epoch_num"], e["metadata"]["epoch_count"])
            for e in events if e["key"] == "block_start"]
  assert blocks == [(0, 2), (2, 2), (4, 1)]
  assert compliance.check(row.log_path)[0]


def test_ssd_rules_schedule_reaches_the_preset():
  from harness import rules
  train = cadence.apply_rules(spec.mini().train, rules.load("ssd").eval_cadence)
  assert train.eval_at_epochs == (40, 50, 55, 60, 65, 70, 75, 80) and train.max_epochs == 80
  ends = [end for end, _, _ in cadence.plan(train, per_epoch=10, max_steps=10_000)]
  assert ends == [400, 500, 550, 600, 650, 700, 750, 800]


def test_metric_in_its_own_units_is_logged_at_the_mlperf_scale(tmp_path):
  """A BLEU-like metric: target 25 in BLEU points, eval_accuracy logged as BLEU / 100."""
  import dataclasses
  from harness.workload import Metric
  bleu = dataclasses.replace(spec.SPEC, metric=Metric("bleu", "BLEU points", 0, 100, 0.01))
  cfg = spec.mini()
  cfg.train.target = 25.0
  trainer = ScriptedTrainer([12.5, 25.5], metric="bleu")
  row, events, frame = _run(tmp_path, trainer, cfg, workload=bleu)
  assert row.status == "success" and trainer.evals == 2
  assert [e["value"] for e in events if e["key"] == "eval_accuracy"] == [0.125, 0.255]
  assert frame.iloc[0]["final_metric"] == 25.5 and frame.iloc[0]["metric_name"] == "bleu"


def test_lower_is_better_metric_stops_when_it_falls_to_the_target(tmp_path):
  import dataclasses
  from harness.workload import Metric
  loss_like = dataclasses.replace(spec.SPEC, metric=Metric("error_rate", "fraction",
                                                           higher_is_better=False))
  cfg = spec.mini()
  cfg.train.target = 0.2
  trainer = ScriptedTrainer([0.5, 0.3, 0.15, 0.1], metric="error_rate")
  row, _, _ = _run(tmp_path, trainer, cfg, workload=loss_like)
  assert row.status == "success" and trainer.evals == 3


def test_division_is_closed_only_for_the_reference_model():
  """The log's submission_division: the reference preset with its model is closed, whatever
  its tunables (batch, learning rate) and layout; a mini preset, or the reference with a
  changed model (ST-MoE experts, another width), is open."""
  from harness import registry
  from harness.driver import division
  spec = registry.get("transformer")
  tuned = spec.configure("reference", ["train.global_batch_size=2048",
                                       "optimizer.base_learning_rate=1.0",
                                       "parallel.mesh=data=2,model=4"])
  assert division(spec, "reference", tuned) == "closed"
  for preset, overrides in (("reference", ["model.moe.num_experts=32"]),
                            ("reference", ["model.hidden_size=512"]), ("mini", [])):
    assert division(spec, preset, spec.configure(preset, overrides)) == "open"


def test_the_official_checker_leaves_no_file_where_it_is_run(tmp_path, monkeypatch):
  """mlperf_logging's checker writes compliance_checker.log into its working directory: `check`
  runs it in a temporary one, so a user's folder (the repository root) gets nothing."""
  trainer = ScriptedTrainer([0.95])
  row, _, _ = _run(tmp_path, trainer)
  here = tmp_path / "cwd"
  here.mkdir()
  monkeypatch.chdir(here)
  passed, _ = compliance.check(row.log_path)
  assert passed and os.listdir(here) == []


def test_evals_within_an_epoch_log_the_epoch_fraction(tmp_path):
  """DLRM-DCNv2's schedule (rules/dlrm_dcnv2.yaml: every 0.05 epoch = 20 evals an epoch) scaled
  down to 4 an epoch: an eval every floor(10 / 4) = 2 steps, epoch_num the fraction trained;
  the official checker (4.0.0, open division) passes the log."""
  from harness import rules
  from workloads.dlrm import spec as dlrm_spec
  reference = cadence.apply_rules(dlrm_spec.reference().train, rules.load("dlrm_dcnv2").eval_cadence)
  assert reference.evals_per_epoch == 20
  per_epoch = cadence.steps_per_epoch(4_195_197_692, 55296)       # 75,869 steps
  ends = [end for end, _, _ in cadence.plan(reference, per_epoch, per_epoch)]
  assert len(ends) == 21 and ends[:2] == [3793, 7586] and ends[-1] == per_epoch   # 20 x 3,793
  cfg = dlrm_spec.mini()
  cfg.train.evals_per_epoch, cfg.train.max_epochs = 4, 2.0
  trainer = ScriptedTrainer([0.5, 0.6, 0.88], metric="auc")
  row, events, _ = _run(tmp_path, trainer, cfg, workload=dlrm_spec.SPEC)
  assert trainer.steps == [2, 2, 2] and row.status == "success"
  assert [e["metadata"]["epoch_num"] for e in events if e["key"] == "eval_accuracy"] == [
      0.2, 0.4, 0.6]
  blocks = [(e["metadata"]["first_epoch_num"], e["metadata"]["epoch_count"])
            for e in events if e["key"] == "block_start"]
  assert blocks == [(0.0, 0.2), (0.2, 0.2), (0.4, 0.2)]
  assert compliance.check(row.log_path)[0]


def test_the_log_and_the_row_time_the_run_from_the_same_clock_readings(tmp_path, monkeypatch):
  """Every clock reading 0.7 ms after the last (injected, so a millisecond boundary falls between
  any two): the log's run_start/run_stop (what the official summarizer scores) are the driver's
  own readings, and the row's time_to_train_s is exactly their difference. mllog stamping the
  events from its own clock would put them a reading later than the driver's."""
  clock = iter(1_700_000_000.0 + 0.0007 * i for i in range(10**6))
  monkeypatch.setattr(driver.time, "time", lambda: next(clock))
  row, events, frame = _run(tmp_path, ScriptedTrainer([0.5, 0.95]))
  start, = [e for e in events if e["key"] == "run_start"]
  stop, = [e for e in events if e["key"] == "run_stop"]
  assert "time_ms" not in start["metadata"] and "time_ms" not in stop["metadata"]
  assert row.time_to_train_s == (stop["time_ms"] - start["time_ms"]) / 1000
  assert frame.iloc[0]["time_to_train_s"] == row.time_to_train_s
