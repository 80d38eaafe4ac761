"""The command line: run, list, describe, summarize, compare, ab, changepoints, check, report,
simulate, package, predict.

Every user error becomes one line `run_benchmark.py: error: ...` and exit code 2, raised
before any log or result file is opened.
"""
import argparse
import os
import sys
import tempfile

from harness import cadence, devices, errors, faults, mesh, registry, rules, supervise
from harness import cluster as cluster_lib
from harness import config as config_lib
from harness.errors import EXIT_USAGE, UsageError


class _Parser(argparse.ArgumentParser):
  def error(self, message):            # one line, exit 2, no usage dump
    raise UsageError(message)


def _positive_int(text):
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
  if value < 1:
    raise argparse.ArgumentTypeError(f"{value} is out of range; allowed: an integer >= 1")
  return value


def _int(text):
  try:
    return int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _fraction(text):
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
  if not 0 <= value < 1:
    raise argparse.ArgumentTypeError(f"{value} is out of range; allowed: 0 <= value < 1")
  return value


def _alpha(text):
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
  if not 0 < value < 1:
    raise argparse.ArgumentTypeError(f"{value} is out of range; allowed: 0 < alpha < 1")
  return value


def _add_workload_args(p, with_framework=True):
  p.add_argument("workload", help=f"one of: {', '.join(registry.names())}")
  if with_framework:
    p.add_argument("--framework", default="jax", choices=config_lib.FRAMEWORKS)
  p.add_argument("--preset", default="mini",
                 help="every workload has mini: scaled-down model on generated data (default); "
                      "reference: the MLPerf recipe on the real dataset; synthetic: throughput "
                      "on random data; tiny: the smallest config (tests); some have more "
                      "(`list` shows each workload's)")
  p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                 help="override a config value, e.g. train.global_batch_size=128 (repeatable)")
  p.add_argument("--cpu-devices", type=_positive_int, metavar="N",
                 help="simulate N devices on a CPU host (JAX: XLA host devices; TF: logical "
                      "CPU devices)")
  g = p.add_argument_group("distribution (config keys parallel.*)")
  g.add_argument("--mesh", metavar="AXES", help="mesh axis sizes by name (" +
                 ", ".join(mesh.AXES) + "), e.g. data=8, data=4,spatial=2 or data=2,model=4 "
                 "(default: all devices on data)")
  g.add_argument("--bn-group-size", type=_positive_int, metavar="K",
                 help="data replicas whose batch-norm statistics are pooled (default: all)")
  g.add_argument("--bn-group-samples", type=_positive_int, metavar="N",
                 help="or: batch-norm groups of N samples (replicas = N / per-replica batch)")
  g.add_argument("--weight-update-sharding", action="store_true",
                 help="shard optimizer state and the weight update over the data replicas")
  g.add_argument("--spatial-partitions", type=_positive_int, metavar="K",
                 help="split image height over K devices (the mesh's spatial axis)")
  g.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address (multi-host)")
  g.add_argument("--num-processes", type=_positive_int, metavar="P", help="processes in the run")
  g.add_argument("--process-id", type=_int, metavar="I", help="this process's index, 0..P-1")
  g.add_argument("--heartbeat-timeout", type=_positive_int, metavar="S",
                 help="a peer silent for S seconds ends every process of a multi-process run "
                      "(default 30)")


