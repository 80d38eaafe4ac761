import fnmatch
import gc
import os
import resource
import shutil
import socket
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_RESULTS = os.path.join(os.path.dirname(ROOT), "shared", "mlperf_results", "training_v0.7")

# In-process JAX tests see 8 simulated CPU devices (set before anything imports jax). The
# user's own flags are kept aside for the subprocesses a user would start: pytest-xdist's
# workers inherit the controller's environment, flag included, so they read them from there.
USER_XLA_FLAGS = os.environ.setdefault("HARNESS_TEST_USER_XLA_FLAGS",
                                       os.environ.get("XLA_FLAGS", ""))
# The in-process JAX tests (and the multi-process test scripts) run a few steps per compiled
# program: there XLA:CPU's optimisation costs more compile time than it saves in run time, and
# JAX's own switch for that case skips it (SSD tiny train step 9.1 -> 2.8 s;
# tests/parallel/test_jax_distributed.py 178 -> 139 s on 2 cores). Every equality they assert
# is between two programs compiled alike. It is JAX's flag, not XLA_FLAGS: TensorFlow's XLA
# steps, compared with tf.distribute's kernels, keep the default. The end-to-end CLI runs
# train hundreds of steps and keep the default too, as a user's run does.
FEW_STEP_ENV = {"JAX_DISABLE_MOST_OPTIMIZATIONS": "true"}
os.environ.update(FEW_STEP_ENV)
# For the same programs, XLA:CPU's older loop emitters instead of its MLIR fusion emitters
# (an XLA flag, so TensorFlow's XLA-compiled test steps use it too): compiles cost far less
# (EfficientNet tiny trainer init 28.7 -> 20.5 s, user CPU 41 -> 24 s; its distributed test
# file 217 -> 145 s of CPU on 2 cores). Not for the end-to-end runs either. XLA means to
# retire those emitters (openxla/xla#48001): an XLA that no longer knows the flag refuses
# to start, so drop it then, when requirements.txt moves jaxlib / tensorflow on.
FEW_STEP_XLA_FLAGS = " --xla_cpu_use_fusion_emitters=false"
os.environ["XLA_FLAGS"] = (USER_XLA_FLAGS + FEW_STEP_XLA_FLAGS
                           + " --xla_force_host_platform_device_count=8")
# JAX's persistent compilation cache, one per test session, made by the controller (its xdist
# workers and every subprocess inherit the variable, so all read and fill it). Tests compile
# the same programs in different processes (the same tiny trainers in several files, the mini
# runs of an end-to-end file), and a hit returns the executable the compile would: the key is
# the program, the compile options and the flags (EfficientNet tiny init 24.8 -> 8.1 s on a
# hit). A user's own cache directory, if set, is used instead and kept.
OWN_JAX_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  OWN_JAX_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(
      prefix="harness-tests-jax-cache-")
# The generated mini datasets' cache (workloads/common/mini_cache.py: ~/.cache by default),
# one per test session like JAX's: the runs and tests of every worker that need the same set
# generate it once (the Transformer's and BERT's mini sets take ~6 s of CPU each), and a
# test session writes nothing under the user's home. Written whole then renamed into place,
# so workers preparing the same set at once are safe.
OWN_DATA_CACHE = None
if "HARNESS_TEST_CACHE_HOME" not in os.environ:
  OWN_DATA_CACHE = os.environ["HARNESS_TEST_CACHE_HOME"] = tempfile.mkdtemp(
      prefix="harness-tests-cache-")
os.environ["XDG_CACHE_HOME"] = os.environ["HARNESS_TEST_CACHE_HOME"]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from tests import fork_server  # noqa: E402  pylint: disable=wrong-import-position
# The fork servers' folder, made by the controller too: its workers share the servers.
OWN_FORK_SERVERS = fork_server.claim_session()
gc.set_threshold(*fork_server.GC_THRESHOLDS)    # from the start: collecting imports TF and JAX


def pytest_configure(config):
  """In-process TF tests see 8 logical CPU devices (fixed before TensorFlow runs its first op,
  so before any test file is imported), in the processes that run tests: not in xdist's
  controller, which only hands out files (TensorFlow's import there, ~8 s of CPU, delayed the
  workers' start)."""
  if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
    return
  from workloads.parallel import tf_runtime   # pylint: disable=import-outside-toplevel
  tf_runtime.use_logical_cpus(8)


