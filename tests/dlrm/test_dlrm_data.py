"""DLRM's framework-neutral parts: the reference's multi-hot day files read back (written here
in the reference's layout with numpy, not by the loader's own writer), the embedding rows'
placement on the model axis, and the eval's AUC against scikit-learn's."""
import os

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from harness.workload import RunContext
from workloads.dlrm import auc, embedding_plan, input_pipeline, spec

ROWS, HOT = (40, 12, 6, 3), (2, 1, 3, 1)


def write_days(folder, sizes, seed=0):
  """Days in the reference's files: dense float32 [N, 13], labels int32 [N, 1], an
  uncompressed npz with member '<f>.npy' per feature, int32 [N, hot]."""
  rng = np.random.default_rng(seed)
  days = []
  for d, n in enumerate(sizes):
    day = {"dense": rng.random((n, 13), np.float32),
           "labels": rng.integers(0, 2, (n, 1), dtype=np.int32),
           "sparse": [rng.integers(0, r, (n, h), dtype=np.int32) for r, h in zip(ROWS, HOT)]}
    np.save(os.path.join(folder, f"day_{d}_dense.npy"), day["dense"])
    np.save(os.path.join(folder, f"day_{d}_labels.npy"), day["labels"])
    np.savez(os.path.join(folder, f"day_{d}_sparse_multi_hot.npz"),
             **{str(f): ids for f, ids in enumerate(day["sparse"])})
    days.append(day)
  return days


def flat(days, what):
  if what == "sparse":
    return np.concatenate([np.concatenate(d["sparse"], axis=1) for d in days])
  return np.concatenate([d[what] for d in days])


@pytest.fixture
def cfg():
  cfg = spec.SPEC.configure("tiny")
  cfg.data.source = "criteo"
  cfg.data.train_days = 2
  return cfg


def test_train_batches_are_consecutive_rows_across_days_each_host_its_slice(tmp_path, cfg):
  days = write_days(tmp_path, [50, 30, 44])          # two train days, then the eval day
  for process in range(2):
    ds = input_pipeline.train_dataset(cfg, 16, 0, str(tmp_path), process, 2)
    batches = list(ds.take(6).as_numpy_iterator())   # 80 rows: 5 global batches, then again
    train = days[:2]
    for b, batch in enumerate(batches):
      rows = slice((b % 5) * 16 + process * 8, (b % 5) * 16 + process * 8 + 8)
      np.testing.assert_array_equal(batch["dense"], flat(train, "dense")[rows])
      np.testing.assert_array_equal(batch["sparse"], flat(train, "sparse")[rows])
      np.testing.assert_array_equal(batch["label"], flat(train, "labels")[rows, 0])


def test_eval_is_the_first_half_of_the_eval_day_each_row_once_padding_masked(tmp_path, cfg):
  days = write_days(tmp_path, [20, 20, 45])
  cfg.data.eval_examples = 23                          # ceil(45 / 2): the whole first half
  seen = {"dense": [], "label": []}
  counts = []
  for process in range(2):
    batches = list(input_pipeline.eval_dataset(cfg, 10, str(tmp_path), process, 2)
                   .as_numpy_iterator())
    counts.append(len(batches))
    for batch in batches:
      keep = batch["mask"] > 0
      seen["dense"].append(batch["dense"][keep])
      seen["label"].append(batch["label"][keep])
      assert not batch["dense"][~keep].any() and not batch["sparse"][~keep].any()
  assert counts == [3, 3]                              # every host the same number of batches
  got = np.concatenate(seen["dense"])
  want = days[2]["dense"][:23]
  assert len(got) == 23
  np.testing.assert_array_equal(got[np.lexsort(got.T)], want[np.lexsort(want.T)])


def test_npz_members_are_memory_mapped_and_compressed_files_refused(tmp_path):
  ids = np.arange(24, dtype=np.int32).reshape(8, 3)
  path = tmp_path / "x.npz"
  np.savez(path, **{"0": ids, "1": ids * 2})
  member = input_pipeline.npz_member(str(path), "1.npy")
  assert isinstance(member, np.memmap)
  np.testing.assert_array_equal(member, np.load(path)["1"])
  np.savez_compressed(tmp_path / "z.npz", **{"0": ids})
  with pytest.raises(ValueError, match="compressed"):
    input_pipeline.npz_member(str(tmp_path / "z.npz"), "0.npy")


def test_missing_days_are_named_before_any_framework(tmp_path, cfg):
  write_days(tmp_path, [10, 10])
  assert spec.missing_data(cfg, str(tmp_path)) == [
      "day_2_dense.npy", "day_2_labels.npy", "day_2_sparse_multi_hot.npz"]


def test_the_mini_set_is_written_in_the_reference_files_with_a_planted_signal(tmp_path):
  cfg = spec.SPEC.configure("tiny")
  folder = input_pipeline.prepare_mini(cfg, cache_root=str(tmp_path))
  day = input_pipeline.Day(folder, 0, cfg.model.num_features)
  assert day.dense.dtype == np.float32 and day.labels.shape == (day.rows, 1)
  assert [s.shape[1] for s in day.sparse] == list(cfg.model.multi_hot_sizes)
  assert all(int(s.max()) < r for s, r in zip(day.sparse, cfg.model.num_embeddings_per_feature))
  ctx = RunContext(seed=0, preset="tiny")
  assert input_pipeline.data_source(cfg, ctx)[1] == cfg.data.train_examples