def build_parser():
  parser = _Parser(prog="run_benchmark.py",
                   description="MLPerf-style time-to-train benchmarks for TensorFlow and JAX.")
  sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

  p = sub.add_parser("run", help="train a workload to its quality target; append result rows",
                     description="Train WORKLOAD to its quality target under MLPerf compliance "
                                 "logging and append one row per run to the result CSV.")
  _add_workload_args(p)
  p.add_argument("--runs", type=_positive_int, default=1, help="number of runs (default 1)")
  p.add_argument("--seed", type=_int, help="seed of the first run (run i uses seed+i); "
                                           "default: random per run")
  p.add_argument("--steps", type=_positive_int,
                 help="cap on training steps (the step count of a synthetic run)")
  p.add_argument("--data-dir", help="dataset folder for the reference preset (per workload: "
                      "tensorflow-datasets dir for resnet50, MLPerf TFRecords for bert)")
  p.add_argument("--results", default="results/results.csv", help="result CSV to append to")
  p.add_argument("--log-dir", default="logs", help="folder for the MLPerf logs")
  p.add_argument("--system", default="", help="system name in the result rows "
                                              "(default: the host name)")
  p.add_argument("--echo-log", action="store_true", help="also print the :::MLLOG lines")
  p.add_argument("--tensorboard", metavar="DIR", help="write loss, lr, eval metric and "
                 "throughput scalars per chunk and eval block to DIR/<run_id>/ (TensorBoard "
                 "event files: tensorboard --logdir DIR)")
  p.add_argument("--supervise", action="store_true",
                 help="train in a child process whose parent records the run however the "
                      "child ends (killed, aborted by its framework); always on for a "
                      "multi-process run")

  p = sub.add_parser("list", help="workloads, frameworks and presets",
                     description="List the workloads, frameworks and presets that exist.")
  p.add_argument("--names", action="store_true",
                 help="only the workload names, one a line (for scripts: CI's runs)")

  p = sub.add_parser("describe", help="parameter count, FLOPs per example, batch, optimizer",
                     description="Build and compile WORKLOAD and print its parameter count, "
                                 "training FLOPs per example (from the compiled program), "
                                 "global batch size, optimizer and target.")
  _add_workload_args(p)

  p = sub.add_parser("summarize", help="MLPerf olympic scores of result CSVs or MLPerf folders",
                     description="Olympic scores (minutes) per system and benchmark, for result "
                                 "CSVs of this harness and MLPerf result folders alike.")
  p.add_argument("paths", nargs="+", metavar="PATH",
                 help="a result CSV, or an MLPerf results folder / submission package")
  p.add_argument("--csv", help="also write the summary to this CSV")
  p.add_argument("--ruleset", help="mlperf_logging ruleset of MLPerf folders, e.g. 2.1.0 "
                                   "(default: from a training_vX.Y folder on the path)")

  p = sub.add_parser(
      "compare", help="regression gate between two result CSVs (exit 1)",
      description="Compare two result CSVs per (workload, framework, preset); exit 1 on a "
                  "regression. Speed: the runs' throughput and time-to-train speed (samples to "
                  "target / time to train), an exact permutation test of Mann-Whitney U per "
                  "group, Holm-corrected over every test of the comparison so that ALPHA is the "
                  "false-alarm rate per comparison; a group regresses when its corrected test "
                  "rejects and the Hodges-Lehmann ratio new/base shows a loss of at least "
                  "THRESHOLD. Convergence: samples to target run by run where both sides ran "
                  "the same seeds (any difference fails: 'convergence changed', with the seeds), "
                  "else the RCP comparison of means. Prints per group the ratio with its "
                  "1-ALPHA interval, the p-values, and the smallest loss the runs could detect.")
  p.add_argument("baseline")
  p.add_argument("new")
  p.add_argument("--threshold", type=_fraction, default=0.03,
                 help="smallest speed loss worth failing for, even when significant "
                      "(default 0.03)")
  p.add_argument("--alpha", type=_alpha, default=0.05,
                 help="false-alarm rate of the whole comparison, all groups together "
                      "(default 0.05)")
  p.add_argument("--require-all", action="store_true",
                 help="also fail when NEW lacks a workload/framework/preset of BASELINE, or "
                      "has too few runs to test it")
  p.add_argument("--convergence-only", action="store_true",
                 help="gate convergence alone (speeds printed, not tested): for CSVs of two "
                      "machines, whose speeds measure the machines (`ab` gates speed on one)")

  p = sub.add_parser(
      "ab", help="same-machine A/B: commit REF against the working tree, ABBA rounds, then "
                 "compare (exit 1)",
      description="Run the baseline commit REF (a git worktree of it in a temporary folder, "
                  "removed after, with this Python) and the working tree as it is, on this "
                  "machine, one run at a time, interleaved per workload and framework in ABBA "
                  "rounds (A B B A A B ...: a drift of the machine falls on both sides alike); "
                  "round r of both sides uses seed SEED+r, so samples to target compare run by "
                  "run. Writes OUT/base.csv, OUT/new.csv, OUT/schedule.csv (the order run), the "
                  "logs and each run's output, then gates the two CSVs as `compare` does (exit 1 "
                  "on a regression, 128+N when signal N stopped it).")
  p.add_argument("ref", metavar="REF", help="the baseline: a commit, branch or tag (HEAD~1, "
                                            "origin/main, a sha)")
  p.add_argument("--workloads", metavar="W,W", help="comma-separated (default: every registered "
                                                    "one, as `list --names`)")
  p.add_argument("--frameworks", metavar="F,F", default="jax,tf",
                 help="comma-separated (default: jax,tf)")
  p.add_argument("--preset", default="mini", help="every run's preset (default mini)")
  p.add_argument("--rounds", type=_positive_int, metavar="N",
                 help="runs per side of each workload and framework (default: the workload's "
                      "ruleset run count, rules/<benchmark>.yaml runs_required, or the fewest "
                      "that can reject among the groups at --alpha, if more)")
  p.add_argument("--seed", type=_int, default=100,
                 help="seed of round 0 on both sides (default 100, the committed baseline's)")
  p.add_argument("--steps", type=_positive_int, help="cap on training steps, as run's")
  p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                 help="a config override for every run, as run's (repeatable)")
  p.add_argument("--cpu-devices", type=_positive_int, metavar="N", help="as run's")
  p.add_argument("--mesh", metavar="AXES", help="as run's")
  p.add_argument("--data-dir", help="as run's (the reference preset)")
  p.add_argument("--system", help="system name in both sides' rows, as run's (default: the "
                                  "host name)")
  p.add_argument("--out", metavar="DIR", help="a new folder for the CSVs, logs and outputs "
                 "(default results/ab/<REF short sha>-<UTC time>)")
  p.add_argument("--threshold", type=_fraction, default=0.03, help="as compare's (default 0.03)")
  p.add_argument("--alpha", type=_alpha, default=0.05, help="as compare's (default 0.05)")
  p.add_argument("--require-all", action="store_true", help="as compare's")

  p = sub.add_parser("report", help="HTML page with plots from result CSVs",
                     description="Render result CSVs (and the logs their rows point to) into "
                                 "one self-contained HTML page: olympic scores, eval curves with "
                                 "the target, time-to-train per run, history across commits "
                                 "with its change points (as `changepoints`), and with "
                                 "--baseline a baseline-vs-new comparison; with --bench the "
                                 "peer-comparison table of bench/all.py.")
  p.add_argument("csvs", nargs="*", metavar="CSV", help="result CSVs (the last is 'new')")
  p.add_argument("--out", default="report", help="output folder (writes index.html)")
  p.add_argument("--baseline", help="baseline result CSV to compare the last CSV against")
  p.add_argument("--bench", metavar="FILE",
                 help="a bench/all.py table (CSV): ours against the peers, drawn and listed")
  p.add_argument("--threshold", type=_fraction, default=0.03,
                 help="smallest speed loss the comparison fails for, as compare's (default "
                      "0.03)")

  p = sub.add_parser(
      "changepoints", help="change points of a result history across commits",
      description="Find where a history's throughput, time to train and samples to target "
                  "changed, and at which commit: E-divisive means (Matteson & James 2014, as "
                  "MongoDB's and Apache Otava's performance CI), per (system, workload, "
                  "framework, preset) and measure, one point per commit (the median of its "
                  "successful runs, commits in the order they first appear), a change needing "
                  "3 commits on each side. Each series is tested at ALPHA / (number of series), "
                  "so ALPHA bounds the chance that a history without a change shows any.")
  p.add_argument("csvs", nargs="+", metavar="CSV", help="result CSVs (rows with git_commit)")
  p.add_argument("--alpha", type=_alpha, default=0.05,
                 help="false change points of the whole analysis (default 0.05)")

  p = sub.add_parser("check", help="official MLPerf checks of a log or a submission (exit 0/1)",
                     description="A log: mlperf_logging's compliance checker with the ruleset "
                                 "pinned in rules/ for its benchmark. A submission or results "
                                 "folder: its package_checker with the round's ruleset (from a "
                                 "training_vX.Y folder or --ruleset), including the RCP check "
                                 "of closed-division benchmarks; one verdict per file.")
  p.add_argument("log", metavar="PATH", help="an MLPerf log, or a submission / results folder")
  p.add_argument("--ruleset", help="override the ruleset, e.g. 4.0.0")

  p = sub.add_parser("package", help="an MLPerf submission folder from result CSV rows",
                     description="Write an MLPerf training submission folder (results/<system>/"
                                 "<benchmark>/result_<i>.txt and systems/<system>.json) from "
                                 "the latest runs of result CSVs, the round's run count per "
                                 "benchmark, then run the official package checker on it.")
  p.add_argument("csvs", nargs="+", metavar="CSV", help="result CSVs of `run`")
  p.add_argument("--submitter", required=True, help="the submitting organization (a folder)")
  p.add_argument("--system", required=True,
                 help="the system's name (a folder; -jax / -tf appended when both frameworks)")
  p.add_argument("--out", required=True, help="a new folder for the package")
  p.add_argument("--division", choices=["closed", "open"],
                 help="checked against what the runs' logs say (default: theirs)")
  p.add_argument("--system-json", help="a JSON object of system-description fields to fill "
                                       "in (processor, memory, interconnect, ...)")
  p.add_argument("--force", action="store_true", help="write into an existing --out")

  from harness.commsim import command as simulate_command
  simulate_command.add_parser(sub)
  from harness import predict_command
  predict_command.add_parser(sub)
  return parser