def clean_env(few_steps=False, loop_emitters=False):
  """The environment a user's shell has: without the 8-device flag and the few-step switch
  the tests set (few_steps: with the switch, for the multi-process test scripts and the
  command-line runs of a few steps). loop_emitters: XLA:CPU's older loop emitters alone (the
  XLA flag above, not JAX's switch), for a convolutional net's run to its target, whose
  compile is most of its CPU and whose steps run as fast with them (EfficientNet's mini run
  38.5 -> 26.0 s of CPU, ResNet's 19.5 -> 14.1); a Transformer's steps run slower with them
  (BERT's mini run 33 -> 39), so those runs keep the default."""
  emitters = few_steps or loop_emitters
  env = dict(os.environ, XLA_FLAGS=USER_XLA_FLAGS + (FEW_STEP_XLA_FLAGS if emitters else ""))
  if not few_steps:
    for key in FEW_STEP_ENV:
      env.pop(key, None)
  return env


def run_cli(*args, cwd=None, timeout=600, few_steps=False, loop_emitters=False, env=None):
  """Runs `python run_benchmark.py ARGS` in a new process, as a user would, forked from a server
  that has imported the third-party libraries (tests/fork_server.py: ~8 s of CPU less per run;
  one server per environment for the whole session).
  few_steps: with the few-step switches, for a run that stops after a few steps (its compile
  is most of its cost: EfficientNet's 16-step large-batch run 64 -> 31 s of CPU); a run to the
  target keeps the user's defaults (loop_emitters: clean_env's). env: variables added to the
  user's environment."""
  return fork_server.run([os.path.join(ROOT, "run_benchmark.py"), *args], cwd or ROOT,
                         {**clean_env(few_steps, loop_emitters), **(env or {})},
                         timeout=timeout)


def start_cli(*args, few_steps=False, env=None):
  """`python run_benchmark.py ARGS` started, not waited for: a Popen-like process whose
  stdout carries stderr too (`env`: variables added to the user's environment)."""
  return fork_server.start([os.path.join(ROOT, "run_benchmark.py"), *args], ROOT,
                           {**clean_env(few_steps), **(env or {})}, merge_stderr=True)


@pytest.fixture
def cli():
  return run_cli


def run_to_target(cli, tmp_path, framework, workload, devices, layout, target, *extra):
  """`run WORKLOAD` on a layout to its mini target: success, the layout in the row, a log the
  official checker passes (the model-parallel end-to-end files). The mini set is the session's
  (no --data-dir: the cache above)."""
  import pandas as pd  # pylint: disable=import-outside-toplevel
  results_csv = tmp_path / "results.csv"
  proc = cli("run", workload, "--framework", framework, "--seed", "0", "--cpu-devices", devices,
             "--mesh", layout, "--results", str(results_csv), "--log-dir",
             str(tmp_path / "logs"), *extra)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  row = pd.read_csv(results_csv).iloc[0]
  assert row["status"] == "success" and row["mesh"] == layout
  assert row["num_devices"] == int(devices)
  from harness import registry  # pylint: disable=import-outside-toplevel
  assert row["target"] == target
  assert registry.get(workload).metric.reached(row["final_metric"], target)   # >= or <=
  check = cli("check", row["log_path"])
  assert check.returncode == 0 and "PASSED" in check.stdout, check.stdout
  return proc


@pytest.fixture(scope="module")
def jax_float64():
  """JAX in float64 for one module (the TF<->JAX parity tests), not for the whole session."""
  import jax
  with jax.enable_x64(True):
    yield


def workload_config(spec_module, model, **data):
  """The workload's tiny config with `model` as its model config and the `data` fields set:
  what a model file's build(cfg) reads, for a model no preset has."""
  cfg = spec_module.SPEC.configure("tiny")
  cfg.model = model
  for key, value in data.items():
    setattr(cfg.data, key, value)
  return cfg


