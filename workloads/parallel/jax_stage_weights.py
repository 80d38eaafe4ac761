"""Pipeline stages that own their weights (GPipe's point: a model larger than one device).

With `--mesh stage=K`, each parameter that one stage alone reads (its layers', by the
workload's `pipeline_layers` regexes and the stage cut) lives in that stage's row of one
[K, N] array split over `stage`: a device holds its own stage's weights and their optimizer
state, about 1/K of the model. What several stages read (the Transformer's shared embedding:
the source lookup in the first stage, the target lookup and the logits in later ones) stays a
parameter of its own, whole on every device, its gradient summed over the stages that read it.

The state keeps the parameter tree's shape for everything shared and puts the rows under
ROWS; a stage's row is its parameters flattened in path order and zero-padded to the longest
stage's. Inside the pipeline's shard_map a device unpacks its row into its stage's parameter
tree (`stage_params`), so the model code is the one without stages, and the gradient of its
row is its stage's gradient alone: the row's gradient is summed over `data` only.

The optimizer runs per stage, on the stage's own parameter tree (`optimizer`): inside a
shard_map over `stage`, each device unpacks its rows of gradients, optimizer state and
parameters and applies the workload's optax transformation to that tree, so LARS's per-layer
trust ratios and exclusions, LAMB's and Adam's per-parameter state are exactly those of a run
without stages (an optimizer with a global statistic, such as clipping by the global norm,
would need it summed over stages: none of the pipelined workloads' recipes has one). The
optimizer state of a stage is kept as one row too (its leaves flattened in tree order, in the
parameters' dtype: an integer step count stays exact below 2^24 steps in float32).

Not beside a `model` axis or under weight-update sharding (jax_trainer_base.init: there the
weights stay whole over stage). Eval reads the whole tree (`full`): each eval batch's program
gathers the rows over `stage` (beam search through stages would send every decode step's cache
over the pipeline).
"""
import math
import re

import jax
import jax.numpy as jnp
import optax
from flax import traverse_util
from jax.sharding import PartitionSpec as P

from harness.pipeline import stage_ranges
from workloads.parallel.jax_pipeline import STAGE

ROWS = "__stages__"          # the key of the [K, N] array of the stages' own parameters


def _flat(tree):
  return traverse_util.flatten_dict(tree, sep="/")


def _nested(flat):
  return traverse_util.unflatten_dict(flat, sep="/")


class RowLayout:
  """Leaves of fixed shapes and dtypes packed into one row (flattened, cast, zero-padded)."""

  def __init__(self, shapes, dtype):
    """`shapes`: [(shape, dtype)] in packing order."""
    self.shapes, self.dtype = list(shapes), dtype
    self.size = sum(math.prod(s) for s, _ in self.shapes)

  def pack(self, leaves, width):
    parts = [jnp.ravel(x).astype(self.dtype) for x in leaves]
    parts.append(jnp.zeros((width - self.size,), self.dtype))
    return jnp.concatenate(parts)

  def unpack(self, row):
    out, offset = [], 0
    for shape, dtype in self.shapes:
      n = math.prod(shape)
      out.append(row[offset:offset + n].reshape(shape).astype(dtype))
      offset += n
    return out