# ----------------------------------------------------------------------------- commands

_PARALLEL_FLAGS = {"mesh": "mesh", "bn_group_size": "bn_group_size",
                   "bn_group_samples": "bn_group_samples",
                   "spatial_partitions": "spatial_partitions", "coordinator": "coordinator",
                   "num_processes": "num_processes", "process_id": "process_id",
                   "heartbeat_timeout": "heartbeat_timeout_s"}


_CLUSTER_FLAGS = ("coordinator", "num_processes", "process_id")


def _cluster(args) -> cluster_lib.Cluster:
  """How the processes find each other: the multi-host flags when any is given, else the
  environment (an srun step, TF_CONFIG, a Kubernetes index: harness/cluster.py)."""
  if any(getattr(args, flag) is not None for flag in _CLUSTER_FLAGS):
    return cluster_lib.Cluster("flags", args.num_processes or 1, args.process_id or 0,
                               args.coordinator or "", "--coordinator/--num-processes/"
                               "--process-id; the environment is not read")
  found = cluster_lib.detect()
  if found.source == "kubernetes" and args.framework == "tf":
    raise UsageError(f"{cluster_lib.K8S_INDEX} without TF_CONFIG: TensorFlow finds its "
                     "workers by TF_CONFIG; allowed: a TF_CONFIG per pod "
                     "(docs/cluster/jobset.yaml, the TF job)")
  return found