def rel_err(a, b):
  """|a - b| / |b| over all elements, computed in float64."""
  import numpy as np
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def free_port(count=1):
  """A base port on 127.0.0.1 with `count` free ports from it (TF workers listen on base + i)."""
  while True:
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      base = s.getsockname()[1]
    try:
      for i in range(1, count):
        with socket.socket() as s:
          s.bind(("127.0.0.1", base + i))
      return base
    except OSError:
      continue


def start_worker(script, out, processes, pid, port, devices, *extra):
  """One process of a multi-process test run: tests/SCRIPT OUT PROCESSES PID PORT DEVICES."""
  return fork_server.start([os.path.join(ROOT, "tests", script), str(out), str(processes),
                           str(pid), str(port), str(devices), *extra], ROOT,
                          clean_env(few_steps=True), merge_stderr=True)


def run_workers(script, tmp_path, processes, devices, single_devices, timeout, count=40):
  """A multi-process run (PROCESSES processes of DEVICES devices each) and a one-process run
  over SINGLE_DEVICES devices of tests/SCRIPT, started together: both end with exit status 0 and
  save the same run (assert_same_saved_run). Returns the multi-process run's saved .npz."""
  import numpy as np
  port = free_port(processes)
  procs = [start_worker(script, tmp_path / "multi.npz", processes, i, port, devices)
           for i in range(processes)]
  procs.append(start_worker(script, tmp_path / "single.npz", 1, 0, free_port(), single_devices))
  outputs = [p.communicate(timeout=timeout)[0] for p in procs]
  assert [p.returncode for p in procs] == [0] * (processes + 1), "\n".join(
      o[-3000:] for o in outputs)
  assert_same_saved_run(tmp_path / "multi.npz", tmp_path / "single.npz", count=count)
  return np.load(tmp_path / "multi.npz")


def start_dying_run(script, out, processes, devices):
  """A multi-process run of tests/SCRIPT whose last process exits (status 3) after start-up:
  returns (the surviving processes, the dying one)."""
  port = free_port(processes)
  survivors = [start_worker(script, out, processes, i, port, devices)
               for i in range(processes - 1)]
  return survivors, start_worker(script, out, processes, processes - 1, port, devices, "--die")


def assert_same_saved_run(multi_path, one_path, count):
  """The .npz a multi-process run saved equals the single-process one: count, accuracy, arrays."""
  import numpy as np
  multi, one = np.load(multi_path), np.load(one_path)
  assert int(multi["count"]) == int(one["count"]) == count
  assert float(multi["accuracy"]) == pytest.approx(float(one["accuracy"]))
  for key in set(one.files) - {"rows_seen"}:
    np.testing.assert_allclose(multi[key], one[key], rtol=1e-5, atol=1e-6, err_msg=key)


# The files that take ~10 s of CPU or more, most first (per-file sums of the per-test CPU
# report of a fresh-clone run on 2 cores, 2026-11-27). pytest-xdist hands whole files to its
# workers in this order (pytest.ini turns off its own reordering, which puts the files with the
# most tests first: the end-to-end files, two to eleven tests each, started last and the last of
# them ran alone while the other workers idled). Files not listed follow (SLOW_BY_NAME below).
LONG_FILES = (
    # first: its jobs run under slurmd (their CPU is not the test's), mostly waiting on them
    "tests/parallel/test_slurm_cluster.py",
    "tests/parallel/test_pipeline_end_to_end.py",
    "tests/parallel/test_jax_pipeline.py",
    "tests/parallel/test_tf_model_parallel.py",
    "tests/parallel/test_tf_pipeline.py",
    "tests/resnet/test_resnet_end_to_end.py",
    "tests/ssd/test_ssd_distributed.py",
    "tests/parallel/test_tf_distributed.py",
    "tests/bert/test_bert_end_to_end.py",
    "tests/harness/test_faults.py",
    "tests/efficientnet/test_efficientnet_distributed.py",
    "tests/parallel/test_jax_model_parallel.py",
    "tests/efficientnet/test_efficientnet_end_to_end.py",
    "tests/ssd/test_ssd_end_to_end.py",
    "tests/parallel/test_tf_moe.py",
    "tests/test_contract.py",
    "tests/parallel/test_moe_end_to_end.py",
    "tests/parallel/test_jax_moe.py",
    "tests/parallel/test_jax_distributed.py",
    "tests/parallel/test_model_parallel_end_to_end.py",
    "tests/parallel/test_tf_step_structure.py",
    "tests/harness/test_predict.py",
    "tests/harness/test_summarize.py",
    "tests/bert/test_bert_parity.py",
    "tests/harness/test_cli_errors.py",
    "tests/bert/test_bert_distributed.py",
    "tests/parallel/test_jax_without_tensorflow.py",
    "tests/efficientnet/test_efficientnet_model.py",
    "tests/harness/test_gpu_harness.py",
    "tests/efficientnet/test_efficientnet_parity.py",
    "tests/parallel/test_moe_router.py",
    "tests/resnet/test_resnet_parity.py",
    "tests/transformer/test_transformer_distributed.py",
    "tests/parallel/test_jax_remat.py",
    "tests/dlrm/test_dlrm_end_to_end.py",
    "tests/transformer/test_transformer_model.py",
    "tests/bert/test_bert_packing.py",
    "tests/commsim/test_commsim_cli.py",
    "tests/commsim/test_commsim_measured.py",
    "tests/parallel/test_tf_param_paths.py",
    "tests/transformer/test_transformer_parity.py",
    "tests/ssd/test_ssd_data.py",
)


