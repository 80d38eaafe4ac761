"""GPipe in TensorFlow (tf_pipeline.py) on logical CPU devices, in float64, checked against
the JAX side and the one-replica TF step: ResNet's pipelined loss, gradients and new
batch-norm statistics equal JAX's micro-batched step on one device on the same weights
(converted with tf_layers.load_flax_variables); the Transformer's pipelined loss, gradients and
the weights after two Adam steps equal the one-replica TF trainer's, with dropout too (its masks
are keyed by step, layer and example: tf_layers.ExampleDropout); tf.recompute_grad leaves no
gradient None. With the JAX tests (test_jax_pipeline.py) and the frameworks' parity tests,
TF pipelined = JAX pipelined = one device. Stages own their weights: each lives on its stage's
device with its optimizer slots."""
import collections
import re

import jax
import numpy as np
import pytest
import tensorflow as tf

from harness.workload import RunContext
from tests.parallel.test_jax_pipeline import resnet_batch, resnet_reference
from tests.parallel.test_tf_model_parallel import restart, tiny_config
from workloads.parallel import tf_layers
from workloads.resnet import spec as resnet_spec
from workloads.transformer import spec as transformer_spec

pytestmark = pytest.mark.usefixtures("jax_float64")     # the JAX references (conftest.py)

RTOL = 1e-9


def assert_close(actual, expected, name=""):
  np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=RTOL,
                             atol=RTOL * float(np.max(np.abs(expected))), err_msg=name)


# ------------------------------------------------------------------ ResNet against JAX
def tf_resnet(mesh, microbatches, remat=False):
  cfg = resnet_spec.tiny()
  cfg.model.stage_sizes = (2, 2)
  cfg.data.source = "synthetic"
  cfg.train.jit_compile = False
  cfg.parallel.mesh, cfg.parallel.microbatches, cfg.parallel.remat = mesh, microbatches, remat
  trainer = resnet_spec.SPEC.make_trainer("tf", cfg, RunContext(seed=0, preset="tiny"))
  trainer.dtype = "float64"
  trainer.build()
  one, _ = resnet_batch()
  variables = jax.device_get({"params": one.state.params,
                              "batch_stats": one.state.batch_stats})
  tf_layers.load_flax_variables(trainer.model, variables)
  return trainer


# M = K without remat, M = K = 4 with it, M < K (one micro-batch); each micro-batch is traced
# into the one TF graph, so M=8 cost twice M=4 and showed nothing more
@pytest.mark.parametrize("stages,microbatches,remat", [(2, 2, False), (4, 4, True),
                                                       (2, 1, True)])
def test_tf_resnet_pipelined_equals_jax_micro_batched_step(stages, microbatches, remat):
  _, batch = resnet_batch()
  (loss, stats), grads = resnet_reference(microbatches)
  trainer = tf_resnet(f"stage={stages},data=1", microbatches, remat)
  assert len(trainer.runtime.pipeline_devices) == stages
  got_loss, got_grads = tf.function(trainer.loss_and_grads)(
      {k: tf.constant(v) for k, v in batch.items()})
  assert_close(got_loss, loss)
  paths = {id(v): p for p, v in tf_layers.params_by_path(trainer.model).items()}
  assert all(g is not None for g in got_grads)
  for var, grad in zip(trainer.model.trainable_variables, got_grads):
    expected = grads
    for key in paths[id(var)]:
      expected = expected[key]
    assert_close(grad, expected, var.path)
  moving = [(path[1:], var) for path, var in tf_layers.variables_by_path(trainer.model).items()
            if path[0] == "batch_stats"]                  # the new moving averages
  assert len(moving) == len(jax.tree.leaves(stats))
  for path, var in moving:
    node = stats
    for key in path:
      node = node[key]
    assert_close(var.numpy(), node, path)


def test_tf_resnet_with_data_axis_is_refused_in_one_line(cli):
  proc = cli("run", "resnet50", "--framework", "tf", "--cpu-devices", "4", "--mesh",
             "stage=2,data=2", "--set", "parallel.microbatches=2")
  assert proc.returncode == 2 and "allowed: stage=K with data=1 in TF" in proc.stderr


# ------------------------------------------------------------------ Transformer against TF
def tf_transformer(mesh, microbatches=1, remat=False, dropout=0.0, compiled=True, layers=2):
  """`compiled`: init (the train loop traced, for train()); else build (loss_and_grads only).
  `layers` a stack: the pipeline cuts 2 x layers (stage=4 needs 2)."""
  cfg = tiny_config(mesh)
  cfg.model.num_layers = layers
  cfg.model.dropout = cfg.model.attention_dropout = cfg.model.relu_dropout = dropout
  cfg.parallel.microbatches, cfg.parallel.remat = microbatches, remat
  trainer = transformer_spec.SPEC.make_trainer("tf", cfg, RunContext(seed=0, preset="tiny"))
  trainer.dtype = "float64"
  trainer.init() if compiled else trainer.build()
  return trainer