def _workload_config(args):
  """The run's config (preset, --set, flags, the cluster from flags or environment, derived
  values) and the one mesh fit check, all before any framework is imported."""
  spec = registry.get(args.workload)
  overrides = list(args.overrides)
  for flag, key in _PARALLEL_FLAGS.items():
    if getattr(args, flag) is not None:
      overrides.append(f"parallel.{key}={getattr(args, flag)}")
  if args.weight_update_sharding:
    overrides.append("parallel.weight_update_sharding=true")
  found = args.cluster = _cluster(args)
  if found.source not in ("single", "flags"):
    overrides += [f"parallel.num_processes={found.num_processes}",
                  f"parallel.process_id={found.process_id}"]
    overrides += [f"parallel.coordinator={found.coordinator}"] if found.coordinator else []
  if found.source != "single":
    overrides.append(f"parallel.cluster={found.source}")
  cfg = spec.configure(args.preset, overrides)
  mesh.check_fits(cfg.parallel, framework=args.framework, workload=spec.name,
                  workload_axes=spec.mesh_axes, global_batch_size=cfg.train.global_batch_size,
                  dims=spec.split_dims(cfg), devices=args.cpu_devices,
                  layers=spec.pipeline_layers(cfg) if spec.pipeline_layers else None)
  try:
    spec.check_framework(cfg, args.framework)
  except ValueError as e:
    raise UsageError(str(e)) from None
  # an optimizer config may say its TF update has no weight-update-sharding rule
  if (args.framework == "tf" and cfg.parallel.weight_update_sharding
      and not getattr(cfg.optimizer, "tf_weight_update_sharding", True)):
    raise UsageError(f"--weight-update-sharding: the tf update of optimizer "
                     f"{cfg.optimizer.name!r} has no sharded rule; allowed: --framework jax, "
                     "or tf without --weight-update-sharding")
  return spec, cfg


def _check_data_dir(spec, cfg, args):
  if args.preset not in spec.needs_data_dir:
    return
  if not args.data_dir:
    raise UsageError(f"--data-dir is required for --preset {args.preset}; allowed: "
                     f"{spec.data_dir_contents}")
  if not os.path.isdir(args.data_dir) or not os.listdir(args.data_dir):
    raise UsageError(f"--data-dir {args.data_dir!r} is missing or empty; allowed: "
                     f"{spec.data_dir_contents}")
  missing = spec.missing_data(cfg, args.data_dir)
  if missing:
    raise UsageError(f"--data-dir {args.data_dir!r} lacks {', '.join(missing)}; expected: "
                     f"{spec.data_dir_contents}")


