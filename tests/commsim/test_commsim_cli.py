"""`run_benchmark.py simulate` as a user runs it: JSON output, tables, heat map, workload
gradient bytes, and one-line errors."""
import json

import pytest

from harness import cli
from harness.commsim import algorithms, step, tables, timing
from harness.commsim.machine import Machine


def _main(capsys, *argv):
  code = cli.main(["simulate", *argv])
  out, err = capsys.readouterr()
  return code, out, err


def test_json_output_equals_the_library(capsys):
  code, out, _ = _main(capsys, "--topology", "torus:8x8", "--algorithm", "2d", "--bytes",
                       "100MB", "--failed", "3,5", "6,2", "--json", "--check")
  assert code == 0
  doc = json.loads(out)
  machine = Machine("torus:8x8", link_bandwidth=50e9, link_latency=1e-6, overhead=0.0,
                    failed_chips=[(3, 5), (6, 2)])
  want = timing.simulate(machine, algorithms.build(machine, "all-reduce", "2d"), 100e6)
  (row,) = doc["results"]
  assert row["time_s"] == pytest.approx(want.time_s, rel=1e-12)
  assert row["busbw_GBps"] == pytest.approx(want.busbw / 1e9, rel=1e-12)
  assert row["participants"] == 62 and row["functional_check"] == "exact"
  assert doc["machine"].startswith("torus:8x8, 62 live chips")
  assert set(row) >= {"algbw_GBps", "steps", "max_link_bytes", "busiest_link"}
  assert row["top_links"][0] == [row["busiest_link"], row["max_link_bytes"]]
  assert [b for _, b in row["top_links"]] == sorted(want.link_bytes)[::-1][:10]


def test_tables_compare_scale_and_sweep(capsys, tmp_path):
  png = tmp_path / "load.png"
  code, out, _ = _main(capsys, "--topology", "mesh:8x8", "--bytes", "1GiB", "--scaling",
                       "--failure-sweep", "1,2", "--heatmap", str(png), "--failed", "2,2")
  assert code == 0
  for name in ("ring", "bidir", "multiring", "2d", "2d-bidir"):
    assert name in out
  assert "scaling" in out and "1024" in out and "failed chips" in out
  import matplotlib.image
  image = matplotlib.image.imread(png)
  assert image.shape[0] > 200 and image[..., :3].std() > 0.05      # drawn, not blank


def test_failure_sweep_rows():
  rows = tables.failure_sweep("torus:8x8", dict(link_bandwidth=1e9), "all-reduce", ["2d"],
                              1e6, counts=(1, 2, 4))
  assert [r["failed"] for r in rows] == [0, 1, 2, 4]
  assert rows[0]["slowdown"] == 1.0
  assert [len(r["failed_chips"].split()) for r in rows] == [0, 1, 2, 4]


def test_scaling_shapes():
  assert [tables.scaling_shape("torus", n) for n in (8, 32, 1024)] == [
      "torus:4x2", "torus:8x4", "torus:32x32"]
  assert tables.scaling_shape("multinode", 64) == "multinode:8x8"


def test_workload_gradient_bytes_are_its_parameters(capsys):
  """`--workload` counts the parameters from the model's shapes (nothing compiled): ResNet-50
  v1.5 has the MLPerf reference's 25,557,032, all-reduced as float32 or bfloat16."""
  code, out, _ = _main(capsys, "--workload", "resnet50", "--topology", "torus:4x4",
                       "--algorithm", "2d", "--json", "--flops-per-example", "24e9")
  doc = json.loads(out)
  assert code == 0 and doc["bytes"] == 4 * 25_557_032
  assert "25,557,032 parameters" in doc["workload"]
  assert [r["chips"] for r in doc["step"]["scaling"]] == list(step.SCALING_CHIPS)
  assert doc["step"]["gradient_bytes"] == doc["bytes"] and "scaling" not in doc
  code, out, _ = _main(capsys, "--workload", "resnet50", "--topology", "torus:4x4",
                       "--algorithm", "2d", "--grad-dtype", "bfloat16", "--json")
  assert json.loads(out)["bytes"] == 2 * 25_557_032


