"""What `predict` (harness/predict.py) takes of MLPerf's `ssd` from this workload: SSD300 with
a ResNet-34 backbone, MLPerf's `ssd` up to round 1.0 only (from 2.0 on `ssd` is RetinaNet,
whose figures are in harness/predict_figures.json: this workload is not that model).

parameters: counted layer by layer and in both frameworks by tests/ssd/test_ssd_model.py.
train_flops_per_example: XLA's cost analysis of this harness's compiled JAX train step at
  300x300 on one H200 (docs/benchmarks.md, the GPU table: 91.6 GFLOP a sample).
"""
FIGURES = {
    "benchmark": "ssd",
    "rounds": ("0.7", "1.0"),
    "model": "SSD300-ResNet34 (this harness's ssd workload)",
    "parameters": 19_972_534,
    "train_flops_per_example": 91.6e9,
    "source": "workloads/ssd/mlperf_figures.py: parameters counted by "
              "tests/ssd/test_ssd_model.py; FLOPs from XLA's cost analysis of the compiled "
              "step (docs/benchmarks.md)",
}
