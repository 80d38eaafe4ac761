"""What `predict` (harness/predict.py) takes of MLPerf's `dlrm_dcnv2` from this workload: the
figures follow from the reference config in spec.py, none is kept by hand.

dense parameters: the MLPs and cross layers (spec.parameter_count less the tables): the part
  a data-parallel step all-reduces. The tables are model-parallel: each chip holds some of
  them, and a step moves every example's pooled vectors (26 features x embedding_dim) to the
  chip that computes its dense part and their gradients back (two all-to-alls).
train_flops_per_example: 3 x 2 FLOPs per dense weight (every dense layer and cross layer is a
  matrix product: forward 2 FLOPs a weight an example, backward twice that).
lookup_bytes_per_example: the ids each example gathers (multi-hot sizes summed) x the
  embedding dimension x 4 B (float32 tables): memory traffic, not FLOPs.
"""
from workloads.dlrm import spec


def _figures() -> dict:
  cfg = spec.reference()
  m = cfg.model
  dense = spec.parameter_count(cfg) - sum(m.num_embeddings_per_feature) * m.embedding_dim
  return {
      "benchmark": "dlrm_dcnv2",
      "rounds": ("3.0", None),
      "model": "DLRM-DCNv2 (this harness's dlrm workload, the TorchRec reference's sizes)",
      "parameters": dense,
      "train_flops_per_example": 6.0 * dense,
      "embedding": {"features": m.num_features, "dim": m.embedding_dim,
                    "lookups_per_example": sum(m.multi_hot_sizes)},
      "lookup_bytes_per_example": sum(m.multi_hot_sizes) * m.embedding_dim * 4,
      "source": "workloads/dlrm/mlperf_figures.py: from spec.reference() (spec.parameter_count "
                "less the tables; the reference's --num_embeddings_per_feature, "
                "--multi_hot_sizes, embedding_dim 128)",
  }


FIGURES = _figures()
