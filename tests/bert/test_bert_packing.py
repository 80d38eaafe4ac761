"""Packed BERT rows (workloads/bert/packing.py): the model and the loss on packed rows equal the
unpacked samples' in float64 (loss and every gradient), the packer keeps every sample once and
never overfills a row, and the driver counts the samples a packed step trains."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from workloads.bert import jax_model, packing, spec

SEQ, PREDS, SLOTS = 32, 5, 3


def examples(n, seed=0, vocab=64):
  """Unpacked reference examples (the TFRecord features) of random lengths 6..20."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    length = int(rng.integers(6, 21))
    k = int(rng.integers(1, PREDS + 1))
    ids = np.zeros(SEQ, np.int32)
    ids[:length] = rng.integers(5, vocab, length)
    segment = np.zeros(SEQ, np.int32)
    segment[length // 2:length] = 1
    positions = np.zeros(PREDS, np.int32)
    positions[:k] = np.sort(rng.choice(np.arange(1, length), k, replace=False))
    weights = np.zeros(PREDS, np.float32)
    weights[:k] = 1.0
    masked_ids = np.zeros(PREDS, np.int32)
    masked_ids[:k] = rng.integers(5, vocab, k)
    out.append({"input_ids": ids, "input_mask": (np.arange(SEQ) < length).astype(np.int32),
                "segment_ids": segment, "masked_lm_positions": positions,
                "masked_lm_ids": masked_ids, "masked_lm_weights": weights,
                "next_sentence_labels": np.int32(rng.integers(0, 2))})
  return out


def test_packer_keeps_every_sample_once_and_fits_each_row():
  samples = examples(40)
  packer = packing.Packer(iter(samples), SEQ, SLOTS, PREDS, window=16)
  batches = list(packer.batches(4))
  rows = {k: np.concatenate([b[k] for b in batches]) for k in packing.ROW_KEYS}
  assert len(batches) == 4 and rows["input_ids"].shape == (16, SEQ)   # the partial 5th dropped
  lengths = [int(s["input_mask"].sum()) for s in samples]
  assert (rows["input_mask"] > 0).sum(1).max() <= SEQ
  # every token of every packed sample is its source's, in order; none is split or repeated
  seen = []
  for row in range(16):
    for s in range(SLOTS):
      if rows["next_sentence_weights"][row, s]:
        start = rows["cls_positions"][row, s]
        n = int((rows["input_mask"][row] == s + 1).sum())
        assert (rows["positions"][row, start:start + n] == np.arange(n)).all()
        seen.append(tuple(rows["input_ids"][row, start:start + n]))
  sources = [tuple(s["input_ids"][:n]) for s, n in zip(samples, lengths)]
  assert len(seen) == len(set(seen)) and set(seen) <= set(sources)
  assert packing.samples_in(batches[0]) / 4 > 1.5            # rows of 32 take ~2 of 6..20


def test_packed_rows_equal_unpacked_samples_in_float64(jax_float64):
  cfg = spec.SPEC.configure("tiny")
  cfg.data.max_seq_length, cfg.data.max_predictions_per_seq = SEQ, PREDS
  cfg.model.max_position_embeddings = SEQ
  model = jax_model.build(cfg, jnp.float64)
  samples = examples(9, seed=1, vocab=cfg.model.vocab_size)
  unpacked = {k: np.stack([np.asarray(s[k]) for s in samples]) for k in samples[0]}
  packer = packing.Packer(iter(samples), SEQ, SLOTS, PREDS, window=16)
  packed_rows = []
  while packer.pool or not packed_rows:
    packed_rows.append(packer.next_row())
  rows = {k: np.stack([r[k] for r in packed_rows]) for k in packing.ROW_KEYS}
  assert packing.samples_in(rows) == 9 and len(packed_rows) < 9     # all nine, fewer rows
  params = model.init(jax.random.key(0), jnp.zeros((1, SEQ), jnp.int32),
                      jnp.zeros((1, SEQ), jnp.int32), jnp.zeros((1, SEQ), jnp.int32),
                      jnp.zeros((1, PREDS), jnp.int32))["params"]
  params = jax.tree.map(lambda p: p.astype(jnp.float64), params)

  def loss(p, batch):
    mlm, nsp = model.apply({"params": p}, batch["input_ids"], batch["input_mask"],
                           batch["segment_ids"], batch["masked_lm_positions"],
                           positions=batch.get("positions"),
                           cls_positions=batch.get("cls_positions"))
    return jax_model.pretraining_loss(mlm, nsp, batch)

  value_and_grad = jax.jit(jax.value_and_grad(loss))    # one program a layout, not op by op
  one, grads_one = value_and_grad(params, unpacked)
  packed, grads_packed = value_and_grad(params, rows)
  assert abs(float(one) - float(packed)) < 1e-12 * abs(float(one))
  for a, b in zip(jax.tree.leaves(grads_one), jax.tree.leaves(grads_packed)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-10, atol=1e-13)
  # the mask is what keeps samples apart: attending across a row changes the loss
  crossed = dict(rows, input_mask=(rows["input_mask"] > 0).astype(np.int32))
  assert abs(float(jax.jit(loss)(params, crossed)) - float(one)) > 1e-6


def test_packed_layout_and_refusals():
  cfg = spec.SPEC.configure("reference", ["data.packing=true"])
  layout = spec.batch_layout(cfg, 64)
  assert layout["input_ids"][0] == (32, 512)                   # 64 samples / 2.0 a row
  assert layout["masked_lm_positions"][0] == (32, 79)          # 76 + 3: Graphcore's 79
  assert layout["cls_positions"][0] == (32, 3)
  assert spec.batch_layout(cfg, 64, with_mask=True)["input_ids"][0] == (64, 512)  # eval unpacked
  from harness.errors import UsageError
  with pytest.raises(UsageError, match=r"data.packing_factor=4.0 is out of range"):
    spec.SPEC.configure("reference", ["data.packing=true", "data.packing_factor=4"])


def test_synthetic_packed_run_counts_the_samples_its_rows_hold(cli, tmp_path):
  """The JAX trainer counts each packed step's samples on the host; the row's samples and
  samples/s are those, not steps x the global batch (TF refuses packing before it starts)."""
  import pandas as pd
  from workloads.bert import input_pipeline
  sets = ["--set", "data.source=synthetic", "--set", "data.packing=true",
          "--set", "train.global_batch_size=8"]
  proc = cli("run", "bert", "--framework", "jax", "--preset", "tiny", "--steps", "3",
             "--seed", "0", *sets, "--results", str(tmp_path / "r.csv"),
             "--log-dir", str(tmp_path / "logs"), few_steps=True)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
  cfg = spec.SPEC.configure("tiny", [s for s in sets if s != "--set"])
  per_step = packing.samples_in(input_pipeline.synthetic_batch(cfg, 8, 1))   # seed + 1
  row = pd.read_csv(tmp_path / "r.csv").iloc[-1]
  assert row["status"] == "success" and per_step != 8                # 4 rows, not 8 samples
  assert row["samples_completed"] == 5 * per_step                    # 2 untimed + 3 timed
  refused = cli("run", "bert", "--framework", "tf", "--preset", "tiny", *sets)
  assert refused.returncode == 2 and "data.packing=true in TF" in refused.stderr


def test_packed_batches_from_the_mini_tfrecords():
  """The reader's examples (the reference TFRecord format) packed in tf.data: the layout's
  shapes, a [CLS] at each sample's start, its predictions inside its own span."""
  from workloads.bert import input_pipeline
  cfg = spec.SPEC.configure("mini", ["data.packing=true"])
  folder = input_pipeline.prepare_mini(cfg.data, cfg.model.vocab_size)["dir"]
  ds = input_pipeline.train_dataset(cfg, cfg.train.global_batch_size, 0, folder)
  layout = spec.packed_layout(cfg, cfg.train.global_batch_size)
  for batch in ds.take(2).as_numpy_iterator():
    assert {k: (v.shape, str(v.dtype)) for k, v in batch.items()} == {
        k: (shape, dtype) for k, (shape, dtype, _) in layout.items()}
    for row in range(batch["input_ids"].shape[0]):
      ids, owner = batch["input_ids"][row], batch["input_mask"][row]
      for s in np.flatnonzero(batch["next_sentence_weights"][row]):
        start = batch["cls_positions"][row, s]
        assert ids[start] == input_pipeline.CLS and owner[start] == s + 1
      real = batch["masked_lm_weights"][row] > 0
      picked = batch["masked_lm_positions"][row][real]
      assert (owner[picked] > 0).all() and ids[picked].all()
    # the mini corpus's samples nearly fill their 32 tokens (create_pretraining_data's 10%
    # short ones aside): about one a row, each row at least one
    assert packing.samples_in(batch) >= batch["input_ids"].shape[0]
