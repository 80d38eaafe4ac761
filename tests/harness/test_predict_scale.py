"""`predict` at scale: NCCL's tree across nodes against its closed form written out by hand,
the pick of the fastest all-reduce, DLRM's samples as its logs state them (NVIDIA's
train_samples at run_stop, Google's eval index x 0.05 epoch), an eval that brackets its
training block, and the range's RCP-ratio term."""
import math
import os

import pytest

from harness import predict, predict_collective
from harness.commsim import machine as machine_lib
from harness.commsim import step as step_lib

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared")
V07_DLRM = os.path.join(SHARED, "mlperf_results", "training_v0.7", "Google", "results",
                        "tpu-v4-16-TF", "dlrm")
V21_DLRM = os.path.join(SHARED, "mlperf_scaling", "training_v2.1", "NVIDIA", "results",
                        "dgxa100_n8_ngc22.04_merlin_hugectr", "dlrm")
needs = pytest.mark.skipif(not (os.path.isdir(V07_DLRM) and os.path.isdir(V21_DLRM)),
                           reason="../shared/mlperf_results and ../shared/mlperf_scaling")


def test_the_tree_is_its_closed_form():
  """100 nodes of 8 GPUs, 4 NICs a node (2 GPUs a rail), one protocol: every term by hand."""
  proto = machine_lib.Protocol("P", 10e-6, 0.5, 1e6)
  eff = machine_lib.Efficiency(link=0.8, network=0.9, launch=20e-6, protocols=(proto,))
  kwargs = dict(link_bandwidth=300e9, link_latency=1e-6, network_bandwidth=25e9,
                network_latency=2e-6, nics_per_node=4, efficiency=eff)
  shard, pieces, levels = 80e6 / 8, 10, 7                # 80 MB over 8 GPUs; ceil(log2 100)
  intra = 2 * 7 * (1e-6 + 10e-6 * pieces + shard / (300e9 * 0.8 * 0.5))
  rail = 25e9 * 0.9 * 4 / 8 * 0.5
  inter = 2 * shard / rail + 2 * levels * (2e-6 + 10e-6) + 10e-6 * pieces
  got = predict_collective.tree_all_reduce_seconds(kwargs, 100, 8, 80e6)
  assert got == pytest.approx(20e-6 + intra + inter, rel=1e-12)


def test_across_nodes_the_fastest_of_rings_and_the_tree():
  """On 32 DGX H100 nodes a 1 MiB all-reduce is latency-bound: the rings' 2 x 31 steps across
  nodes lose to the tree's 2 x 5 levels, and predict takes the faster, as NCCL does."""
  target = predict.make_target(256, "dgx-h100", per_node=8)
  assert target.topology == "multinode:32x8"
  rings = step_lib._best_all_reduce(target.kwargs, target.topology)  # pylint: disable=protected-access
  tree = predict_collective.tree_all_reduce_seconds(target.kwargs, 32, 8, 2**20)
  assert tree < rings(2**20)
  assert predict.all_reduce_seconds(target)(2**20) == pytest.approx(tree, rel=1e-12)
  # one node has no tree to take; Gaudi's HCCL is not NCCL: both keep the simulator's best
  for other in (predict.make_target(8, "dgx-h100", per_node=8),
                predict.make_target(32, "gaudi2", per_node=8)):
    best = step_lib._best_all_reduce(other.kwargs, other.topology)    # pylint: disable=protected-access
    assert predict.all_reduce_seconds(other)(2**20) == pytest.approx(best(2**20), rel=1e-12)


def test_wire_bytes_half_on_nvidia_gpus():
  assert predict.wire_bytes("dgx-a100", 4) == predict.wire_bytes("dgx-h100", 4) == 2
  assert predict.wire_bytes("tpu-v4", 4) == predict.wire_bytes(None, 4) == 4


