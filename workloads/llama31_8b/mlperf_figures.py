"""What `predict` (harness/predict.py) takes of MLPerf's `llama31_8b` from this workload.

parameters: this harness's Llama 3.1 8B, counted from shapes in both frameworks against a hand
  formula by tests/llama31_8b/test_llama_model.py (8,030,261,248).
train_flops_per_example: 6 x parameters a token (Kaplan et al. 2020, C = 6N) x 8,192 tokens,
  plus causal attention's score and context matmuls, 6 x 32 layers x 8,192^2 x 4,096 / 2 a
  sequence forward and back (the causal half): 3.95e14 + 2.64e13.
sample_unit: the RCPs count samples (sequences of 8,192 tokens), the log's samples_count.
eval_on_device: the eval's token cross-entropy is a sum reduced on the chips.
layout: the reference's (pretrain_llama31.py for 8B: tensor 1, pipeline 1, data parallel
  with the distributed optimizer) where the log does not state one.
"""
PARAMETERS = 8_030_261_248
SEQUENCE, LAYERS, HIDDEN = 8192, 32, 4096

FIGURES = {
    "benchmark": "llama31_8b",
    "rounds": ("5.1", None),
    "model": "Llama 3.1 8B, sequence 8,192 (this harness's llama31_8b workload)",
    "parameters": PARAMETERS,
    "train_flops_per_example": 6 * PARAMETERS * SEQUENCE + 6 * LAYERS * SEQUENCE ** 2 * HIDDEN / 2,
    "eval_on_device": True,
    "sample_unit": "samples",
    "layout": {"gpu": {"tensor": 1, "pipeline": 1, "micro_batch": 1},
               "tpu": {"tensor": 1, "pipeline": 1, "micro_batch": 1}},
    "source": "workloads/llama31_8b/mlperf_figures.py: parameters counted by "
              "tests/llama31_8b/test_llama_model.py; FLOPs 6N a token plus causal attention",
}
