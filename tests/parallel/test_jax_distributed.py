"""The JAX distributed runtime on 8 simulated CPU devices: each feature against the
single-device run (or a hand-computed reference), over several optimizer steps."""
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from harness import config, mesh
from harness.workload import RunContext
from tests.conftest import run_workers, start_dying_run
from workloads.parallel import jax_runtime
from workloads.resnet import input_pipeline, jax_trainer, spec
from tests.trees import assert_trees_close


def tiny_config(**parallel):
  cfg = spec.mini()
  config.apply_overrides(cfg, ["model.stage_sizes=1,1", "model.width=4", "data.image_size=16",
                               "data.train_examples=64", "data.eval_examples=40",
                               "data.eval_batch_size=16", "train.global_batch_size=16"])
  for key, value in parallel.items():
    setattr(cfg.parallel, key, value)
  return cfg


def trained(steps=3, optimizer="lars", width=4, **parallel):
  cfg = tiny_config(**parallel)
  cfg.optimizer.name = optimizer
  cfg.model.width = width
  trainer = spec.SPEC.make_trainer("jax", cfg, RunContext(seed=0, preset="mini"))
  trainer.init()
  if steps:
    trainer.train(steps)
  return trainer


def params_of(trainer):
  return jax.tree.map(np.asarray, jax.device_get(trainer.state.params))


def assert_params_close(a, b, rtol=1e-5, atol=1e-6):
  assert_trees_close(a, b, rtol, atol)


def initialized(width, **parallel):
  """A trainer whose state init has laid out on the mesh, its steps not compiled: enough for
  the optimizer state's bytes per device (the compiled step keeps the same shardings)."""
  cfg = tiny_config(**parallel)
  cfg.model.width = width
  trainer = spec.SPEC.make_trainer("jax", cfg, RunContext(seed=0, preset="mini"))
  trainer.compile_steps = lambda *args: None
  trainer.init()
  return trainer


def evaluated_then_trained(**parallel):
  """A trainer evaluated at its initial state (kept on the host as .initial_state, the eval as
  .initial_eval), then trained 3 steps: one compile serves the eval and the training tests."""
  trainer = trained(steps=0, **parallel)
  trainer.initial_state = jax.device_get(trainer.state)     # the steps donate the state
  trainer.initial_eval = trainer.evaluate()
  trainer.train(3)
  return trainer


@pytest.fixture(scope="module")
def single_trainer():
  return evaluated_then_trained(mesh="data=1")


@pytest.fixture(scope="module")
def single_device(single_trainer):
  return params_of(single_trainer)


def test_eight_simulated_devices():
  assert jax.device_count() == 8


@pytest.fixture(scope="module")
def data_parallel():
  return evaluated_then_trained(mesh="data=8")


def test_data_parallel_global_bn_equals_one_device(data_parallel, single_device):
  assert data_parallel.num_devices == 8 and data_parallel.runtime.bn_group_size == 8
  assert_params_close(params_of(data_parallel), single_device)


def test_describe_counts_the_whole_step_on_any_device_count(data_parallel, single_trainer):
  """XLA's cost analysis of a partitioned step is per device; describe's FLOPs per example (and
  so MFU) must not shrink 8x on 8 devices. Up to the optimizer update, which each device
  repeats on its replica of the weights, the two count the same work."""
  one = single_trainer.describe().train_flops_per_example
  eight = data_parallel.describe().train_flops_per_example
  assert 0.95 < eight / one < 1.3


def test_describe_off_cpu_counts_the_program_before_the_backend(single_trainer, monkeypatch):
  """Off a CPU on one device the count is the lowered program's (a GPU's compiled step hides
  its matmuls and convolutions in library calls), else the jaxpr's roofline count where the
  backend answers nothing for it (JAX 0.11.2 on an H100: the harness's MFU was NaN)."""
  compiled = single_trainer.describe().train_flops_per_example
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  lowered = single_trainer.describe().train_flops_per_example
  assert 0.8 < lowered / compiled < 1.2        # fusion changes how elementwise ops count

  class Unanswered:
    def cost_analysis(self):
      raise NotImplementedError

  monkeypatch.setattr(single_trainer, "_train_lowered", Unanswered())
  counted = single_trainer.describe().train_flops_per_example
  assert 0.9 < counted / lowered <= 1.0           # a few elementwise ops have no roofline rule


