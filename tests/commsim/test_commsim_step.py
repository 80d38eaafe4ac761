"""`simulate --workload W`: one training step with the gradient all-reduce overlapped with the
backward pass, and its scaling from 8 to 4,096 chips at a fixed global batch."""
import json

import pytest

from harness import cli
from harness.commsim import step


def _linear(seconds_per_byte, latency=0.0):
  return lambda nbytes: latency + seconds_per_byte * nbytes


def test_buckets_fill_in_reverse_order_and_are_ready_with_their_last_gradient():
  sizes = [10, 20, 30, 40]                      # forward order; the backward pass reverses it
  ready = step.buckets(sizes, bucket_bytes=50, backward_s=1.0, forward_s=0.5)
  # 40 + 30 = 70 >= 50: one bucket at 70% of the backward; then 20 + 10 at its end
  assert ready == [(0.5 + 0.7, 70), (1.5, 30)]
  assert step.buckets(sizes, float("inf"), 1.0) == [(1.0, 100)]


def test_with_compute_far_longer_only_the_last_bucket_is_exposed():
  sizes = [4e6] * 50
  cost = _linear(1e-12, 1e-5)
  out = step.predict(sizes, flops_per_example=1e12, per_chip_batch=1000, peak=1e15, mfu=0.5,
                     bucket_bytes=20e6, all_reduce_s=cost)
  last = step.buckets(sizes, 20e6, 1.0)[-1][1]
  assert out["compute_s"] == pytest.approx(2.0)
  assert out["exposed_s"] == pytest.approx(cost(last), rel=1e-12)
  assert out["buckets"] == 10 and out["scaling_efficiency"] > 0.99


def test_with_no_compute_the_whole_all_reduce_is_exposed():
  sizes = [4e6] * 50
  cost = _linear(1e-9, 1e-5)
  out = step.predict(sizes, flops_per_example=0.0, per_chip_batch=1, peak=1e15, mfu=0.5,
                     bucket_bytes=20e6, all_reduce_s=cost)
  assert out["exposed_s"] == pytest.approx(sum(cost(b) for _, b in step.buckets(
      sizes, 20e6, 0.0)), rel=1e-12)
  assert out["exposed_s"] == out["all_reduce_s"] == out["step_s"]


def test_one_bucket_after_the_backward_pass_exposes_all_of_it():
  """The TF step's way (one all_reduce of every gradient after the backward pass): nothing
  overlaps, whatever the compute."""
  sizes = [4e6] * 50
  cost = _linear(1e-11)
  out = step.predict(sizes, 1e12, 1000, 1e15, 0.5, step.BUCKET_BYTES["tf"], cost)
  assert out["buckets"] == 1
  assert out["exposed_s"] == pytest.approx(cost(2e8), rel=1e-12)


def test_scaling_at_a_fixed_batch_loses_efficiency_and_stops_at_one_example_a_chip(capsys):
  """ResNet-50's 102 MB of gradients on TPU v4 (3-D tori of 8 to 4,096 chips), 24 GFLOP an
  example at 40% of 275 TFLOP/s and the reference's global batch of 4,096: the compute per
  chip halves with each doubling while the all-reduce does not shrink, so the efficiency
  falls; at 4,096 chips each has one example."""
  code = cli.main(["simulate", "--workload", "resnet50", "--machine", "tpu-v4",
                   "--flops-per-example", "24e9", "--json"])
  doc = json.loads(capsys.readouterr().out)["step"]
  assert code == 0
  rows = doc["scaling"]
  assert [r["chips"] for r in rows] == list(step.SCALING_CHIPS)
  assert rows[0]["topology"] == "torus:2x2x2" and rows[-1]["topology"] == "torus:16x16x16"
  efficiency = [r["scaling_efficiency"] for r in rows]
  assert efficiency == sorted(efficiency, reverse=True) and efficiency[0] > 0.95
  for row in rows:
    assert row["compute_s"] == pytest.approx(24e9 * 4096 / row["chips"] / (275e12 * 0.4))
    assert row["step_s"] == pytest.approx(row["compute_s"] + row["exposed_s"])
  assert doc["this_machine"]["chips"] == 4096 and doc["bucket_bytes"] == 30 * 2 ** 20 + 7


def test_a_batch_smaller_than_the_machine_is_reported_not_timed(capsys):
  code = cli.main(["simulate", "--workload", "resnet50", "--machine", "dgx-h100",
                   "--flops-per-example", "24e9", "--set", "train.global_batch_size=64"])
  out = capsys.readouterr().out
  assert code == 0
  assert "scaling efficiency" in out and "from 128 chips on: fewer examples than chips" in out


@pytest.mark.parametrize("argv,message", [
    (["--mfu", "0"], "--mfu 0.0 is out of range"),
    (["--mfu", "1.5"], "--mfu 1.5 is out of range"),
    (["--bucket-mb", "0"], "--bucket-mb 0.0 is out of range"),
    (["--flops-per-example", "-1"], "--flops-per-example -1.0 is out of range"),
])
def test_bad_step_input_is_one_line_and_exit_2(capsys, argv, message):
  code = cli.main(["simulate", "--workload", "resnet50", "--flops-per-example", "1e9",
                   *argv])
  out, err = capsys.readouterr()
  assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err