def _check_tensorboard_dir(path):
  """The event files' folder must exist or be creatable: its nearest existing ancestor a
  writable folder (checked, nothing created: a bad path fails before the run, not after)."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise UsageError(f"--tensorboard {path!r} is a file; allowed: a folder")
  probe = os.path.abspath(path)
  while not os.path.exists(probe):
    probe = os.path.dirname(probe)
  # os.access is not enough: /proc says root may write anywhere in it. A folder made and
  # removed again in the nearest existing one is the question the writer will ask.
  writable = os.path.isdir(probe)
  if writable:
    try:
      tempfile.TemporaryDirectory(dir=probe, prefix=".harness-probe-").cleanup()
    except OSError:
      writable = False
  if not writable:
    raise UsageError(f"--tensorboard {path!r} cannot be created: {probe!r} is not a writable "
                     "folder; allowed: a folder path under a writable folder")


def cmd_run(args):
  from harness import driver, results
  spec, cfg = _workload_config(args)
  _check_data_dir(spec, cfg, args)
  bench_rules = rules.load(spec.mlperf_benchmark)
  if args.preset == "reference" and cfg.train.target != bench_rules.target:
    raise UsageError(f"train.target={cfg.train.target} differs from the MLPerf target "
                     f"{bench_rules.target} in rules/{spec.mlperf_benchmark}.yaml")
  if cfg.parallel.num_processes > 1 and args.seed is None:
    raise UsageError("a multi-host run needs --seed (every process must build the same "
                     "initial weights); allowed: the same integer on every process")
  if args.tensorboard:
    _check_tensorboard_dir(args.tensorboard)
  existed = os.path.exists(args.results)
  results.check_writable(args.results)   # last check: it creates the file (header comes later)
  if (args.supervise or cfg.parallel.num_processes > 1) and not supervise.is_child():
    return supervise.run(args.argv)   # the child prints the cluster line and runs
  if args.cluster.source != "single":
    print(args.cluster.line(), flush=True)       # the run's first line: how peers were found
  try:
    devices.prepare(args.framework, args.cpu_devices)
    opts = driver.RunOptions(primary=cfg.parallel.process_id == 0, framework=args.framework,
                             preset=args.preset, runs=args.runs, seed=args.seed,
                             steps=args.steps, data_dir=args.data_dir,
                             results_path=args.results, log_dir=args.log_dir, system=args.system,
                             echo_log=args.echo_log, tensorboard=args.tensorboard,
                             progress_path=os.environ.get(faults.PROGRESS_ENV),
                             defer_errors=supervise.is_child()
                             and cfg.parallel.num_processes > 1)
    from harness.workload import RunContext
    def make_trainer(seed):
      ctx = RunContext(seed=seed, preset=args.preset, data_dir=args.data_dir)
      try:
        return spec.make_trainer(args.framework, cfg, ctx)
      except ValueError as e:                        # an impossible config for these devices
        raise UsageError(str(e)) from None
    try:
      with faults.SignalWatch() as opts.signals:
        rows = driver.run_all(spec, cfg, opts, make_trainer)
    except driver.Deferred:            # the supervisor writes this run's row (supervise.py)
      return errors.EXIT_ABORTED
    except faults.Interrupted as e:    # a signal before the run's log opened: nothing to record
      print(f"run_benchmark.py: {e.reason} before the run began; nothing recorded",
            file=sys.stderr, flush=True)
      return faults.signal_exit_status(e.signum)
    except Exception as e:  # pylint: disable=broad-except
      line = errors.explained(e)       # e.g. a corrupt data file, met building the pipeline
      if line is None:
        raise
      raise UsageError(line) from None
  except UsageError:        # a config the trainer refused before any run: leave no empty file
    if not existed and os.path.exists(args.results) and os.path.getsize(args.results) == 0:
      os.remove(args.results)
    raise
  return rows.exit_status()


def cmd_list(args):
  if args.names:
    print("\n".join(registry.names()))
    return 0
  print("frameworks: " + ", ".join(config_lib.FRAMEWORKS))
  print("presets:    " + ", ".join(config_lib.PRESETS) + " (every workload; some have more)")
  print("workloads:")
  for name in registry.names():
    spec = registry.get(name)
    target = rules.load(spec.mlperf_benchmark).target
    print(f"  {name:12s} {spec.title} (MLPerf '{spec.mlperf_benchmark}', {spec.metric_name} "
          f"{'>=' if spec.metric.higher_is_better else '<='} {target:g} {spec.metric.units}); "
          f"mesh axes: {', '.join(spec.mesh_axes)}; frameworks: {', '.join(spec.trainer_modules)}; "
          f"presets: {', '.join(spec.presets)}")
  return 0


def cmd_describe(args):
  spec, cfg = _workload_config(args)
  devices.prepare(args.framework, args.cpu_devices)
  import copy
  from harness.workload import RunContext
  gbs = cfg.train.global_batch_size
  # FLOPs per example do not depend on the batch: compile a small batch to keep this quick.
  # A layout on a model axis or a pipeline keeps the preset's batch: its activation bytes per
  # device are what it shows (and a mesh larger than the machine is described from shapes,
  # uncompiled).
  small = copy.deepcopy(cfg)
  # described in this one process: a multi-process run's peers are not started by describe
  small.parallel.num_processes, small.parallel.process_id = 1, 0
  small.parallel.coordinator = small.parallel.cluster = ""
  axes, batch = cfg.parallel.axes(), args.cpu_devices or min(gbs, 8)   # divisible by 1, 2, 4, 8
  # So does one on an expert axis: its routing groups are the batch shards' tokens.
  if axes["model"] == 1 and axes["stage"] == 1 and axes["expert"] == 1 and (
      cfg.parallel.microbatches == 1 and batch % max(axes["data"], 1) == 0):
    small.train.global_batch_size = small.data.eval_batch_size = batch
  if hasattr(small.data, "init_checkpoint"):        # describe builds the model, reads no data
    small.data.init_checkpoint = ""
  try:
    trainer = spec.make_trainer(args.framework, small,
                                RunContext(seed=0, preset=args.preset, describing=True))
  except ValueError as e:
    raise UsageError(str(e)) from None
  info = trainer.describe()               # builds (and compiles, where it must) what it needs
  opt = cfg.optimizer
  print(f"workload:                 {spec.name} ({spec.title}), {args.framework}, "
        f"preset {args.preset}")
  print(f"parameters:               {info.parameters:,}")
  flops = info.train_flops_per_example
  print("train FLOPs per example:  " + (f"{flops:.4g}" if flops is not None else
                                        info.flops_missing))
  if info.model_flops_per_example is not None:     # TF: 3 x forward matmuls and convs
    print(f"model FLOPs per example:  {info.model_flops_per_example:.4g} "
          "(3 x the forward matmuls and convs)")
  print("device peak:              " + _peak_line(trainer, cfg.train.precision,
                                                info.model_flops_per_example or flops))
  print(f"global batch size:        {gbs}")
  print(f"{args.cluster.line().replace('cluster: ', 'cluster:                  ', 1)}")
  print(f"optimizer:                {opt.summary()}")
  print(f"precision:                {cfg.train.precision}")
  metric = spec.metric
  print(f"target:                   {metric.name} {'>=' if metric.higher_is_better else '<='} "
        f"{cfg.train.target:g} ({metric.units}; logged as eval_accuracy "
        f"{metric.logged(cfg.train.target):g})")
  print(f"eval schedule:            {cadence.describe(cfg.train)}")
  print(f"RCPs:                     {_rcp_line(spec.mlperf_benchmark, gbs, args.preset)}")
  derived = {k: v for k, v in config_lib.flatten(cfg).items()
             if k in _derived_keys(spec, args.preset, args.overrides)}
  if derived:
    print("derived after --set:      " + ", ".join(f"{k}={v:,}" if isinstance(v, int) else
                                                   f"{k}={v}" for k, v in derived.items()))
  for label, text in spec.describe_lines(cfg, info.parameters):
    print(f"{label + ':':<26}{text}")
  sequence = (" (sequence parallel: the residual stream split over model along the sequence)"
              if cfg.parallel.sequence_parallel else "")
  print(f"mesh:                     {trainer.mesh_description}{sequence}")
  _print_layout(info, small.train.global_batch_size)
  return 0


def _peak_line(trainer, precision, flops_per_example) -> str:
  """The devices' peak (harness/devices.py) and the samples/s that would be 100% MFU: a run's
  MFU is its samples/s over that figure."""
  peak = devices.peak_flops(trainer.device_kind, precision)
  if peak is None:
    return (f"not in the table for {trainer.device_kind!r} at {precision} (a run's MFU is "
            "left blank)")
  line = (f"{peak / 1e12:g} TFLOP/s {precision} ({trainer.device_kind}) x "
          f"{trainer.num_devices} device(s)")
  if flops_per_example:
    line += (f"; 100% MFU = "
             f"{peak * trainer.num_devices / flops_per_example:,.0f} samples/s")
  return line


def _print_layout(info, batch):
  """describe's per-device bytes, the parameters a model axis splits or leaves whole, and the
  step's collectives (JAX: from the compiled HLO, by the mesh axes they span)."""
  whole = info.parameter_bytes_without_stages
  print(f"parameters / device:      {info.parameter_bytes_per_device:,} bytes"
        + (f" (the most a stage device holds; without stages: {whole:,})" if whole else ""))
  print(f"optimizer state / device: {info.optimizer_state_bytes_per_device:,} bytes")
  if info.activation_bytes_per_device is not None:
    print(f"activations / device:     {info.activation_bytes_per_device:,} bytes (the compiled "
          f"step's temporaries at global batch {batch})")
  layout = info.layout or {}
  if layout.get("split"):
    split = layout["split"]
    print(f"split on non-data axes:   {len(split)} tensors, e.g. " + ", ".join(
        f"{path} {tuple(a or '-' for a in axes)}" for path, axes in list(split.items())[:2]))
  if layout.get("whole"):
    print("whole (axis not dividing): " + ", ".join(
        f"{path} ({'/'.join(dims)})" for path, dims in layout["whole"].items()))
  if info.collectives_by_axis is not None:
    found = info.collectives_by_axis
    print("collectives in the step:  " + ("; ".join(
        f"{kind} over {axes}: {tensors} tensors in {ops} ops, {nbytes:,} bytes"
        for (kind, axes), (ops, tensors, nbytes) in sorted(found.items())) or "none"))
  elif info.collectives_in_train_step is not None:
    kinds, nbytes = info.collectives_in_train_step, info.collective_bytes_in_train_step
    print("collectives in the step:  " + (", ".join(
        f"{k} {v}" + (f" ({nbytes[k]:,} bytes)" if nbytes and nbytes.get(k) else "")
        for k, v in sorted(kinds.items())) or "none"))
  elif info.flops_missing.startswith("not compiled"):
    print("collectives in the step:  not compiled: the mesh has more devices than this machine")
  for kind, (sent, true) in (info.emulated_collectives or {}).items():
    print(f"{kind}: built from an all-reduce (tf.distribute has no all-to-all): {sent:,} "
          f"bytes a replica sends a step, where an all-to-all sends {true:,} "
          f"({sent / max(true, 1):g}x; docs/platform.md)")
  if info.pipeline is not None:
    _print_pipeline(info.pipeline, batch)


