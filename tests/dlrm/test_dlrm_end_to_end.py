"""DLRM-DCNv2 through the command line, as a user runs it: the mini preset reaches its AUC target
in both frameworks, on one device and with the tables on a model axis (data=2,model=2, 4
simulated devices), each run's row records the layout and its log passes the official checker
(open division, ruleset 4.0.0; epoch_num the epoch fraction, 4 evals an epoch). describe
reports the placement and the reference's parameter count."""
import pytest

from tests.conftest import run_to_target
from workloads.dlrm import spec

TARGET = spec.mini().train.target


@pytest.mark.parametrize("framework", ["jax", "tf"])
@pytest.mark.parametrize("devices,layout", [("1", "data=1"), ("4", "data=2,model=2")])
def test_mini_reaches_its_auc_target_with_a_checker_clean_log(cli, tmp_path, framework, devices,
                                                              layout):
  run_to_target(cli, tmp_path, framework, "dlrm", devices, layout, TARGET)


def test_describe_the_reference_tables_on_a_model_axis(cli):
  proc = cli("describe", "dlrm", "--preset", "reference", "--mesh", "data=8,model=8",
             "--set", "train.global_batch_size=64")
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  lines = dict(line.split(":", 1) for line in proc.stdout.splitlines() if ":" in line)
  assert int(lines["parameters (formula)"].split()[0].replace(",", "")) == spec.parameter_count(
      spec.reference())
  plan = spec.plan(spec.reference(), 8)
  placement = lines["embedding tables"]
  assert f"{plan.kinds()['row-wise']} row-wise over model=8" in placement
  assert f"{plan.rows_per_shard:,} slab rows a peer" in placement
