"""DLRM's exact ROC AUC computed on the device (JAX: jax_auc.py; TF: tf_auc.py): the scores
sorted there, the tie groups counted in integers. Equal to scikit-learn's roc_auc_score (ties
counted half) on sets with many ties, with padding masked out across batches; 0.5 where every
score is equal; 1 and 0 on sorted sets; and the JAX evaluator (what the trainer's eval runs)
over batches left on the devices. (bench/dlrm_auc.py times it against the host AUC.)"""
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from workloads.dlrm import auc, jax_auc, tf_auc

IMPLEMENTATIONS = {"jax": jax_auc.roc_auc, "tf": tf_auc.roc_auc}


def tied_batches(seed, n=6000, values=7, batches=3):
  """Scores rounded to `values` distinct values, labels, masks (a tenth of them padding) in
  `batches` batches."""
  rng = np.random.default_rng(seed)
  labels = (rng.random(n) < 0.3).astype(np.float32)
  scores = (np.round((rng.random(n) * 0.6 + labels * 0.3) * values) / values).astype(np.float32)
  masks = (rng.random(n) > 0.1).astype(np.float32)
  split = lambda x: np.array_split(x, batches)
  return split(scores), split(labels), split(masks)


@pytest.mark.parametrize("framework", ["jax", "tf"])
@pytest.mark.parametrize("seed,values", [(0, 3), (1, 7), (2, 50), (3, 1000)])
def test_auc_with_many_ties_and_padding_equals_scikit_learn(framework, seed, values):
  scores, labels, masks = tied_batches(seed, values=values)
  keep = np.concatenate(masks) > 0
  want = roc_auc_score(np.concatenate(labels)[keep], np.concatenate(scores)[keep])
  got = IMPLEMENTATIONS[framework](scores, labels, masks)
  assert abs(got - want) < 1e-12, (got, want)
  assert abs(got - auc.roc_auc(np.concatenate(scores)[keep],
                               np.concatenate(labels)[keep])) < 1e-12


@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_all_equal_scores_give_one_half_and_sorted_sets_one_or_zero(framework):
  roc = IMPLEMENTATIONS[framework]
  labels = np.array([0, 1, 1, 0, 1, 0, 0, 1], np.float32)
  assert roc(np.full(8, 0.25, np.float32), labels) == 0.5
  ranked = np.arange(8, dtype=np.float32) / 8
  assert roc(ranked, np.repeat([0.0, 1.0], 4).astype(np.float32)) == 1.0
  assert roc(ranked, np.repeat([1.0, 0.0], 4).astype(np.float32)) == 0.0
  # sorted with ties across the class boundary: sklearn's value
  scores = np.array([0.1, 0.2, 0.2, 0.3, 0.3, 0.3, 0.4], np.float32)
  labels = np.array([0, 0, 1, 0, 1, 1, 1], np.float32)
  assert abs(roc(scores, labels) - roc_auc_score(labels, scores)) < 1e-12
  with pytest.raises(ValueError, match="both classes"):
    roc(ranked, np.zeros(8, np.float32))


@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_negative_scores_signed_zeros_and_float64_scores(framework, jax_float64):
  """Scores of either sign (the JAX sort key is the float's order-preserving bits: -0 and +0
  one value) and float64 scores (a float64 model's)."""
  del jax_float64
  roc = IMPLEMENTATIONS[framework]
  scores = np.array([-1.5, -0.0, 0.0, 0.0, 1e-30, -1e-30, 2.0, -3.0, 2.0, 0.5], np.float32)
  labels = np.array([1, 0, 1, 0, 1, 0, 1, 0, 0, 1], np.float32)
  assert abs(roc(scores, labels) - roc_auc_score(labels, scores)) < 1e-12
  rng = np.random.default_rng(5)
  scores = np.round(rng.normal(size=3000), 2) * (1 + 1e-12)       # ties only in float64
  labels = (rng.random(3000) < 0.4).astype(np.float32)
  assert abs(roc(scores, labels) - roc_auc_score(labels, scores)) < 1e-12


def test_the_jax_evaluator_keeps_batches_on_the_device():
  scores, labels, masks = tied_batches(4, values=20, batches=4)
  evaluator, acc = jax_auc.DeviceAucEvaluator("auc"), None
  assert not evaluator.on_host
  for s, l, m in zip(scores, labels, masks):
    acc = evaluator.accumulate(acc, {"score": jnp.asarray(s), "label": jnp.asarray(l),
                                     "mask": jnp.asarray(m)})
  result = evaluator.finalize(acc)
  keep = np.concatenate(masks) > 0
  assert result["count"] == int(keep.sum())
  want = roc_auc_score(np.concatenate(labels)[keep], np.concatenate(scores)[keep])
  assert abs(result["auc"] - want) < 1e-12