def _print_pipeline(p, batch):
  """describe's GPipe lines: the cut, the bubble, memory with and without remat, permutes."""
  k, m = p.stages, p.microbatches
  print(f"pipeline:                 {k} stages x {m} micro-batches, {p.iterations} "
        f"iterations a step, bubble (K-1)/(M+K-1) = {p.bubble_fraction:.4f}")
  for i, stage in enumerate(p.cut):
    names = stage["layers"]
    shown = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}"
    print(f"  stage {i}:                {len(names)} layers ({shown}), "
          f"{stage['parameters']:,} parameters")
  print(f"  activations / device:   {p.activation_bytes_remat:,} bytes with remat, "
        f"{p.activation_bytes_no_remat:,} without ({p.activation_source} at global "
        f"batch {batch}; this run: remat={'on' if p.remat else 'off'})")
  print(f"  stage shifts / device:  {p.permute_bytes_per_step:,} bytes a step "
        f"({p.shift_source}, forward and backward)")


def _rcp_line(benchmark, global_batch_size, preset="reference"):
  """Which batch sizes mlperf_logging has reference convergence points for (closed division
  runs are checked against them), at the ruleset rules/ pins."""
  from harness import package_check
  ruleset = rules.load(benchmark).ruleset
  sizes = package_check.rcp_batch_sizes(benchmark, ruleset)
  if not sizes:
    return f"none for {benchmark} in mlperf_logging {ruleset} (no RCP check)"
  where = ("this batch size has one" if global_batch_size in sizes else
           "this batch size is interpolated" if sizes[0] < global_batch_size < sizes[-1] else
           "this batch size is outside them")
  line = f"{benchmark} {ruleset} at batch sizes {', '.join(map(str, sizes))} ({where})"
  return line + ("" if preset == "reference" else
                 f"; a {preset} run is open division: not RCP-checked")


