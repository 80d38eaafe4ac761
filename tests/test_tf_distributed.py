"""The TF distributed runtime (tf.distribute) on 8 logical CPU devices: each feature against
the single-replica run (or a hand-computed reference), over several optimizer steps."""
import numpy as np
import pytest
import tensorflow as tf

from harness import config
from harness.workload import RunContext
from workloads.resnet import spec


def tiny_config(image_size=16, **parallel):
  cfg = spec.mini()
  config.apply_overrides(cfg, ["model.stage_sizes=1,1", "model.width=4",
                               f"data.image_size={image_size}", "data.train_examples=64",
                               "data.eval_examples=40", "data.eval_batch_size=16",
                               "train.global_batch_size=16"])
  for key, value in parallel.items():
    setattr(cfg.parallel, key, value)
  return cfg


def trained(steps=3, optimizer="lars", image_size=16, **parallel):
  cfg = tiny_config(image_size, **parallel)
  cfg.optimizer.name = optimizer
  trainer = spec.SPEC.make_trainer("tf", cfg, RunContext(seed=0, preset="mini"))
  trainer.init()
  if steps:
    trainer.train(steps)
  return trainer


def weights_of(trainer):
  return {v.path: v.numpy() for v in trainer.model.variables}


def assert_weights_close(a, b, rtol=1e-5, atol=1e-6):
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_allclose(a[key], b[key], rtol=rtol, atol=atol, err_msg=key)


@pytest.fixture(scope="module")
def single_replica():
  return weights_of(trained(mesh="data=1"))


def test_eight_logical_devices():
  assert len(tf.config.list_logical_devices("CPU")) == 8


def test_data_parallel_matches_one_replica(single_replica):
  assert_weights_close(weights_of(trained(mesh="data=8")), single_replica)
