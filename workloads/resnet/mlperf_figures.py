"""What `predict` (harness/predict.py) takes of MLPerf's `resnet` from this workload, so that
no table outside the workload's folder names it (issue 70 item 4): the model's trainable
parameters (the gradient a data-parallel step all-reduces) and its training FLOPs an example.

parameters: this harness's ResNet-50 v1.5 at 224x224, 1,000 classes, counted in both
  frameworks by tests/resnet/test_resnet_model.py and test_resnet_parity.py.
train_flops_per_example: XLA's cost analysis of this harness's compiled JAX train step at the
  reference shapes on one H200 (docs/benchmarks.md, the GPU table: 23.75 GFLOP a sample).
eval_on_device: top-1 accuracy is counted on the chips and summed over them (a few numbers
  all-reduced), so an eval is forward passes over the 50,000 images split over the chips.
"""
FIGURES = {
    "benchmark": "resnet",
    "rounds": ("0.6", None),          # every round so far: ResNet-50 v1.5 at 224x224
    "model": "ResNet-50 v1.5 (this harness's resnet50 workload)",
    "parameters": 25_557_032,
    "train_flops_per_example": 23.75e9,
    "eval_on_device": True,           # see the module docstring
    "source": "workloads/resnet/mlperf_figures.py: parameters counted by "
              "tests/resnet/test_resnet_model.py; FLOPs from XLA's cost analysis of the "
              "compiled step (docs/benchmarks.md)",
}