def _derived_keys(spec, preset, overrides):
  """The keys spec.derive fills for this preset: those the preset leaves unset and no --set
  gives."""
  if spec.derive is None:
    return set()
  before = config_lib.flatten(spec.config(preset))
  cfg = spec.config(preset)
  spec.derive(cfg)
  given = {item.partition("=")[0].strip() for item in overrides}
  return {k for k, v in config_lib.flatten(cfg).items() if v != before[k] and k not in given}


def cmd_summarize(args):
  from harness import summarize
  table = summarize.summarize(args.paths, args.ruleset)
  if args.csv:
    from harness.results import check_writable
    check_writable(args.csv, require_our_header=False)
    table.to_csv(args.csv, index=False)
  import pandas as pd
  with pd.option_context("display.max_rows", None, "display.width", 200,
                         "display.max_colwidth", 60):
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
  for line in table.attrs.get("skipped", []):
    print(line)
  return 0


def cmd_compare(args):
  from harness import compare
  return _gate(compare.compare(args.baseline, args.new, args.threshold, args.alpha,
                               speed=not args.convergence_only), args)


def _gate(table, args):
  """compare's table and verdict printed; the exit status (1 on a regression)."""
  from harness import compare
  import pandas as pd
  with pd.option_context("display.width", 250, "display.max_colwidth", 200,
                         "display.max_rows", None, "display.max_columns", None):
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
  regressed = compare.is_regression(table, args.require_all)
  print(f"verdict: {'REGRESSION' if regressed else 'no regression'} (alpha {args.alpha:g} over "
        f"{table.attrs['tests']} tests, Holm-corrected; " + (
            f"speed threshold {args.threshold:.0%})" if table.attrs["speed"] else
            "convergence only: speed not gated)"))
  return 1 if regressed else 0


def _listed(text, allowed, flag, what):
  """A comma-separated list of names, each one of `allowed` (UsageError naming the first that
  is not), in the order given, without repeats."""
  names = [n.strip() for n in text.split(",") if n.strip()]
  if not names:
    raise UsageError(f"{flag} {text!r} names no {what}; allowed: {', '.join(allowed)}")
  for name in names:
    if name not in allowed:
      raise UsageError(f"{flag}: unknown {what} {name!r}; allowed: {', '.join(allowed)}")
  return list(dict.fromkeys(names))


def ab_groups(args):
  """`ab`'s groups [(workload, framework)], rounds {workload: runs per side} and the arguments
  every run gets, each group's config checked as its `run` would build it (UsageError)."""
  workloads = (_listed(args.workloads, registry.names(), "--workloads", "workload")
               if args.workloads is not None else registry.names())
  frameworks = _listed(args.frameworks, list(config_lib.FRAMEWORKS), "--frameworks",
                       "framework")
  run_args = ["--preset", args.preset]
  for item in args.overrides:
    run_args += ["--set", item]
  for flag, value in (("--steps", args.steps), ("--cpu-devices", args.cpu_devices),
                      ("--mesh", args.mesh), ("--system", args.system),
                      ("--data-dir", args.data_dir and os.path.abspath(args.data_dir))):
    if value is not None:
      run_args += [flag, str(value)]
  groups = [(w, f) for w in workloads for f in frameworks]
  parser = build_parser()
  for workload, framework in groups:       # the new side's configs, as its runs will build them
    run = parser.parse_args(["run", workload, "--framework", framework, *run_args])
    spec, cfg = _workload_config(run)
    _check_data_dir(spec, cfg, run)
  # default: the ruleset's run count, or more where the family of groups needs more for a
  # speed test to reach its corrected level (compare.runs_to_test)
  from harness import compare  # pylint: disable=import-outside-toplevel
  least = compare.runs_to_test(len(groups), args.alpha)
  rounds = {w: args.rounds or max(least, rules.load(registry.get(w).mlperf_benchmark)
                                  .runs_required) for w in workloads}
  return groups, rounds, run_args


