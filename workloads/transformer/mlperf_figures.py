"""What `predict` (harness/predict.py) takes of MLPerf's `transformer` from this workload.

parameters: Transformer-big with the shared 33,708-word vocabulary, counted in both frameworks
  and by formula by tests/transformer/test_transformer_model.py.
train_flops_per_example: XLA's cost analysis of this harness's compiled JAX train step on one
  H200, a packed row of 256 tokens (docs/benchmarks.md, the GPU table: 340 GFLOP a row); the
  MLPerf logs count sentence pairs, not rows, so the figure is given for the roofline's
  achieved fraction only, not to move a step.
"""
FIGURES = {
    "benchmark": "transformer",
    "rounds": ("0.6", "0.7"),
    "model": "Transformer-big (this harness's transformer workload)",
    "parameters": 210_804_736,
    "source": "workloads/transformer/mlperf_figures.py: parameters counted by "
              "tests/transformer/test_transformer_model.py",
}