def test_weight_update_sharding_equals_unsharded_and_cuts_state_8x(single_device):
  sharded = trained(mesh="data=8", weight_update_sharding=True)
  assert_params_close(params_of(sharded), single_device)
  # bytes at the mini preset's width (8): its channel counts divide over 8 replicas
  wide = initialized(width=8, mesh="data=8", weight_update_sharding=True)
  plain = initialized(width=8, mesh="data=8")
  ratio = (jax_runtime.per_device_bytes(wide.state.opt_state)
           / jax_runtime.per_device_bytes(plain.state.opt_state))
  assert abs(ratio - 1 / 8) < 0.05 / 8, ratio
  # parameters stay whole on every device (all-gathered after the update)
  kernel = sharded.state.params["classifier"]["kernel"]
  assert kernel.addressable_shards[0].data.shape == kernel.shape


def test_weight_update_sharding_with_sgd():
  assert_params_close(params_of(trained(optimizer="sgd", mesh="data=8",
                                       weight_update_sharding=True)),
                     params_of(trained(optimizer="sgd", mesh="data=1")))


def test_lamb_trust_ratio_is_over_whole_layers_under_weight_update_sharding():
  """optax.lamb's per-layer norms computed on sharded state equal the unsharded update."""
  runtime = jax_runtime.MeshRuntime(tiny_config(mesh="data=8", weight_update_sharding=True).parallel)
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.normal(size=(64, 24)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=(24,)), jnp.float32)}
  grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
  tx = optax.lamb(1e-2, weight_decay=0.01)

  def step(params, grads):
    state = tx.init(params)
    updates, _ = tx.update(runtime.constrain_update(grads), state, params)
    return runtime.replicate(optax.apply_updates(params, updates))

  with_sharding = jax.jit(step)(params, grads)
  plain = jax.jit(jax.jit(lambda p, g: optax.apply_updates(p, tx.update(g, tx.init(p), p)[0])))(
      params, grads)
  assert_params_close(with_sharding, plain)
  assert runtime.update_sharding((64, 24)).spec[0] == jax_runtime.DATA


def test_collectives_by_axis_names_the_axes_a_group_spans_and_leaves_out_single_devices():
  """describe's collectives from the HLO's replica groups on data=2,model=4 (device d*4 + m):
  a group across data is 'data'; '{}' is one group of every device; single-device groups (an
  axis of size 1: XLA keeps the op, no byte moves) are not listed."""
  runtime = jax_runtime.MeshRuntime(mesh.ParallelConfig(mesh="data=2,model=4"))
  hlo = "\n".join([
      "  %a = f32[4,8]{1,0} all-reduce(f32[4,8]{1,0} %x), replica_groups={{0,4},{1,5},{2,6},"
      "{3,7}}, to_apply=%add",
      "  %b = f32[16]{0} all-reduce(f32[16]{0} %y), replica_groups={{0},{1},{2},{3},{4},{5},"
      "{6},{7}}, to_apply=%add",
      "  %c = f32[8]{0} all-gather(f32[1]{0} %z), replica_groups={}, dimensions={0}"])
  assert runtime.collectives_by_axis(hlo) == {("all-reduce", "data"): [1, 1, 128],
                                              ("all-gather", "data+model"): [1, 1, 32]}


def test_grouped_bn_equals_a_hand_computed_reference(single_trainer):
  """Groups of 2 replicas x 2 examples: batch norm over each group of 4 examples, gradients
  averaged over the 4 groups, LARS steps: computed here on one device, group by group, from
  the one-device trainer's initial state."""
  grouped = trained(steps=0, mesh="data=8", bn_group_size=2)
  state, cfg = single_trainer.initial_state, single_trainer.cfg
  batches = input_pipeline.train_dataset(cfg, 16, seed=0).as_numpy_iterator()
  group_step = jax.jit(lambda params, stats, chunk: jax_trainer.loss_and_grads(
      state.apply_fn, params, stats, chunk, cfg.model.num_classes, cfg.optimizer.label_smoothing))
  for _ in range(3):                                   # step 0 has lr 0 (warmup): 3 steps
    batch = next(batches)
    chunks = [{k: v[i * 4:(i + 1) * 4] for k, v in batch.items()} for i in range(4)]
    outs = [group_step(state.params, state.batch_stats, c) for c in chunks]
    grads = jax.tree.map(lambda *g: sum(g) / 4, *[o[1] for o in outs])
    stats = jax.tree.map(lambda *s: sum(s) / 4, *[o[2] for o in outs])
    state = state.apply_gradients(grads=grads, batch_stats=stats)
  grouped.train(3)
  assert_params_close(params_of(grouped), jax.device_get(state.params))
  assert_params_close(jax.device_get(grouped.state.batch_stats), jax.device_get(state.batch_stats))
  moved = single_trainer.initial_state.params["classifier"]["kernel"]
  assert not np.allclose(jax.device_get(state.params)["classifier"]["kernel"], moved)
  hlo = grouped._train_step.as_text()
  assert "replica_groups={{0,1},{2,3},{4,5},{6,7}}" in hlo.replace(" ", "")


