"""Named mesh axes (harness/mesh.py): parsing, the one fit check, the logical-axis rule table
and every workload's parameter table. Plain Python: no framework is imported."""
import pytest

from harness import mesh, registry
from harness.errors import UsageError


def test_mesh_syntax_names_every_axis():
  parallel = mesh.ParallelConfig(mesh="data=2,model=4")
  assert parallel.axes() == {"data": 2, "model": 4, "stage": 1, "expert": 1, "spatial": 1}
  assert mesh.ParallelConfig(spatial_partitions=2).axes()["spatial"] == 2
  shape = mesh.mesh_shape(mesh.ParallelConfig(mesh="spatial=2"), 8)
  assert (shape.data, shape.spatial, shape.devices, shape.description) == (4, 2, 8, "data=4,spatial=2")


@pytest.mark.parametrize("text", ["gpu=2", "data=0", "data=x", "data", "data=2,data=2"])
def test_bad_mesh_is_one_line_naming_the_axes(text):
  with pytest.raises(UsageError, match="allowed: NAME=SIZE with NAME in data, model, stage, "
                                       "expert, spatial"):
    mesh.parse_mesh(text)


def test_axis_products_must_fit_the_devices():
  with pytest.raises(ValueError, match="--mesh data=4,model=4 needs 16 devices; 8 available"):
    mesh.mesh_shape(mesh.ParallelConfig(mesh="data=4,model=4"), 8)
  assert mesh.mesh_shape(mesh.ParallelConfig(mesh="model=2"), 8).data == 4


def _fits(text, framework="jax", workload="bert", **kw):
  spec = registry.get(workload)
  cfg = spec.config("mini")
  parallel = mesh.ParallelConfig(mesh=text, sequence_parallel=kw.get("sequence_parallel", False))
  mesh.check_fits(parallel, framework=framework, workload=spec.name,
                  workload_axes=spec.mesh_axes, global_batch_size=kw.get("gbs", 32),
                  dims=spec.split_dims(cfg), devices=kw.get("devices"))


@pytest.mark.parametrize("text, kw, message", [
    ("data=2,expert=2", {"framework": "tf"}, "--mesh axis expert=2: bert has no dimension laid "
                                             "out on it; allowed axes for bert: data, stage, "
                                             "model"),
    # the batch is split over data x expert jointly
    ("data=3,expert=2", {"workload": "transformer"},
     "train.global_batch_size=32 is not divisible by the data x expert devices the batch is "
     "split over (3 x 2); allowed: a multiple of 6"),
    # a model axis must split the heads (Mesh-TF's layout); d_ff and vocab may stay whole
    ("data=1,model=8", {}, "--mesh model=8 does not divide the heads size 4; allowed: a "
                           "divisor of 4"),
    ("data=2,model=2", {"workload": "resnet50"}, "resnet50 has no dimension laid out on it; "
                                                 "allowed axes for resnet50: data, stage, "
                                                 "spatial"),
    ("data=4,spatial=2", {}, "bert has no dimension laid out on it; allowed axes for bert: data"),
    ("data=3", {}, "train.global_batch_size=32 is not divisible by the data axis"),
    ("data=16", {"devices": 8}, "needs 16 devices; 8 available"),
    # the default mesh puts every device on the data axis: resolved here, not in a trainer
    ("", {"devices": 3}, "train.global_batch_size=32 is not divisible by the data axis "
                         "(3: --cpu-devices 3); allowed: a multiple of 3"),
    # sequence parallelism: JAX's, a workload with a residual stream laid out by position, and
    # a model axis to split it over
    ("data=1,model=2", {"workload": "llama31_8b", "framework": "tf", "sequence_parallel": True},
     "parallel.sequence_parallel=true in TF: the sequence split of the residual stream is "
     "JAX's (GSPMD layouts); allowed: false in TF"),
    ("data=1,model=2", {"sequence_parallel": True}, "parallel.sequence_parallel=true: bert does "
                                                   "not lay its residual stream out along the "
                                                   "sequence; allowed: false"),
    ("data=2", {"workload": "llama31_8b", "sequence_parallel": True},
     "parallel.sequence_parallel=true splits the residual stream over the model axis, which "
     "this mesh does not have; allowed: with --mesh model=N (N > 1), or false"),
])
def test_fit_check_before_any_framework(text, kw, message):
  with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
    _fits(text, **kw)


def test_a_model_axis_fits_what_it_divides():
  _fits("data=2,model=4", devices=8)                # BERT mini: 4 heads, d_ff 128, vocab 64
  _fits("data=2,model=4", workload="transformer", devices=8)
  _fits("data=2,model=2", workload="llama31_8b", devices=4, sequence_parallel=True)


def test_mesh_coordinates_put_spatial_then_model_innermost():
  shape = mesh.MeshShape(data=2, model=2, spatial=2)
  assert [shape.coordinates(r)["spatial"] for r in range(8)] == [0, 1] * 4
  assert [shape.coordinates(r)["model"] for r in range(8)] == [0, 0, 1, 1] * 2
  assert [shape.coordinates(r)["data"] for r in range(8)] == [0] * 4 + [1] * 4