# Files LONG_FILES does not list (a new workload's, until its CPU time is measured and it is
# added above by rank) follow it when their names say they are slow in every workload so far:
# end-to-end CLI runs, then multi-process runs, then float64 parity, in any tests/ folder; then
# the rest. Adding a workload needs no edit here.
SLOW_BY_NAME = ("test_*end_to_end*.py", "test_*distributed*.py", "test_*parity*.py")
_LONG_RANK = {path: i for i, path in enumerate(LONG_FILES)}


def file_rank(path: str) -> int:
  """Where a test file (relative to the repository root) starts: its LONG_FILES place, then
  its SLOW_BY_NAME kind, then last."""
  if path in _LONG_RANK:
    return _LONG_RANK[path]
  name = os.path.basename(path)
  kind = next((i for i, pattern in enumerate(SLOW_BY_NAME) if fnmatch.fnmatch(name, pattern)),
              len(SLOW_BY_NAME))
  return len(LONG_FILES) + kind


def pytest_collection_finish(session):
  """The test files are imported (TensorFlow, JAX and the workloads with them): out of the
  collector's sight from here on (fork_server.settle_collector)."""
  del session
  fork_server.settle_collector()


def pytest_collection_modifyitems(config, items):
  del config
  items.sort(key=lambda item: file_rank(os.path.relpath(str(item.fspath), ROOT)))   # stable


# CPU seconds per test (user + system, the test's process and the subprocesses it waited for;
# a module fixture's to the file's first test), and the 15 largest at the end, beside pytest's
# 15 slowest: on 2 cores the suite's time is its CPU time over ~1.9, and a test's wall time
# depends on what the other worker runs meanwhile, its CPU time far less.
def _cpu_seconds():
  own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                      resource.RUSAGE_CHILDREN))
  return (own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
          + fork_server.children_cpu_seconds())


# CPU seconds spent in the cyclic collector (by the thread that collects: it holds the GIL,
# and the runtimes' own threads may run meanwhile), reported per worker beside its seconds in
# tests (fork_server.GC_THRESHOLDS says why it matters).
_COLLECTOR = {"seconds": 0.0, "since": 0.0}


def _time_collections(phase, info):
  del info
  if phase == "start":
    _COLLECTOR["since"] = time.thread_time()
  else:
    _COLLECTOR["seconds"] += time.thread_time() - _COLLECTOR["since"]


gc.callbacks.append(_time_collections)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  del nextitem
  item.harness_cpu_start = _cpu_seconds()
  item.harness_gc_start = _COLLECTOR["seconds"]
  item.harness_wall_start = time.time()
  yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  if call.when == "teardown":        # the report copies user_properties: xdist sends them on
    item.user_properties.append(("cpu_s", _cpu_seconds() - item.harness_cpu_start))
    item.user_properties.append(("gc_s", _COLLECTOR["seconds"] - item.harness_gc_start))
    item.user_properties.append(("wall", (item.harness_wall_start, time.time())))
  yield