@needs
def test_dlrm_samples_as_its_logs_state_them():
  """NVIDIA's HugeCTR logs epoch_num from 1 (1.05 at the first eval) and the samples trained
  as train_samples at run_stop; Google's v0.7 logs the eval's index, each 0.05 epoch on, and
  its evals bracket their training blocks (so their time is training time)."""
  epoch = 4_195_197_692
  nvidia = predict.read_mlperf(V21_DLRM)
  assert nvidia.train_samples == epoch
  with open(os.path.join(V21_DLRM, "result_0.txt")) as f:
    end = [line for line in f if '"key": "train_samples"' in line][-1]
  stated = int(end.split('"value": ')[1].split(",")[0])
  assert stated == 4_194_785_280
  run0 = next(r for r in nvidia.runs if r.path.endswith("result_0.txt"))
  assert run0.samples == stated
  google = predict.read_mlperf(V07_DLRM)
  assert google.train_samples == epoch
  for run in google.runs:
    assert run.samples == pytest.approx(run.evals * 0.05 * epoch, rel=1e-12)
    assert run.eval_s == 0.0 and run.evals >= 10


def test_an_eval_spanning_its_block_is_training():
  assert predict._bracketing([20_000, 3_000], 20_200) == 20.0      # pylint: disable=protected-access
  assert predict._bracketing([3_249], 51_621) == 0.0                # pylint: disable=protected-access


def test_the_range_holds_the_rcp_ratios_own_error():
  """Runs 10, 11, 12 minutes carried over, RCP spread 8% at the target, the RCP ratio's
  standard error 3%: half-width 2 x sqrt(runs' spread^2 + 8%^2 + 3%^2), one run counted."""
  out = {"runs_minutes": [10.0, 11.0, 12.0], "rcp_spread": 0.08, "samples_ratio": 1.2,
         "predicted_minutes": 11.0, "rcp_ratio_spread": 0.03}
  runs = math.sqrt(((10 - 11) ** 2 + (12 - 11) ** 2) / 3) / 11
  got = predict.prediction_range(out, 3, 1)
  assert got["range_runs"] == pytest.approx(2 * math.sqrt(runs ** 2 + 0.08 ** 2 + 0.03 ** 2),
                                            rel=1e-12)


def test_the_rcp_ratios_error_is_each_means_standard_error():
  """ResNet 1.0.0 RCPs at 4,096 and 65,536: each mean's stdev / mean / sqrt(runs kept)."""
  points = predict.rcp_points("resnet", "1.0.0")
  a, b = (next(p for p in points if p["bs"] == bs) for bs in (4096, 65536))
  m = predict.Measured("resnet", "1.0", "x", "x", "TPU v3", 16, 4096, 1_281_167, [], None,
                       "tpu-v3")
  conv = predict.convergence(m, 65536)
  want = math.hypot(a["stdev"] / a["mean"] / math.sqrt(a["runs"]),
                    b["stdev"] / b["mean"] / math.sqrt(b["runs"]))
  assert conv["ratio_spread"] == pytest.approx(want, rel=1e-12)
  assert a["runs"] >= 3 and conv["ratio"] == pytest.approx(b["mean"] / a["mean"], rel=1e-12)


def test_a_chip_of_two_tensorcores_works_at_least_one_example_a_core():
  """Mask R-CNN at batch 256: on 256 TPU v4 chips (two TensorCores each) a chip's step is that of
  2 images, one a core, not 1; on 256 H100s (one device each) it is 1; at 16 a chip, 16."""
  fig = {"parameters": 1000}
  m = predict.Measured("maskrcnn", "0.7", "x", "x", "TPU v4", 8, 128, 0, [], None, "tpu-v4")
  for machine, batch, work in (("tpu-v4", 256, 2), ("dgx-h100", 256, 1), ("tpu-v4", 4096, 16)):
    target = predict.make_target(256, machine, per_node=8)
    assert predict.layout(m, fig, 256, batch, target).work == work


