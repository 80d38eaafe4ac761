"""ROC AUC over the whole eval set, as the reference computes it (torchmetrics' AUROC over every
rank's scores gathered): the eval's host side for both frameworks (harness.workload.Evaluator).

Every batch's scores and labels come to the host (the trainers gather the global batch from
every device and process), the padding ('mask' 0) is dropped, and `finalize` computes the AUC
of all of them at once: the Mann-Whitney statistic, ties counted half (the area under the ROC
curve's straight segments), from SciPy's average ranks, in float64.
"""
import numpy as np
from scipy import stats


def roc_auc(scores, labels) -> float:
  """P(score of a positive > score of a negative) + P(tie) / 2."""
  scores = np.asarray(scores, np.float64)
  positive = np.asarray(labels) > 0.5
  n_pos = int(positive.sum())
  n_neg = positive.size - n_pos
  if not n_pos or not n_neg:
    raise ValueError(f"AUC needs both classes in the eval set; got {n_pos} positive and "
                     f"{n_neg} negative examples")
  ranks = stats.rankdata(scores)                 # 1-based, ties averaged
  return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


class AucEvaluator:
  """DLRM's Evaluator (harness.workload): every batch's unpadded scores and labels kept on the
  host, the AUC of all of them at finalize."""
  on_host = True

  def __init__(self, cfg, data_dir, metric_name, pipeline):
    del cfg, data_dir, pipeline                   # the scores and labels come with the batches
    self.metric_name = metric_name

  def accumulate(self, acc, outputs):
    """outputs: {'score', 'label', 'mask'} of one global batch (numpy)."""
    keep = np.asarray(outputs["mask"]) > 0
    acc = acc or {"score": [], "label": []}
    acc["score"].append(np.asarray(outputs["score"], np.float64)[keep])
    acc["label"].append(np.asarray(outputs["label"])[keep])
    return acc

  def finalize(self, acc) -> dict:
    scores, labels = np.concatenate(acc["score"]), np.concatenate(acc["label"])
    return {self.metric_name: roc_auc(scores, labels), "count": int(scores.size)}