@pytest.fixture(scope="module")
def one_replica():
  """layers -> the one-replica trainer of that depth, made at its first use, its loss_and_grads
  traced once for the module (every test's batch has the same shapes, and the step count its
  dropout masks read is a variable)."""
  made = {}

  def reference(layers):
    if layers not in made:
      trainer = made[layers] = tf_transformer("data=1", dropout=DROPOUT, layers=layers)
      trainer.traced_loss_and_grads = tf.function(trainer.loss_and_grads)
    return made[layers]
  return reference


DROPOUT = 0.1        # everywhere: the masks, keyed by (step, layer, example), are the same


def weights(trainer):
  return {path: var.numpy() for path, var in tf_layers.params_by_path(trainer.model).items()}


# as many micro-batches as stages (with data) and fewer (four stages, with remat): the
# stage=2,data=1 M=4 run without remat and stage=4,data=1 M=4 with it showed what these do
# (remat was on the M=4 data x stage graph, whose unrolled re-computed forward cost 78 CPU s;
# data x stage at M=4, 56 CPU s, walked the same schedule table as M=2 at twice the graph:
# more micro-batches than stages is JAX's GRID case 4, 8 and tests/harness/test_pipeline.py's
# table).
# Dropout on: the masks do not depend on stages or micro-batches, and the re-materialized
# forward redraws the same ones (this was a test of its own: the same trainers, 25 CPU s).
# Two stages hold one layer each (the encoder's on the first, the decoder's on the second: the
# embedding shared by both ends, the encoder's output sent on): two layers a stack there doubled
# the data x stage graph (36 CPU s) and showed nothing more; four stages need two.
@pytest.mark.parametrize("mesh,microbatches,remat,layers", [
    ("stage=2,data=2", 2, False, 1), ("stage=4,data=1", 1, True, 2)])
def test_tf_transformer_pipelined_equals_one_replica(one_replica, mesh, microbatches, remat,
                                                     layers):
  one_replica = one_replica(layers)
  piped = tf_transformer(mesh, microbatches, remat, dropout=DROPOUT, layers=layers)
  start = weights(one_replica)
  for path, var in tf_layers.params_by_path(piped.model).items():
    var.assign(start[path])
  batch = piped.train_dataset(0, 1).take(1).get_single_element()
  loss, grads = tf.function(piped.loss_and_grads)(batch)
  reference = one_replica.traced_loss_and_grads
  want_loss, want_grads = reference(batch)
  if remat:             # the masks are on: the same batch at the next step draws other ones
    one_replica.optimizer.iterations.assign(1)
    assert abs(float(want_loss) - float(reference(batch)[0])) > 1e-3
    one_replica.optimizer.iterations.assign(0)
  assert_close(loss, want_loss)
  assert all(g is not None for g in grads)
  for var, g, want in zip(piped.model.trainable_variables, grads, want_grads):
    assert_close(g, want, var.path)
  losses = [piped.train(1)["loss"] for _ in range(2)]
  expected = [one_replica.train(1)["loss"] for _ in range(2)]
  assert_close(losses, expected)
  got = weights(piped)
  for path, value in weights(one_replica).items():
    assert_close(got[path], value, path)
  restart(one_replica, start)                      # for the module's next test


def _stage_of(trainer, path):
  """The stage whose layers read the weight at `path` (the first, for the shared embedding)."""
  layers = trainer.spec.pipeline_layers(trainer.cfg)
  for k, (_, (start, end)) in enumerate(trainer.stage_placement):
    if any(re.fullmatch(regex, path) for _, regex in layers[start:end]):
      return k
  raise AssertionError(f"no stage reads {path}")


@pytest.mark.parametrize("make", [lambda: tf_transformer("stage=4,data=1", 1, compiled=False),
                                  lambda: tf_resnet("stage=4,data=1", 4)],
                         ids=["transformer", "resnet"])
def test_tf_stages_own_their_weights_and_optimizer_slots(make):
  """stage=4: every weight lives on the device of the stage that reads it (the shared
  embedding on the first stage's), its optimizer slots (Adam's m and v, LARS's momentum) beside
  it; describe's bytes a device are the largest stage's, read from the variables' devices."""
  trainer = make()
  place = lambda d: (tf.DeviceSpec.from_string(d).device_type,   # pylint: disable=unnecessary-lambda-assignment
                     tf.DeviceSpec.from_string(d).device_index)
  devices = [place(d) for d in trainer.runtime.pipeline_devices]
  by_device = collections.Counter()
  for path, var in tf_layers.params_by_path(trainer.model).items():
    device = place(var.value.device)
    assert device == devices[_stage_of(trainer, "/".join(path))], "/".join(path)
    by_device[device] += var.numpy().nbytes
  assert len(by_device) == 4
  slots = {place(v.value.device) for v in trainer.optimizer.variables if v is not trainer.optimizer.iterations}
  assert slots == set(by_device)
  weights_bytes = sum(by_device.values())
  # without GPipe's figures (two more traces of the step, with and without remat): those are
  # test_pipeline_end_to_end.py's test_tf_describe_keeps_fewer_activations_with_recompute_grad
  info = trainer.describe(pipeline=False)
  assert info.parameter_bytes_per_device == max(by_device.values()) < weights_bytes
  assert info.parameter_bytes_without_stages == weights_bytes