def cmd_ab(args):
  """Every check first (names, each group's config, REF, OUT), then the runs, then compare's
  gate."""
  import datetime
  from harness import ab, compare
  groups, rounds, run_args = ab_groups(args)
  sha, short = ab.resolve(args.ref)
  out = args.out or os.path.join("results", "ab", short + "-" + datetime.datetime.now(
      datetime.timezone.utc).strftime("%Y%m%dT%H%M%S"))
  made = ab.check_out_dir(out)
  plan = ab.Plan(args.ref, sha, short, groups, rounds, args.seed, out, run_args)
  total = 2 * sum(rounds[w] for w, _ in groups)
  print(f"A/B in {out}: A = REF {args.ref} ({short}), B = {ab.working_tree()}; {total} runs "
        f"in ABBA rounds, seeds from {args.seed}", flush=True)
  with ab.stop_on_signals():
    try:
      lost = ab.run(plan, echo=lambda line: print(line, flush=True))
    except UsageError:
      if made and not os.path.exists(os.path.join(out, "schedule.csv")):   # no run started
        import shutil
        shutil.rmtree(out, ignore_errors=True)
      raise
    except ab.Stopped as e:
      print(f"run_benchmark.py: {e} received: the A/B stopped, its worktree removed; the rows "
            f"so far are in {plan.base_csv} and {plan.new_csv}", file=sys.stderr)
      return faults.signal_exit_status(e.signum)
  if lost:
    print(f"{lost} run(s) ended without a row (their output: {out}/output/)")
  if not (os.path.exists(plan.base_csv) and os.path.exists(plan.new_csv)):
    print(f"no rows to compare: a side recorded none (outputs in {out}/output/)")
    return errors.EXIT_ABORTED
  return _gate(compare.compare(plan.base_csv, plan.new_csv, args.threshold, args.alpha), args)


def cmd_changepoints(args):
  from harness import changepoints, results
  import pandas as pd
  frame = pd.concat([results.read_csv(p) for p in args.csvs], ignore_index=True)
  analysis = changepoints.analyse(frame, args.alpha)
  print(changepoints.describe(analysis))
  if analysis.changes.empty:
    print("no change point found")
    return 0
  shown = analysis.changes.assign(first_seen=analysis.changes["first_seen"].dt.strftime(
      "%Y-%m-%d %H:%M"), change=analysis.changes["change"].map(lambda v: f"{v:+.1%}"))
  with pd.option_context("display.width", 250, "display.max_rows", None,
                         "display.max_columns", None):
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.6g}"))
  return 0


def cmd_report(args):
  from harness import report
  path = report.write(args.csvs, args.out, args.baseline, args.threshold, args.bench)
  print(f"report written to {path}")
  return 0


def cmd_check(args):
  if os.path.isdir(args.log):
    from harness import package_check
    passed, lines = package_check.check_package(args.log, args.ruleset)
    print("\n".join(lines))
    return 0 if passed else 1
  from harness import compliance
  passed, report = compliance.check(args.log, args.ruleset)
  print(report)
  print(f"compliance check: {'PASSED' if passed else 'FAILED'} ({args.log})")
  return 0 if passed else 1


def cmd_package(args):
  from harness import package, package_check
  org, ruleset, lines = package.build(args.csvs, args.submitter, args.system, args.out,
                                      args.division, args.system_json, args.force)
  print(f"wrote {org}:")
  print("\n".join(f"  {line}" for line in lines))
  passed, report = package_check.check_package(org, ruleset)
  print("\n".join(report))
  print(f"next: run_benchmark.py summarize {os.path.dirname(org)}")
  return 0 if passed else 1


def cmd_simulate(args):
  from harness.commsim import command
  return command.run(args)


def cmd_predict(args):
  from harness import predict_command
  return predict_command.run(args)


COMMANDS = {"run": cmd_run, "list": cmd_list, "describe": cmd_describe,
            "summarize": cmd_summarize, "compare": cmd_compare, "check": cmd_check,
            "report": cmd_report, "simulate": cmd_simulate, "package": cmd_package,
            "predict": cmd_predict, "ab": cmd_ab, "changepoints": cmd_changepoints}


def main(argv=None) -> int:
  parser = build_parser()
  try:
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)   # a supervised child's
    if args.command is None:
      raise UsageError(f"a command is required; choose one of: {', '.join(COMMANDS)}")
    return COMMANDS[args.command](args)
  except UsageError as e:
    print(f"run_benchmark.py: error: {e}", file=sys.stderr)
    return EXIT_USAGE