# ----------------------------------------------------------------------------- placement

@pytest.mark.parametrize("model", [1, 2, 3, 4])
def test_every_id_finds_its_own_row_in_the_slab(model):
  rng = np.random.default_rng(model)
  tables = [rng.normal(size=(r, 5)) for r in ROWS]
  plan = embedding_plan.make_plan(ROWS, model, row_wise_min_rows=12)
  slab = plan.to_slab(tables)
  assert slab.shape == (model * plan.rows_per_shard, 5)
  for a, b in zip(plan.from_slab(slab), tables):
    np.testing.assert_array_equal(a, b)
  ids = np.concatenate([rng.integers(0, r, (7, h)) for r, h in zip(ROWS, HOT)], axis=1)
  rows = embedding_plan.lookup_rows(ids, plan.column_constants(HOT))
  feature = np.repeat(np.arange(len(ROWS)), HOT)
  want = np.stack([tables[f][ids[:, c]] for c, f in enumerate(feature)], axis=1)
  np.testing.assert_array_equal(slab[rows], want)
  # a row-wise table has rows on every peer, a table-wise one on exactly one
  peers = lambda f: {int(r) // plan.rows_per_shard
                     for r in embedding_plan.lookup_rows(
                         np.tile(np.arange(ROWS[f])[:, None], (1, sum(HOT))),
                         plan.column_constants(HOT))[:, sum(HOT[:f])]}
  for f, table in enumerate(plan.tables):
    assert len(peers(f)) == (model if table.kind == embedding_plan.ROW_WISE else 1)


def test_large_tables_split_row_wise_small_ones_stay_whole_balanced():
  plan = embedding_plan.make_plan((1000, 900, 50, 40, 30, 3), 2, row_wise_min_rows=900)
  assert [t.kind for t in plan.tables] == ["row-wise"] * 2 + ["table-wise"] * 4
  peer_rows = [950, 950]
  for t in plan.tables[2:]:
    peer_rows[t.first_shard] += t.rows
  # largest first on the lighter peer: 50 -> 0, 40 -> 1, 30 -> 1 (990 < 1000), 3 -> 0
  assert peer_rows == [950 + 50 + 3, 950 + 40 + 30]
  assert plan.rows_per_shard == 1020
  assert plan.slab_rows - plan.real_rows == 2 * 1020 - 2023
  one = embedding_plan.make_plan((1000, 900, 50, 40, 30, 3), 1, row_wise_min_rows=900)
  assert one.slab_rows == one.real_rows == 2023              # one peer: the tables in order


def test_reference_parameter_count_is_the_published_one():
  # the reference's tables and layers (TorchRec DLRM_DCN), computed by hand: 204,184,588 rows
  # of 128, the bottom MLP, 3 cross layers on 27 x 128 = 3456 wide with rank 512, the top MLP
  cfg = spec.reference()
  assert sum(cfg.model.num_embeddings_per_feature) == 204_184_588
  dense = (13 * 512 + 512 + 512 * 256 + 256 + 256 * 128 + 128
           + 3 * (3456 * 512 * 2 + 3456)
           + 3456 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 512 + 512 + 512 * 256 + 256
           + 256 + 1)
  assert spec.parameter_count(cfg) == 204_184_588 * 128 + dense


# ----------------------------------------------------------------------------- AUC

def test_auc_equals_scikit_learn_with_ties_and_masked_padding_across_batches():
  rng = np.random.default_rng(3)
  scores = np.round(rng.random(5000), 2)              # many ties
  labels = (rng.random(5000) < 0.3 + 0.4 * scores).astype(np.float32)
  want = roc_auc_score(labels, scores)
  assert abs(auc.roc_auc(scores, labels) - want) < 1e-9
  evaluator, acc = auc.AucEvaluator(None, None, "auc", None), None
  for start in range(0, 5000, 1024):                  # padded batches, as an eval feeds them
    part = slice(start, start + 1024)
    n = len(scores[part])
    pad = 1024 - n
    acc = evaluator.accumulate(acc, {
        "score": np.concatenate([scores[part], rng.random(pad)]),
        "label": np.concatenate([labels[part], np.ones(pad)]),
        "mask": np.concatenate([np.ones(n), np.zeros(pad)])})
  result = evaluator.finalize(acc)
  assert result["count"] == 5000 and abs(result["auc"] - want) < 1e-9


@pytest.mark.parametrize("model", [1, 3])
def test_the_slab_initialiser_bounds_every_row_by_its_table(model):
  """The JAX initialiser's per-row bound (expanded on the device from the blocks) is
  row_bounds: sqrt(1 / rows) of each row's table, 0 on padding."""
  import jax
  from workloads.dlrm import jax_model
  plan = embedding_plan.make_plan(ROWS, model, row_wise_min_rows=12)
  emb = jax_model.Embedding(plan, HOT, 4)
  ids = np.zeros((1, sum(HOT)), np.int32)
  slab = np.asarray(emb.init(jax.random.key(0), ids)["params"]["slab"])
  bound = plan.row_bounds()
  assert np.all(np.abs(slab) <= bound[:, None] + 1e-7)
  assert np.all((slab == 0).all(axis=1) == (bound == 0))
  assert np.all(np.abs(slab).max(axis=1)[bound > 0] > 0.2 * bound[bound > 0])
