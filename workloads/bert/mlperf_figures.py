"""What `predict` (harness/predict.py) takes of MLPerf's `bert` from this workload (issue 70
item 4: no table of workloads outside their folders).

parameters: this harness's BERT-large (uncased, 30,522 words), counted in both frameworks
  against the reference's own count by tests/bert/test_bert_parity.py.
train_flops_per_example: XLA's cost analysis of this harness's compiled JAX train step at
  sequence length 512 on one H200 (docs/benchmarks.md, the GPU table: 1,032 GFLOP a sample).
sample_unit: the BERT RCPs count samples, not epochs (mlperf_logging's rcps_bert.json).
eval_on_device: the masked-LM accuracy is counted on the chips and summed over them, so an
  eval is forward passes over the eval set split over the chips.
"""
FIGURES = {
    "benchmark": "bert",
    "rounds": ("0.7", None),
    "model": "BERT-large, sequence 512 (this harness's bert workload)",
    "parameters": 336_226_108,
    "train_flops_per_example": 1032e9,
    "eval_on_device": True,           # see the module docstring
    "sample_unit": "samples",
    "source": "workloads/bert/mlperf_figures.py: parameters counted by "
              "tests/bert/test_bert_parity.py; FLOPs from XLA's cost analysis of the compiled "
              "step (docs/benchmarks.md)",
}
