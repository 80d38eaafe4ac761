"""The host side of the BLEU eval, shared by both trainers (framework-neutral): each gathered
eval batch's best-beam tokens become text (the run's vocabulary) and BLEU statistics against
the raw reference line of their 'index'; the statistics are summed over the eval set (each
sentence once: padding rows have mask 0) and scored once at the end, since BLEU is a corpus
score, not a mean of sentence scores."""
import numpy as np

from workloads.common import bleu


def accumulate(acc, outputs, encoder, references):
  """acc ([statistics], sentence count) plus one batch: outputs {'tokens' [B, T], 'index' [B],
  'mask' [B]} as numpy."""
  stats, count = acc if acc is not None else (np.zeros(bleu.NUM_STATS), 0)
  for tokens, index, real in zip(outputs["tokens"], outputs["index"], outputs["mask"]):
    if real:
      hypothesis = encoder.decode_until_eos([int(t) for t in tokens])
      stats = stats + bleu.sentence_stats(hypothesis, references[int(index)])
      count += 1
  return stats, count


def finalize(acc, metric_name):
  stats, count = acc
  return {metric_name: bleu.bleu_from_stats(stats), "count": count}


class BleuEvaluator:
  """The Transformer's Evaluator (harness.workload): each batch's translations decoded on the
  host and scored against their references (read at the first batch, after run_start)."""
  on_host = True

  def __init__(self, cfg, data_dir, metric_name, pipeline):
    """`pipeline()`: the workload's input pipeline, which reads the eval sentences (tf.data:
    it loads with the framework, at the first batch)."""
    self.cfg, self.data_dir, self.metric_name = cfg, data_dir, metric_name
    self._pipeline, self._eval_text = pipeline, None

  def accumulate(self, acc, outputs):
    if self._eval_text is None:
      self._eval_text = self._pipeline().eval_text(self.cfg, self.data_dir)
    return accumulate(acc, outputs, *self._eval_text)

  def finalize(self, acc):
    return finalize(acc, self.metric_name)
