"""The TF runtime's model-parallel and spatial mini runs through the command line (the JAX
ones and the checks they share: test_model_parallel_end_to_end.py): the Transformer and BERT on
data=1,model=2 (BERT's vocabulary-parallel masked-LM eval) and SSD on data=1,spatial=2 reach
their mini targets with checker-clean logs. Each on the fewest devices that show its point: the
driver, the eval and the log under the layout. data x model composed is the JAX runs' point
end to end, and TF's in float64 equality (test_tf_model_parallel.py): on 4 devices this run
cost 81 CPU s against 46 on 2."""
import pytest

from tests.conftest import run_to_target

pytestmark = pytest.mark.slow

RUNS = [("transformer", "2", "data=1,model=2", 85.0), ("bert", "2", "data=1,model=2", 0.6),
        ("ssd", "2", "data=1,spatial=2", 0.35)]


@pytest.mark.parametrize("workload,devices,layout,target", RUNS)
def test_tf_layout_mini_reaches_target_with_a_checker_clean_log(cli, tmp_path, workload,
                                                                devices, layout, target):
  run_to_target(cli, tmp_path, "tf", workload, devices, layout, target)