def test_weight_update_sharding_splits_a_model_sharded_tensor_on_another_dimension():
  shape = mesh.MeshShape(data=2, model=4)
  layout = mesh.logical_to_mesh(("embed", "mlp"), shape, shape=(64, 128))
  assert layout == (None, "model")
  assert mesh.update_layout((64, 128), layout, shape, True) == ("data", "model")
  assert mesh.update_layout((64, 128), layout, shape, False) == (None, "model")
  assert mesh.update_layout((3, 128), layout, shape, True) == (None, "model")  # none divides
  assert mesh.shard_shape((64, 128), ("data", "model"), shape) == (32, 32)
  # a vocab the model axis does not divide stays whole on it
  assert mesh.logical_to_mesh(("vocab", "embed"), shape, shape=(30522, 1024)) == (None, None)


def test_fit_check_splits_logical_dimensions_by_their_axis():
  with pytest.raises(UsageError, match="does not divide the height size 32"):
    _fits("spatial=3", workload="resnet50", devices=6, gbs=64)
  _fits("data=4,spatial=2", workload="resnet50", devices=8, gbs=64)


def test_logical_rules_map_names_to_mesh_axes_once_per_tensor():
  assert mesh.logical_to_mesh(("batch", "height", "width", "channels")) == (
      ("data", "expert"), "spatial", None, None)
  assert mesh.logical_to_mesh(("embed", "mlp")) == (None, "model")
  assert mesh.logical_to_mesh(("heads", "vocab")) == ("model", None)     # model used once
  small = mesh.MeshShape(data=8)
  assert mesh.logical_to_mesh(("batch", "height"), small) == ("data", None)   # spatial=1
  # the batch over data and expert jointly; the experts' inputs [experts, groups, ...] take
  # expert for the experts and what is left (data) for the groups
  moe = mesh.MeshShape(data=2, expert=4)
  assert mesh.logical_to_mesh(("batch", "length", "embed"), moe) == (("data", "expert"), None,
                                                                     None)
  assert mesh.logical_to_mesh(("experts", "batch", None, "embed"), moe) == (
      "expert", "data", None, None)
  assert mesh.logical_to_mesh(("batch",), mesh.MeshShape(data=1, expert=4)) == ("expert",)
  assert mesh.logical_to_mesh(("batch",), moe, shape=(6,)) == (None,)   # 8 does not divide 6
  assert mesh.shard_shape((16, 5), (("data", "expert"), None), moe) == (2, 5)
  with pytest.raises(ValueError, match="unknown logical axis 'hieght'"):
    mesh.logical_to_mesh(("batch", "hieght"))


@pytest.mark.parametrize("name", registry.names())
def test_every_parameter_of_every_workload_has_logical_axes(name):
  """The table gives every parameter of the model logical axes of the right rank (shapes from
  jax.eval_shape of the tiny preset's state)."""
  import jax
  from workloads.parallel.jax_runtime import path_name
  spec = registry.get(name)
  cfg = spec.configure("tiny")
  trainer_module = __import__(spec.trainer_modules["jax"], fromlist=["make_trainer"])
  from harness.workload import RunContext
  trainer = trainer_module.make_trainer(cfg, RunContext(seed=0, preset="tiny"))
  shapes = jax.eval_shape(trainer.create_state, jax.random.key(0)).params
  names = set()
  for path, leaf in jax.tree_util.tree_leaves_with_path(shapes):
    axes = mesh.param_axes(spec.param_axes, path_name(path), leaf.ndim)
    names.update(a for a in axes if a)
  assert names <= set(mesh.LOGICAL_AXES) and names


def test_one_composition_table_refuses_per_framework():
  """harness.mesh.COMPOSITION: each TF-only row refuses in TF and lets the same run through in
  JAX; the first row that applies is the one line a user sees."""
  from harness.mesh import ParallelConfig, composition_refusal
  cases = {
      ("data=2,expert=2", ("weight_update_sharding",)): "--mesh expert=2 in TF: its expert "
                                                         "axis runs on one host",
      ("data=1,model=2,spatial=2", ()): "--mesh model=2,spatial=2 in TF: its runtime splits "
                                        "weights without spatial partitioning",
      ("data=1,stage=2", ("num_processes",)): "--mesh stage=2 in TF: its pipeline is one graph",
  }
  for (text, flags), message in cases.items():
    parallel = ParallelConfig(mesh=text, weight_update_sharding="weight_update_sharding" in flags,
                              num_processes=2 if "num_processes" in flags else 1)
    assert composition_refusal("tf", parallel.axes(), parallel).startswith(message), text
    assert composition_refusal("jax", parallel.axes(), parallel) is None, text
  # expert x model runs in both (TF: the experts split over expert, whole over model), and
  # TF's model axis across processes
  both = ParallelConfig(mesh="data=1,expert=2,model=2")
  assert composition_refusal("tf", both.axes(), both) is None
  hosts = ParallelConfig(mesh="data=1,model=2", num_processes=2)
  assert composition_refusal("tf", hosts.axes(), hosts) is None
  # data x stage x model: GSPMD over model inside JAX's pipeline; TF places whole stages
  both = ParallelConfig(mesh="data=2,stage=2,model=2")
  assert composition_refusal("jax", both.axes(), both) is None
  assert composition_refusal("tf", both.axes(), both).startswith(
      "--mesh stage=2,model=2 in TF: its pipeline places whole stages on devices")
