"""The TF runtime's model-parallel mini run through the command line (JAX's: the 3-D run of
test_pipeline_end_to_end.py; describe and simulate: test_model_parallel_end_to_end.py): the Transformer on data=1,model=2 reaches
its mini target with a checker-clean log: the driver, the beam-search eval and the log under
the model axis, on the fewest devices that show it. data x model composed is the JAX runs'
point end to end, and TF's in float64 equality (test_tf_model_parallel.py, with BERT's
vocabulary-parallel LAMB step): on 4 devices this run cost 81 CPU s against 46 on 2. TF's
spatial run is SSD's own end-to-end test (tests/ssd/test_ssd_end_to_end.py); BERT on
data=1,model=2 ran here too (82 CPU s) and showed nothing the Transformer's run does not."""
import pytest

from tests.conftest import run_to_target

pytestmark = pytest.mark.slow

RUNS = [("transformer", "2", "data=1,model=2", 85.0)]


@pytest.mark.parametrize("workload,devices,layout,target", RUNS)
def test_tf_layout_mini_reaches_target_with_a_checker_clean_log(cli, tmp_path, workload,
                                                                devices, layout, target):
  run_to_target(cli, tmp_path, "tf", workload, devices, layout, target)
