"""The TF runtime's model-parallel and spatial mini runs through the command line (the JAX
ones and the checks they share: test_model_parallel_end_to_end.py): the Transformer on
data=2,model=4, BERT on data=2,model=2 and SSD on data=1,spatial=2 (the same replica
coordinates) reach their mini targets with checker-clean logs. Each on the fewest devices that
show its point: data x model composed on the Transformer (data=2,model=2), the model axis alone
on BERT (data=1,model=2); the equality tests cover the other shapes."""
import pytest

from tests.conftest import run_to_target

pytestmark = pytest.mark.slow

RUNS = [("transformer", "4", "data=2,model=2", 85.0), ("bert", "2", "data=1,model=2", 0.6),
        ("ssd", "2", "data=1,spatial=2", 0.35)]


@pytest.mark.parametrize("workload,devices,layout,target", RUNS)
def test_tf_layout_mini_reaches_target_with_a_checker_clean_log(cli, tmp_path, workload,
                                                                devices, layout, target):
  run_to_target(cli, tmp_path, "tf", workload, devices, layout, target)