class StageWeights:
  """Which stage owns which parameter, and the packing of rows (see the module doc)."""

  def __init__(self, params, layers, cut):
    """`params`: the parameter tree (arrays or shapes); `layers`: the workload's
    pipeline_layers [(name, regex of its parameter paths)]; `cut`: layers per stage."""
    flat = _flat(params)
    ranges = stage_ranges(cut)
    self.stages = len(ranges)
    patterns = [[re.compile(regex) for _, regex in layers[s:e]] for s, e in ranges]
    self.owned = [[] for _ in ranges]
    self.shared = []
    for path in sorted(flat):
      owners = [k for k, stage in enumerate(patterns) if any(p.fullmatch(path) for p in stage)]
      (self.owned[owners[0]] if len(owners) == 1 else self.shared).append(path)
    dtypes = {flat[p].dtype for paths in self.owned for p in paths}
    if len(dtypes) > 1:
      raise ValueError(f"stage-owned parameters of several dtypes {sorted(map(str, dtypes))}; "
                       "allowed: one")
    self.dtype = dtypes.pop() if dtypes else jnp.dtype(jnp.float32)
    self.layouts = [RowLayout([(flat[p].shape, flat[p].dtype) for p in paths], self.dtype)
                    for paths in self.owned]
    self.width = max([layout.size for layout in self.layouts] + [1])
    self.count = sum(math.prod(leaf.shape) for leaf in flat.values())
    self._optimizer = None

  # ------------------------------------------------------------------ parameters
  def store(self, params):
    """The parameter tree -> its stored form: shared leaves in place, ROWS [K, N]."""
    flat = _flat(params)
    rows = [layout.pack([flat[p] for p in paths], self.width)
            for layout, paths in zip(self.layouts, self.owned)]
    return _nested({**{p: flat[p] for p in self.shared}, ROWS: jnp.stack(rows)})

  def own(self, row, k):
    """Stage k's row [N] -> the tree of its own parameters."""
    return _nested(dict(zip(self.owned[k], self.layouts[k].unpack(row))))

  def shared_tree(self, stored):
    flat = _flat(stored)
    return _nested({p: flat[p] for p in self.shared})

  def stage_params(self, stored, k):
    """Inside the pipeline (stored[ROWS] is this device's [1, N]): the parameter tree stage k
    reads, its own parameters and the shared ones."""
    flat = _flat(stored)
    return _nested({**{p: flat[p] for p in self.shared}, **_flat(self.own(flat[ROWS][0], k))})

  def full(self, stored):
    """The whole parameter tree (on a mesh, the rows gathered over `stage`)."""
    flat = _flat(stored)
    out = {p: flat[p] for p in self.shared}
    for k in range(self.stages):
      out.update(zip(self.owned[k], self.layouts[k].unpack(flat[ROWS][k])))
    return _nested(out)

  def specs(self, stored):
    """shard_map specs of the stored form: ROWS split over `stage`, the rest whole."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: P(STAGE) if _is_rows(path) else P(), stored)

  def sum_gradients(self, grads, every, data):
    """Inside the pipeline: a row's gradient is its stage's own (summed over `data`), a
    shared parameter's is summed over every stage that read it and over `data`."""
    return jax.tree_util.tree_map_with_path(
        lambda path, g: jax.lax.psum(g, data if _is_rows(path) else every), grads)

  # ------------------------------------------------------------------ optimizer
  def _state_rows(self, tx):
    """Per stage, (treedef, RowLayout) of tx.init's state of its own parameters."""
    rows = []
    for k in range(self.stages):
      shapes = jax.eval_shape(lambda k=k: tx.init(self.own(jnp.zeros((self.width,), self.dtype),
                                                           k)))
      leaves, treedef = jax.tree.flatten(shapes)
      rows.append((treedef, RowLayout([(x.shape, x.dtype) for x in leaves], self.dtype)))
    return rows

  def optimizer(self, tx, mesh, before=None) -> optax.GradientTransformation:
    """`tx` (the workload's optax transformation) on the stored form, per stage (above); the
    same object for the same `tx` and `before` (a train state's static field: jit compares it).
    `before(grads)`: a step on the whole stored gradient first, for what reads every stage's
    gradient (LAMB's global-norm clip: the rows' zero padding adds nothing to a norm)."""
    if self._optimizer is not None and self._optimizer[0] == (tx, before):
      return self._optimizer[1]
    layouts = self._state_rows(tx)
    width = max([layout.size for _, layout in layouts] + [1])

    def init(stored):
      flat = _flat(stored)
      rows = [layout.pack(jax.tree.leaves(tx.init(self.own(flat[ROWS][k], k))), width)
              for k, (_, layout) in enumerate(layouts)]
      return {ROWS: jnp.stack(rows), "shared": tx.init(self.shared_tree(stored))}

    def stage_update(k):
      treedef, layout = layouts[k]

      def update(g, s, p):
        state = jax.tree.unflatten(treedef, layout.unpack(s[0]))
        updates, state = tx.update(self.own(g[0], k), state, self.own(p[0], k))
        flat = _flat(updates)
        return (self.layouts[k].pack([flat[path] for path in self.owned[k]], self.width)[None],
                layout.pack(jax.tree.leaves(state), width)[None])
      return update

    def per_stage(g, s, p):
      return jax.lax.switch(jax.lax.axis_index(STAGE),
                            [stage_update(k) for k in range(self.stages)], g, s, p)

    def update(grads, state, params):
      if before is not None:
        grads = before(grads)
      g, p = _flat(grads), _flat(params)
      shared_updates, shared_state = tx.update(self.shared_tree(grads), state["shared"],
                                               self.shared_tree(params))
      rows, state_rows = jax.shard_map(
          per_stage, mesh=mesh, in_specs=(P(STAGE),) * 3, out_specs=(P(STAGE),) * 2,
          axis_names={STAGE}, check_vma=False)(g[ROWS], state[ROWS], p[ROWS])
      updates = _nested({**_flat(shared_updates), ROWS: rows})
      return updates, {ROWS: state_rows, "shared": shared_state}

    self._optimizer = ((tx, before), optax.GradientTransformation(init, update))
    return self._optimizer[1]


def _is_rows(path):
  return any(getattr(k, "key", None) == ROWS for k in path)