def test_an_moe_workload_s_all_to_all_moves_its_dispatch_slots(capsys):
  """`--collective all-to-all --workload transformer` with expert layers: one chip's dispatch,
  its groups' E x capacity slots of hidden values. moe_mini: 64 rows x 24 tokens over 16
  chips = one group of 96 tokens, 4 experts x 30 slots x 64 float32 values."""
  code, out, _ = _main(capsys, "--workload", "transformer", "--preset", "moe_mini",
                       "--collective", "all-to-all", "--topology", "torus:4x4", "--algorithm",
                       "direct", "--json")
  doc = json.loads(out)
  assert code == 0 and doc["bytes"] == 4 * 30 * 64 * 4
  assert doc["results"][0]["algorithm"] == "direct"
  code, _, err = _main(capsys, "--workload", "transformer", "--preset", "mini", "--collective",
                       "all-to-all", "--topology", "torus:4x4")
  assert code == 2 and "its step has no all-to-all (no expert layers)" in err


def test_workload_bytes_agree_between_frameworks(capsys):
  """The Keras model (TF trainer) and the flax model (JAX trainer) count the same."""
  got = {}
  for framework in ("jax", "tf"):
    code, out, _ = _main(capsys, "--workload", "bert", "--preset", "tiny", "--framework",
                         framework, "--topology", "ring:4", "--algorithm", "ring", "--json")
    assert code == 0
    got[framework] = json.loads(out)["bytes"]
  assert got["jax"] == got["tf"] > 0


@pytest.mark.parametrize("argv,message", [
    (["--bytes", "12XB"], "--bytes '12XB' is not a size"),
    (["--bytes", "-5"], "is not a size"),
    (["--topology", "torus:0x3"], "fewer than 2 chips"),
    (["--topology", "hypercube:4"], "is not a topology"),
    (["--topology", "mesh:4x4", "--failed", "9,9"], "chip 9,9 is not on mesh:4x4"),
    (["--topology", "mesh:4x4", "--failed", "a,b"], "is not a coordinate"),
    (["--topology", "mesh:4x4", "--failed-link", "0,0-2,0"], "joins no linked chips"),
    (["--topology", "torus:4x4", "--algorithm", "hierarchical"], "allowed: ring, bidir"),
    (["--topology", "torus:4x4", "--algorithm", "magic"], "is not an algorithm"),
    (["--topology", "mesh:3x3", "--failed", "1,0", "0,1"], "disconnect mesh:3x3"),
    (["--topology", "ring:8", "--heatmap", "x.png"], "draws a 2-D mesh or torus"),
    (["--topology", "mesh:4x4", "--heatmap", "/nowhere/x.png"], "is not a writable folder"),
    (["--topology", "multinode:2x4", "--machine", "tpu-v3"], "needs a network"),
    (["--failure-sweep", "1,x"], "is not a list of counts"),
    (["--link-bandwidth", "0"], "out of range"),
    (["--workload", "resnet5"], "unknown workload 'resnet5'"),
    (["--topology", "torus:4x4x4", "--heatmap", "x.png"], "draws a 2-D mesh or torus"),
    (["--topology", "torus:4x4x4x2"], "is not a topology"),
    (["--topology", "multinode:2x8", "--nics-per-node", "0"], "--nics-per-node 0 is out of range"),
    (["--topology", "multinode:2x8", "--nics-per-node", "3"], "3 NICs per node do not divide 8"),
    (["--topology", "torus:4x4x4", "--algorithm", "2d"], "allowed: ring, bidir, multiring, 3d"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
  code, out, err = _main(capsys, *argv)
  assert code == 2 and out == ""
  assert err.count("\n") == 1 and message in err, err
