"""One Keras<->flax path convention for the five TF models (tf_layers.variables_by_path): each
TF model's variables are the JAX model's, path for path (flax's flattened keys) and size for
size, so every TF parameter has its logical axes in the workload's PARAM_AXES table; and on a
model or expert axis, each weight TF splits holds, shard for shard, the elements that the
table's layout gives that shard in JAX, and every weight the table splits is split in TF."""
import jax
import numpy as np
import pytest
from flax import traverse_util

from harness import mesh as mesh_lib
from harness import registry
from harness.workload import RunContext
from workloads.common.moe import MoEConfig
from workloads.parallel import tf_layers
from workloads.parallel import tf_model_parallel as mp


def _trainer(name, framework, overrides=(), mesh=None, moe=None):
  spec = registry.get(name)
  cfg = spec.configure("tiny", list(overrides))
  if mesh:
    cfg.parallel.mesh = mesh
  if moe:
    cfg.model.moe = moe
  return spec, cfg, spec.make_trainer(framework, cfg, RunContext(seed=0, preset="tiny"))


def _flax_shapes(trainer):
  """{flattened flax variable path: shape} of the JAX trainer's state, from shapes only."""
  state = jax.eval_shape(trainer.create_state, jax.random.key(0))
  variables = {"params": state.params}
  if getattr(state, "batch_stats", None):
    variables["batch_stats"] = state.batch_stats
  return {path: tuple(leaf.shape)
          for path, leaf in traverse_util.flatten_dict(dict(variables)).items()}


@pytest.mark.parametrize("name", registry.names())
def test_tf_variables_are_the_flax_variables_with_logical_axes(name):
  spec, cfg, tf_trainer = _trainer(name, "tf")
  _, _, jax_trainer = _trainer(name, "jax")
  flax = _flax_shapes(jax_trainer)
  tf_trainer.build()
  ours = tf_layers.variables_by_path(tf_trainer.model)
  assert set(ours) == set(flax)
  for path, var in ours.items():
    assert np.prod(var.shape) == np.prod(flax[path]), path       # a reshape at most
    if path[0] == "params":
      mesh_lib.param_axes(spec.param_axes, "/".join(path[1:]), len(flax[path]))
  assert len(tf_trainer.model.weights) == len(flax)
  assert sum(np.prod(s) for p, s in flax.items() if p[0] == "params") == sum(
      np.prod(v.shape) for v in tf_trainer.model.trainable_weights)


def _shards(shape, dim, parts):
  """The flat element indices of each of `parts` shards of an array split along `dim`."""
  index = np.arange(int(np.prod(shape))).reshape(shape)
  return [sorted(piece.ravel()) for piece in np.split(index, parts, axis=dim)]


MOE = MoEConfig(num_experts=4, every=1, group_size=4)
SPLIT = {
    "bert model=2": ("bert", "data=2,model=2", (), None),
    "bert model=4": ("bert", "data=2,model=4", (), None),
    "transformer model=2": ("transformer", "data=2,model=2", ("model.vocab_size=48", "data.source=synthetic"), None),
    "transformer expert=4": ("transformer", "data=2,expert=4", ("model.vocab_size=48", "data.source=synthetic"), MOE),
}


@pytest.mark.parametrize("case", SPLIT)
def test_tf_split_weights_follow_the_param_axes_layout(case):
  name, mesh, overrides, moe = SPLIT[case]
  spec, _, tf_trainer = _trainer(name, "tf", overrides, mesh, moe)
  _, _, jax_trainer = _trainer(name, "jax", overrides, None, moe)
  flax = _flax_shapes(jax_trainer)
  tf_trainer.build()
  shape = tf_trainer.runtime.shape
  split_in_tf = {}
  for path, var in tf_layers.params_by_path(tf_trainer.model).items():
    flax_shape = flax[("params",) + path]
    axes = mesh_lib.param_axes(spec.param_axes, "/".join(path), len(flax_shape))
    layout = mesh_lib.logical_to_mesh(axes, shape, shape=flax_shape)
    split = [(d, axis) for d, axis in enumerate(layout) if axis is not None]
    if isinstance(var, mp.ShardedWeight):
      split_in_tf[path] = var.axis
      assert split == [(split[0][0], var.axis)], (path, layout)
      assert _shards(var.full_shape, var.dim, var.parts) == _shards(
          flax_shape, split[0][0], var.parts), path
    else:
      # whole in TF: the table splits it over no axis TF has (data shards nothing here)
      assert all(axis not in ("model", "expert") for _, axis in split), (path, layout)
  assert split_in_tf and set(split_in_tf.values()) == (
      {"expert"} if moe else {"model"})
