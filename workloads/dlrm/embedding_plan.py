"""Where DLRM's embedding rows live on the `model` axis, framework-neutral (numpy only).

TorchRec's planner shards each table one of a few ways; the two that split a table's memory
are used here:
  row-wise    a large table's rows cut into `model` equal blocks, block m on peer m;
  table-wise  a table kept whole on one peer (a table too small to split: fewer rows than
              `row_wise_min_rows`), tables balanced over the peers by rows, largest first.
As FBGEMM's table-batched embeddings put one rank's tables in one buffer, every peer's rows
live in one slab: the model's single embedding parameter has `model` x `rows_per_shard` rows,
split over `model` (logical axes ('vocab', 'embed')), peer m holding rows
[m R, (m + 1) R). A feature's id maps to its slab row by one formula for both kinds,

    slab row = (first_shard + id // per_shard) * R + offset + id % per_shard,

(table-wise: first_shard its peer, per_shard its row count; row-wise: first_shard 0,
per_shard ceil(rows / model)). The lookup is then the vocabulary-parallel embedding of the
Transformer: each peer gathers the rows it holds, zeros elsewhere, and the sum over `model`
is the whole lookup (GSPMD emits it in JAX, tf_model_parallel.vocab_parallel_lookup in TF).
Padding rows (a row-wise table's last block, a peer's unused tail) are never looked up and keep
zero gradients. On one peer the slab is the tables in feature order.
"""
import dataclasses
import math

import numpy as np

ROW_WISE, TABLE_WISE = "row-wise", "table-wise"


@dataclasses.dataclass(frozen=True)
class Table:
  rows: int
  kind: str               # ROW_WISE | TABLE_WISE
  first_shard: int
  per_shard: int          # rows of this table on each peer that holds it
  offset: int             # where its rows start inside each such peer's block


@dataclasses.dataclass(frozen=True)
class Plan:
  tables: tuple[Table, ...]
  model: int
  rows_per_shard: int     # R: every peer's block of the slab

  @property
  def slab_rows(self) -> int:
    return self.model * self.rows_per_shard

  @property
  def real_rows(self) -> int:
    return sum(t.rows for t in self.tables)

  def kinds(self) -> dict[str, int]:
    return {kind: sum(t.kind == kind for t in self.tables) for kind in (ROW_WISE, TABLE_WISE)}

  def column_constants(self, multi_hot_sizes) -> dict[str, np.ndarray]:
    """Per id column of the batch's 'sparse' feature (the features' ids side by side, each
    `multi_hot_sizes[f]` wide): its table's first_shard, per_shard and offset, and its
    feature index (and R)."""
    feature = np.repeat(np.arange(len(self.tables)), multi_hot_sizes)
    pick = lambda field: np.array([getattr(self.tables[f], field) for f in feature], np.int32)
    return {"first_shard": pick("first_shard"), "per_shard": pick("per_shard"),
            "offset": pick("offset"), "feature": feature.astype(np.int32),
            "rows_per_shard": np.int32(self.rows_per_shard)}

  def row_bounds(self) -> np.ndarray:
    """Per slab row, sqrt(1 / its table's rows) (TorchRec's uniform init bound), 0 for
    padding: the initialisers draw uniform(-1, 1) x this."""
    bound = np.zeros(self.slab_rows, np.float64)
    for t in self.tables:
      for rows, start in self._blocks(t):
        bound[start:start + rows] = math.sqrt(1.0 / t.rows)
    return bound

  def block_bounds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, bound) of every table block of the slab, by start: row_bounds in a form
    an initialiser can expand on the device (the reference's slab has 204M rows)."""
    blocks = sorted((start, start + rows, math.sqrt(1.0 / t.rows))
                    for t in self.tables for rows, start in self._blocks(t))
    return tuple(np.array(column) for column in zip(*blocks))

  def _blocks(self, t: Table):
    """(rows, slab start) of each block of table t."""
    if t.kind == TABLE_WISE:
      return [(t.rows, t.first_shard * self.rows_per_shard + t.offset)]
    return [(min(t.per_shard, t.rows - m * t.per_shard), m * self.rows_per_shard + t.offset)
            for m in range(self.model) if m * t.per_shard < t.rows]

  def to_slab(self, tables: list) -> np.ndarray:
    """[rows_f, dim] per table -> the slab [model * R, dim] (padding zero)."""
    dim = np.asarray(tables[0]).shape[1]
    slab = np.zeros((self.slab_rows, dim), np.asarray(tables[0]).dtype)
    for t, value in zip(self.tables, tables):
      done = 0
      for rows, start in self._blocks(t):
        slab[start:start + rows] = np.asarray(value)[done:done + rows]
        done += rows
    return slab

  def from_slab(self, slab) -> list:
    """The slab -> [rows_f, dim] per table (padding dropped)."""
    slab = np.asarray(slab)
    return [np.concatenate([slab[start:start + rows] for rows, start in self._blocks(t)])
            for t in self.tables]


def make_plan(rows: tuple[int, ...], model: int, row_wise_min_rows: int) -> Plan:
  """Tables of at least `row_wise_min_rows` rows row-wise over `model` peers (when there is
  more than one), the rest table-wise on the least-loaded peer, largest first (ties: the
  lower peer, then feature order: the same plan on every host)."""
  row_wise = [model > 1 and r >= row_wise_min_rows for r in rows]
  used = [0] * model
  placed = {}
  for f, r in enumerate(rows):
    if row_wise[f]:
      per = math.ceil(r / model)
      placed[f] = Table(r, ROW_WISE, 0, per, used[0])
      used = [u + per for u in used]          # every peer's block grows by the same rows
  for f in sorted((f for f in range(len(rows)) if not row_wise[f]), key=lambda f: (-rows[f], f)):
    m = min(range(model), key=lambda m: (used[m], m))
    placed[f] = Table(rows[f], TABLE_WISE, m, rows[f], used[m])
    used[m] += rows[f]
  return Plan(tuple(placed[f] for f in range(len(rows))), model, max(used))


def lookup_rows(ids, constants, ops=np):
  """Slab rows of the batch's ids [batch, columns] (the formula above); `ops` is numpy,
  jax.numpy or tf.experimental.numpy."""
  per = constants["per_shard"]
  return (constants["first_shard"] + ids // per) * constants["rows_per_shard"] + \
      constants["offset"] + ids % per