def test_grouped_bn_differs_from_global_bn(data_parallel):
  local = params_of(trained(mesh="data=8", bn_group_size=1))
  whole = params_of(data_parallel)
  assert not np.allclose(local["classifier"]["kernel"], whole["classifier"]["kernel"],
                         rtol=1e-4, atol=1e-6)


def test_spatial_partitioning_equals_unsharded_with_halo_exchange(single_device):
  spatial = trained(mesh="data=4,spatial=2")
  assert spatial.num_devices == 8
  assert_params_close(params_of(spatial), single_device, rtol=2e-5)   # as TF's spatial test
  counts = jax_runtime.count_collectives(spatial._train_step.as_text())
  assert counts.get("collective-permute", 0) > 0, counts
  image = spatial.runtime.sharding(("batch", "height", "width", "channels"))
  assert image.spec == jax.sharding.PartitionSpec(jax_runtime.DATA, "spatial", None, None)


def test_distributed_eval_counts_every_example_once(data_parallel, single_trainer):
  result = data_parallel.initial_eval                # both at the initial weights (seed 0)
  assert result["count"] == 40                     # 40 examples in padded batches of 16
  single = single_trainer.initial_eval
  assert result["top1_accuracy"] == pytest.approx(single["top1_accuracy"])


def test_host_side_eval_equals_device_counts():
  """Three-phase eval through the host (what BLEU and COCO need): the same accuracy as the
  on-device counts, 40 examples counted once from 48 padded rows (3 batches of 16)."""
  from tests.host_eval import jax_trainer_class
  cfg = tiny_config(mesh="data=8")
  host = jax_trainer_class()(cfg, RunContext(seed=0, preset="mini"))
  host.init()
  host.train(2)
  result = host.evaluate()
  batches = host.pipeline.eval_dataset(host.cfg, host.eval_batch_size()).as_numpy_iterator()
  counts = jax.jit(jax_trainer.eval_step)                  # the default device eval step
  totals = sum(np.asarray(counts(host.state, b)) for b in batches)
  assert result["count"] == 40 and result["rows_seen"] == 48
  assert result["top1_accuracy"] == pytest.approx(totals[0] / totals[1])


@pytest.mark.parametrize("parallel, message", [
    (dict(mesh="data=16"), "needs 16 devices; 8 available"),
    (dict(mesh="data=3"), "not divisible by the 3 devices"),
])
def test_impossible_meshes_are_refused(parallel, message):
  cfg = tiny_config(**parallel)
  with pytest.raises(ValueError, match=message):
    spec.SPEC.make_trainer("jax", cfg, RunContext(seed=0, preset="mini"))


@pytest.mark.slow
def test_two_processes_equal_one_process(tmp_path):
  """2 processes x 2 devices against 1 process x 4 devices, run side by side."""
  multi = run_workers("jax_multihost_worker.py", tmp_path, 2, 2, 4, timeout=300)
  # host-side eval: each process gathered all 48 padded rows of the 3 global batches
  assert int(multi["rows_seen"]) == 48


@pytest.mark.slow
def test_a_dead_process_ends_the_others_with_an_error(tmp_path):
  (survivor,), dying = start_dying_run("jax_multihost_worker.py", tmp_path / "x.npz", 2, 1)
  start = time.time()
  dying.communicate(timeout=300)
  out = survivor.communicate(timeout=180)[0]
  assert dying.returncode == 3
  assert survivor.returncode != 0
  assert time.time() - start < 150
  assert "worker done" not in out
