"""bench/method.py: interleaving order, per-round ratios, median and min-max; bench/all.py's
table; bench/gpu_models.py's FLOP count."""
import numpy as np
import pytest

from bench import method


def test_rounds_alternate_the_order_and_ratios_pair_within_a_round():
  calls = []
  clock = iter(range(100))

  def side(name, rates):
    values = iter(rates)
    def measure():
      calls.append(name)
      next(clock)
      return next(values)
    return measure

  values = method.interleaved({"ours": side("ours", [10, 12, 9]),
                               "peer": side("peer", [5, 4, 10])}, 3, log=None)
  assert calls == ["ours", "peer", "peer", "ours", "ours", "peer"]
  assert values == {"ours": [10, 12, 9], "peer": [5, 4, 10]}
  rs = method.ratios(values, "ours", "peer")
  assert rs == [2.0, 3.0, 0.9]
  assert method.summary(rs) == (2.0, 0.9, 3.0)
  assert method.ratio_line("x", rs) == ("ratio x: median 2.000 [min 0.900, max 3.000] over 3 "
                                        "interleaved rounds")


def test_warmup_rounds_run_interleaved_and_are_dropped():
  calls, rates = [], {"a": iter([7, 7, 1, 2]), "b": iter([7, 7, 3, 4])}

  def side(name):
    return lambda: (calls.append(name), next(rates[name]))[1]

  values = method.interleaved({"a": side("a"), "b": side("b")}, 2, log=None, warmup_rounds=2)
  assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]
  assert values == {"a": [1, 2], "b": [3, 4]}


def test_at_least_one_round():
  with pytest.raises(ValueError, match="--repeats 0"):
    method.interleaved({"a": lambda: 1.0}, 0)


FAKE_BENCH = '''"""A bench whose sides report fixed rates: the worker protocol and the table, no framework."""
import os
import sys
sys.path.insert(0, {root!r})
from bench import method

WORKLOAD = "fake"


def add_args(p):
  p.add_argument("--rate", type=float, default=10.0)


def peer_name(args):
  return "the peer"


def title(args):
  return "fake"


def ours(framework, args):
  # the first three answers (the worker's untimed call, two warm-up rounds) are never reported
  rates = iter([99.0] * 3 + [args.rate, 2 * args.rate, 3 * args.rate] if framework == "tf" else
               [99.0] * 3 + [args.rate] * 3)
  return (lambda: next(rates)), (4e9 if framework == "tf" else None)


def peer(args):
  backend = os.environ["KERAS_BACKEND"]
  return (lambda: args.rate / 2 if backend == "tensorflow" else args.rate), (
      2e9 if backend == "tensorflow" else None)


if __name__ == "__main__":
  method.main(sys.modules[__name__], __file__)
'''


def test_compare_runs_each_side_in_one_kept_alive_worker(tmp_path):
  """Each side's process answers every round after one untimed call and the dropped warm-up
  rounds (its rates change from call to call, so a worker restarted per round would repeat
  its first); the peer learns its Keras backend;
  the rows hold medians, per-round ratios and the model-FLOP ratio."""
  import importlib.util
  from tests.conftest import ROOT
  script = tmp_path / "fake_bench.py"
  script.write_text(FAKE_BENCH.format(root=ROOT))
  loaded = importlib.util.spec_from_file_location("fake_bench", script)
  bench = importlib.util.module_from_spec(loaded)
  loaded.loader.exec_module(bench)
  args = method.bench_args(bench, ["--rate=10", "--repeats=3"], worker=False)
  rows = {r["framework"]: r for r in method.compare(bench, str(script), args, log=None)}
  tf, jax, both = rows["tf"], rows["jax"], rows["tf/jax"]
  assert (tf["ours_samples_per_s"], tf["peer_samples_per_s"]) == (20.0, 5.0)
  assert (tf["ratio_median"], tf["ratio_min"], tf["ratio_max"]) == (4.0, 2.0, 6.0)
  assert (tf["ours_gflop_per_sample"], tf["peer_gflop_per_sample"]) == (4.0, 2.0)
  assert tf["model_flop_ratio"] == 8.0 and tf["peer"] == "the peer"
  assert (jax["ratio_median"], jax["ratio_min"], jax["ratio_max"]) == (1.0, 1.0, 1.0)
  assert jax["model_flop_ratio"] == 2.0        # the FLOPs counted on TF: the same models
  assert (both["ratio_min"], both["ratio_median"], both["ratio_max"]) == (1.0, 2.0, 3.0)
  text = method.table(rows.values())
  assert "4.000 [2.000, 6.000]" in text and "8.000" in text