CPU_BY_TEST = {}
SPAN_BY_TEST = {}                   # nodeid -> (xdist worker, wall start, wall end)
# (first test's start, last test's end, seconds in tests, CPU seconds in the collector) per
# xdist worker: the suite's wall time less the busiest worker's test seconds is start-up (each
# worker imports and collects every test file) and the tail (one worker idle while the other
# ends).
WORKER_SPANS = {}
SESSION_START = time.time()         # the controller's import of this file: the session's start


def pytest_runtest_logreport(report):
  if report.when == "teardown":
    CPU_BY_TEST.update({report.nodeid: v for k, v in report.user_properties if k == "cpu_s"})
    worker = getattr(getattr(report, "node", None), "gateway", None)   # xdist's, on the controller
    name = getattr(worker, "id", "main")
    collector = sum(value for key, value in report.user_properties if key == "gc_s")
    for start, end in (value for key, value in report.user_properties if key == "wall"):
      SPAN_BY_TEST[report.nodeid] = (name, start, end)
      first, last, busy, gc_s = WORKER_SPANS.get(name, (start, end, 0.0, 0.0))
      WORKER_SPANS[name] = (min(first, start), max(last, end), busy + end - start,
                            gc_s + collector)


def pytest_terminal_summary(terminalreporter):
  if not CPU_BY_TEST:
    return
  every = os.environ.get("HARNESS_TEST_CPU_CSV")     # every test's CPU seconds, for trimming
  if every:                                          # (and its span: idle cores show there)
    with open(every, "w", encoding="utf-8") as f:
      f.write("cpu_s,start_s,end_s,worker,test\n")
      for nodeid, seconds in sorted(CPU_BY_TEST.items(), key=lambda kv: -kv[1]):
        worker, start, end = SPAN_BY_TEST.get(nodeid, ("", SESSION_START, SESSION_START))
        f.write(f"{seconds:.1f},{start - SESSION_START:.1f},{end - SESSION_START:.1f},"
                f"{worker},{nodeid}\n")
  top = sorted(CPU_BY_TEST.items(), key=lambda kv: -kv[1])[:15]
  terminalreporter.write_sep("=", f"most CPU time: {len(top)} of {len(CPU_BY_TEST)} tests "
                                  f"({sum(CPU_BY_TEST.values()) / 60:.1f} CPU minutes in all)")
  for nodeid, seconds in top:
    terminalreporter.write_line(f"{seconds:7.1f}s cpu  {nodeid}")
  by_file = {}
  for nodeid, seconds in CPU_BY_TEST.items():
    path = nodeid.split("::", 1)[0]
    by_file[path] = by_file.get(path, 0.0) + seconds
  files = sorted(by_file.items(), key=lambda kv: -kv[1])[:len(LONG_FILES)]
  terminalreporter.write_sep("=", f"most CPU time by file ({len(files)} of {len(by_file)}; "
                                  "LONG_FILES in tests/conftest.py follows it)")
  for path, seconds in files:
    terminalreporter.write_line(f"{seconds:7.1f}s cpu  {path}")
  terminalreporter.write_sep("=", "per worker: first test starts, last ends (s from session "
                                  "start), seconds in tests, CPU s in its cyclic collector")
  for worker, (first, last, busy, collector) in sorted(WORKER_SPANS.items()):
    terminalreporter.write_line(f"{worker}: {first - SESSION_START:7.1f} "
                                f"{last - SESSION_START:7.1f} {busy:7.1f} {collector:7.1f}")


# Ending the session: after pytest has reported, leave without the interpreter's teardown. With
# the many tf.distribute graphs and strategies a full run builds (~4 GB of small allocations,
# ~90 runtime threads), TensorFlow's shutdown took over 10 minutes on a 2-core machine after
# every test had passed. The exit status is pytest's own.
def pytest_sessionfinish(session, exitstatus):
  session.config.harness_exitstatus = int(exitstatus)
  if not hasattr(session.config, "workerinput"):            # the controller's: end the servers
    for own in (OWN_JAX_CACHE, OWN_DATA_CACHE, OWN_FORK_SERVERS):
      if own:
        shutil.rmtree(own, ignore_errors=True)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
  status = getattr(config, "harness_exitstatus", None)
  if status is not None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