def test_dlrm_v21_across_nodes_sends_only_the_infrequent_vectors():
  """NVIDIA's v2.1 HugeCTR configuration for 4 x 8 H100s at batch 71,680 sizes its all-to-all
  for a mean 29,120 infrequent lookups of 71,680 x 26: 1/64 of the pooled vectors travel.
  On that system a GPU's all-to-all vector is 2,240 examples x 26 x 128 x 2 B / 64 = 232,960 B
  and the step holds two; on one node, in v1.0, or on a TPU, every vector travels."""
  fig = predict.figures("dlrm", "2.1")
  assert fig["hybrid_embedding"]["infrequent_share"] == 29120 / (71680 * 26) == 1 / 64
  m = predict.Measured("dlrm", "2.1", "x", "x", "H100", 8, 55296, 0, [], None, "dgx-h100",
                       optimizer="sgd")
  four = predict.make_target(32, "dgx-h100", per_node=8)
  assert four.topology == "multinode:4x8"
  share = predict.infrequent_share(fig, "2.1", four)
  assert share == 1 / 64
  assert predict.all_to_all_bytes(fig, 2240, "dgx-h100", share) == 232_960
  fit = {"per_example_s": 1e-8, "update_scale": 1.0, "floor_s": 0.0}
  parts = predict.step_parts(m, fig, fit, 71680, four, 1.0)
  assert parts.all_to_all == pytest.approx(
      2 * predict.all_to_all_seconds(232_960, four), rel=1e-12)
  one = predict.make_target(8, "dgx-h100", per_node=8)
  assert predict.infrequent_share(fig, "2.1", one) == 1.0
  assert predict.infrequent_share(fig, "1.0", predict.make_target(64, "dgx-a100")) == 1.0
  assert predict.infrequent_share(fig, "0.7", predict.make_target(64, "tpu-v4")) == 1.0


def test_an_asynchronous_eval_holds_training_up_only_until_the_next_epoch():
  """Evals at 100-130 and 200-260 ms, epochs starting at 0, 101 and 205: both are asynchronous
  (their epoch starts before their eval_stop); 29 + 55 ms ran alongside training, and the last
  one's host part, 55 ms, is the tail the run waited on. An eval that stops before the next
  epoch starts is all eval time."""
  got = predict._host_parts([(100, 130), (200, 260)], [0, 101, 205], 262)  # pylint: disable=protected-access
  assert got == pytest.approx((0.084, 0.055), rel=1e-12)
  assert predict._host_parts([(100, 130)], [0, 131], 140) == (0.0, 0.0)  # pylint: disable=protected-access


V21_RETINANET = os.path.join(SHARED, "mlperf_scaling", "training_v2.1", "NVIDIA", "results",
                             "dgxa100_n256_ngc22.09_pytorch", "ssd")


@pytest.mark.skipif(not os.path.isdir(V21_RETINANET), reason="../shared/mlperf_scaling")
def test_retinanet_on_2048_gpus_waits_on_its_last_evals_host_part():
  """NVIDIA's RetinaNet on 2,048 A100s logs each eval_stop seconds after the next epoch_start
  (OpenImages mAP on a host, asynchronously): read from the log's lines by hand, the tail is
  the last eval_stop less the epoch_start after the last eval_start, and the eval time only
  each eval_start to the next epoch_start."""
  import json
  run = next(r for r in predict.read_mlperf(V21_RETINANET).runs
             if r.path.endswith("result_0.txt"))
  events = []
  with open(os.path.join(V21_RETINANET, "result_0.txt")) as f:
    for line in f:
      if ":::MLLOG" in line:
        rec = json.loads(line.split(":::MLLOG", 1)[1])
        events.append((rec["key"], rec["time_ms"] / 1000))
  starts = [t for k, t in events if k == "eval_start"]
  stops = [t for k, t in events if k == "eval_stop"]
  epochs = [t for k, t in events if k == "epoch_start"]
  resumed = [min(e for e in epochs if e > s) for s in starts]
  assert all(r < e for r, e in zip(resumed, stops))            # every one asynchronous
  assert run.tail_s == pytest.approx(stops[-1] - resumed[-1], abs=1e-6)
  assert 4 < run.tail_s < 7
  assert run.eval_s == pytest.approx(sum(r - s for r, s in zip(resumed, starts)), abs=1e-6)