def test_a_failing_worker_stops_the_comparison_with_its_error(tmp_path):
  from tests.conftest import ROOT
  script = tmp_path / "broken.py"
  script.write_text(FAKE_BENCH.format(root=ROOT).replace(
      "def peer(args):\n", "def peer(args):\n  raise RuntimeError('no peer here')\n"))
  import importlib.util
  loaded = importlib.util.spec_from_file_location("broken", script)
  bench = importlib.util.module_from_spec(loaded)
  loaded.loader.exec_module(bench)
  args = method.bench_args(bench, ["--repeats=1", "--frameworks=tf"], worker=False)
  with pytest.raises(SystemExit, match="(?s)peer-tf failed .*no peer here"):
    method.compare(bench, str(script), args, log=None)


def test_bad_frameworks_exit_2(capsys):
  from bench import resnet_vs_keras
  with pytest.raises(SystemExit) as e:
    method.bench_args(resnet_vs_keras, ["--frameworks=tf,torch"])
  assert e.value.code == 2
  assert "--frameworks tf,torch: allowed: tf, jax or tf,jax" in capsys.readouterr().err


def test_all_py_checks_its_workloads_and_reads_gpu_rows(capsys, tmp_path):
  import importlib
  bench_all = importlib.import_module("bench.all")
  with pytest.raises(SystemExit) as e:
    bench_all.parse(["--workloads", "resnet50,gpt3"])
  assert e.value.code == 2
  assert ("--workloads resnet50,gpt3: allowed: a comma-separated list of "
          + ", ".join(bench_all.BENCHES)) in capsys.readouterr().err
  # bench/gpu_models.py's columns -> the table's: samples/s, GFLOP and MFU, no peer
  row = bench_all.from_gpu_row({"workload": "bert", "batch": "32", "step_ms": "140.99",
                                "samples_per_s": "227.0", "gflop_per_sample": "",
                                "tflops": "", "mfu": "0.237"})
  assert (row["framework"], row["ours_samples_per_s"], row["mfu"]) == ("gpu-jax", 227.0, 0.237)
  assert row["ours_gflop_per_sample"] is None and row["ratio_median"] is None
  path = tmp_path / "t.csv"
  bench_all.write_csv([row], path)
  from harness import bench_table
  read = bench_table.read(str(path))
  assert list(read.columns) == list(method.COLUMNS) and read["mfu"][0] == 0.237
  assert "MFU 0.237" in method.table([row])


def test_gpu_models_counts_a_step_from_its_jaxpr_where_the_backend_does_not():
  import jax
  import jax.numpy as jnp
  from workloads.parallel import jax_flops
  batch, d1, d2, d3 = 8, 64, 128, 32

  def step(params, x):
    loss = lambda p: jnp.sum(jnp.tanh(x @ p["w1"]) @ p["w2"])
    return jax.value_and_grad(loss)(params)

  params = {"w1": jnp.ones((d1, d2)), "w2": jnp.ones((d2, d3))}
  x = jnp.ones((batch, d1))

  class Unanswered:                          # a PJRT plugin without cost analysis
    def cost_analysis(self):
      raise NotImplementedError

  # forward x.w1 and h.w2; backward dw2, dh and dw1 (no dx): the matmuls, plus a few
  # elementwise ops on [batch, d2]
  matmuls = 2 * batch * (2 * d1 * d2 + 3 * d2 * d3)
  flops, source = jax_flops.step_flops(step, Unanswered(), params, x)
  assert source == "jaxpr roofline" and matmuls <= flops <= 1.05 * matmuls
  lowered_flops, source = jax_flops.step_flops(step, jax.jit(step).lower(params, x), params, x)
  assert source == "lowered cost analysis" and matmuls <= lowered_flops <= 1.05 * matmuls


def test_gpu_models_jaxpr_count_of_resnet50_agrees_with_the_lowered_program():
  import jax
  import jax.numpy as jnp
  from bench import gpu_models
  from workloads.parallel import jax_flops
  w = gpu_models.BARE_STEPS["resnet50"].build(2, jnp.bfloat16, np.random.default_rng(1),
                                             gpu_models.SHAPES)

  def create(key):
    variables = w["init"](key)
    return {"params": variables["params"], "batch_stats": variables["batch_stats"],
            "opt_state": w["tx"].init(variables["params"]), "step": jnp.zeros((), jnp.int32),
            "dropout_key": key}

  state = jax.eval_shape(create, jax.random.key(0))          # shapes only: nothing compiled
  step = gpu_models.make_train_step(w["loss"], w["tx"])
  lowered = jax.jit(step).lower(state, w["batch"])
  flops, _ = jax_flops.step_flops(step, lowered, state, w["batch"])
  jaxpr_flops, source = jax_flops.step_flops(step, None, state, w["batch"])
  assert source == "jaxpr roofline"
  assert 0.95 * 24.6e9 < flops / 2 < 24.6e9       # a sample: 3 x the forward's 4.1 GMAC x 2
  assert 0.99 * flops < jaxpr_flops <= flops               # elementwise ops counted apart
