"""DLRM-DCNv2 through the command line, as a user runs it: the mini preset reaches its AUC target
in both frameworks with the tables on a model axis (data=2,model=2, 4 simulated devices), the
row records the layout and its log passes the official checker (open division, ruleset 4.0.0;
epoch_num the epoch fraction, 4 evals an epoch). The one-device runs are the committed
baseline's 20 (tests/harness/test_summarize.py checks their logs). The placement `describe`
prints for the reference on model=8."""
import pytest

from tests.conftest import run_to_target
from workloads.dlrm import spec

TARGET = spec.mini().train.target


@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_mini_reaches_its_auc_target_with_a_checker_clean_log(cli, tmp_path, framework):
  run_to_target(cli, tmp_path, framework, "dlrm", "4", "data=2,model=2", TARGET)


def test_describe_lines_of_the_reference_tables_on_a_model_axis():
  cfg = spec.reference()
  cfg.parallel.mesh = "data=8,model=8"
  lines = dict(spec.describe_lines(cfg, 0))
  assert int(lines["parameters (formula)"].split()[0].replace(",", "")) == spec.parameter_count(
      spec.reference())
  plan = spec.plan(spec.reference(), 8)
  placement = lines["embedding tables"]
  assert f"{plan.kinds()['row-wise']} row-wise over model=8" in placement
  assert f"{plan.rows_per_shard:,} slab rows a peer" in placement
