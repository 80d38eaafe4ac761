"""The timed loop (docs/architecture.md): owns time, MLPerf logging, eval cadence and stopping.

The driver never touches tensors: it calls a Trainer's init/train/evaluate and logs around
them. Compilation happens inside init (before run_start); the trainer reads no data before
its first train() call, which is after run_start.
"""
import dataclasses
import datetime
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid

from harness import cadence, devices, errors, faults, results
from harness import config as config_lib
from harness.workload import is_synthetic
from harness.mllog import RunLog, constants as C



SYNTHETIC_WARMUP_STEPS = 2        # a synthetic run's untimed steps before its timed ones


@dataclasses.dataclass
class RunOptions:
  framework: str
  preset: str
  runs: int = 1
  seed: int | None = None          # None: a fresh random seed per run (logged)
  steps: int | None = None         # caps training steps (the budget for synthetic runs)
  data_dir: str | None = None
  results_path: str = "results/results.csv"
  log_dir: str = "logs"
  system: str = ""
  echo_log: bool = False
  primary: bool = True             # multi-host: only process 0 writes the log and the row
  tensorboard: str | None = None   # scalars per chunk and block to DIR/<run_id>/ (event files)
  signals: faults.SignalWatch | None = None   # the command's signal handlers (None: none)
  progress_path: str | None = None  # a supervised run's state for its supervisor (supervise.py)
  # A supervised multi-process run leaves the row of a run that an error ends to its
  # supervisor, which names the cause the framework reports only after the error (a lost peer)
  defer_errors: bool = False


class Deferred(Exception):
  """A run ended by an error whose row the supervisor writes (RunOptions.defer_errors)."""


def _git_commit():
  try:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=os.path.dirname(os.path.abspath(__file__)),
                          timeout=10).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return ""


def _versions():
  from importlib import metadata
  parts = [f"python={platform.python_version()}"]
  for package in ("tensorflow", "jax", "flax", "optax", "keras"):
    try:
      parts.append(f"{package}={metadata.version(package)}")
    except metadata.PackageNotFoundError:
      pass
  return ";".join(parts)


def division(spec, preset: str, cfg) -> str:
  """The MLPerf division a run's log declares: closed for the reference preset with the
  reference model (tunable hyperparameters, data and layout may differ: the closed compliance
  rules check the logged ones), open for anything else: a mini preset, or a changed model
  (expert layers, other sizes)."""
  if preset != "reference":
    return C.OPEN
  reference = spec.configure("reference", [])
  return C.CLOSED if config_lib.flatten(reference.model) == config_lib.flatten(cfg.model) \
      else C.OPEN


def _extra(metrics) -> str:
  """A trainer's own figures for the progress line (an MoE model's router: 'router z ...')."""
  return f"{metrics['progress']} | " if metrics.get("progress") else ""


class Run:
  """One timed run: logs, stops at the target or the budget, and yields a ResultRow."""

  def __init__(self, spec, cfg, opts: RunOptions, index: int, trainer, seed: int):
    self.spec, self.cfg, self.opts = spec, cfg, opts
    self.trainer, self.seed = trainer, seed
    if opts.signals:                  # the trainer's loops stop at a step boundary (faults.py)
      trainer.stop_check = opts.signals.check
      opts.signals.reclaim()          # from the framework's preemption notifier, if it took them
    stamp = datetime.datetime.now(datetime.timezone.utc)
    self.started_at = stamp.isoformat(timespec="seconds")
    self.run_id = (f"{spec.name}_{opts.framework}_{opts.preset}_"
                   f"{stamp.strftime('%Y%m%dT%H%M%S')}_{index}_{uuid.uuid4().hex[:6]}")
    if opts.primary:
      os.makedirs(opts.log_dir, exist_ok=True)
    self.log_path = os.path.join(opts.log_dir, self.run_id + ".log")

  def _print(self, message):
    print(f"[{self.run_id}] {message}", flush=True)

  def execute(self) -> results.ResultRow:
    log = RunLog(self.log_path if self.opts.primary else os.devnull, echo=self.opts.echo_log)
    self.tb = None
    if self.opts.tensorboard and self.opts.primary:   # tensorboardX: only with --tensorboard
      from harness.tensorboard import ScalarWriter
      self.tb = ScalarWriter(os.path.join(self.opts.tensorboard, self.run_id))
    try:
      return self._execute(log)
    finally:
      log.close()
      if self.tb:
        self.tb.close()

  def _log_init_keys(self, log):
    cfg, trainer = self.cfg, self.trainer
    log.event(C.SUBMISSION_BENCHMARK, self.spec.mlperf_benchmark)
    log.event(C.SUBMISSION_DIVISION, division(self.spec, self.opts.preset, cfg))
    log.event(C.SUBMISSION_ORG, "mlperf-tf-jax-harness")
    log.event(C.SUBMISSION_PLATFORM, f"{trainer.num_devices}x{trainer.device_kind}")
    log.event(C.SUBMISSION_STATUS, "research")
    log.event(C.SEED, self.seed)
    unit = self.spec.sample_unit(cfg) if self.spec.sample_unit else None
    log.event(C.GLOBAL_BATCH_SIZE, cfg.train.global_batch_size,
              **({"samples": unit} if unit else {}))
    log.event(C.GRADIENT_ACCUMULATION_STEPS, 1)
    log.event(C.TRAIN_SAMPLES, trainer.train_examples)
    log.event(C.EVAL_SAMPLES, trainer.eval_examples)
    if self.spec.bn_span:
      log.event(C.MODEL_BN_SPAN, self.spec.bn_span(cfg, trainer.data_replicas))
    for key, value in self.spec.mllog_hyperparameters(cfg, trainer.train_examples).items():
      value, metadata = value if isinstance(value, tuple) else (value, {})
      log.event(key, value, **metadata)

  def _check_signals(self):
    if self.opts.signals:
      self.opts.signals.check()

  def _execute(self, log) -> results.ResultRow:
    cfg, trainer, opts = self.cfg, self.trainer, self.opts
    gbs = cfg.train.global_batch_size
    synthetic = is_synthetic(cfg)
    self.per_epoch = per_epoch = cadence.steps_per_epoch(trainer.train_examples, gbs)
    max_steps = cadence.budget_steps(cfg.train, per_epoch)
    if synthetic:
      max_steps = opts.steps or cfg.train.synthetic_steps
    elif opts.steps:
      max_steps = min(max_steps, opts.steps)

    self.state = row = dict(status=C.ABORTED, abort_reason="", time_to_train_s=None,
                            epochs=None, samples=None, metric=None, throughput=None, init_s=0.0,
                            flops=None, steps=0)
    self.log, self.run_start, self.closed, self.result = log, None, False, None
    self.row_saved, self.interrupted_by = True, None
    self._close_lock = threading.Lock()
    if opts.signals:
      opts.signals.on_second = self._close_at_once
    log.event(C.CACHE_CLEAR, True)
    init_start = time.time()
    log.start(C.INIT_START)
    self._progress()
    deferred = False
    try:
      self._log_init_keys(log)
      trainer.init()
      row["flops"] = trainer.describe(pipeline=False).train_flops_per_example
      self._check_signals()
      log.end(C.INIT_STOP)
      self.run_start = time.time()
      row["init_s"] = self.run_start - init_start
      log.start(C.RUN_START, time_ms=int(self.run_start * 1000))
      self._progress()
      self._print(f"init {row['init_s']:.1f}s on {trainer.num_devices}x{trainer.device_kind}; "
                  f"log {self.log_path}")
      if synthetic:
        self._synthetic(log, max_steps, row)
      else:
        self._train_to_target(log, per_epoch, max_steps, row)
    except (faults.Interrupted, KeyboardInterrupt) as e:
      signum = e.signum if isinstance(e, faults.Interrupted) else signal.SIGINT
      self.interrupted_by = signum
      row["abort_reason"] = faults.Interrupted(signum).reason + (
          " during init" if self.run_start is None else
          f" after {self._samples_trained(row)} samples")
    except Exception as e:  # pylint: disable=broad-except  # every run ends in a row
      line = errors.explained(e)       # e.g. a corrupt data file: its name, not a traceback
      row["abort_reason"] = (line or f"{type(e).__name__}: {e}").replace("\n", " ")[:300]
      received = opts.signals.received if opts.signals else None
      if received is not None:
        # A signal came first, and the error followed it: a scheduler signals every process,
        # each stops at its own next step boundary, and one that is a step behind its peer
        # waits in that step's collective until the heartbeat names the peer lost. The run
        # was preempted: the row and the exit status say so, the error after it.
        self.interrupted_by = received
        row["abort_reason"] = (f"{faults.Interrupted(received).reason} after "
                               f"{self._samples_trained(row)} samples; then: "
                               f"{row['abort_reason']}")[:300]
        self._progress()               # the supervisor's copy, should the process die now
      elif line is None:
        traceback.print_exc(file=sys.stderr)
      if opts.defer_errors and received is None:
        deferred = True
        self._progress(deferred=True)
        raise Deferred(row["abort_reason"]) from None
    finally:
      if not deferred:
        self._close()
    return self.result

  def _close(self):
    """run_stop, the row, the one line: once, whichever path (the main thread's end of the
    run, or the watcher thread's at a second signal) comes first."""
    with self._close_lock:
      if self.closed:
        return
      row, log, opts = self.state, self.log, self.opts
      synthetic = is_synthetic(self.cfg)
      run_stop = time.time()
      if self.run_start is None:                   # failed during init
        log.end(C.INIT_STOP)
        log.start(C.RUN_START, time_ms=int(run_stop * 1000))
        self.run_start = run_stop
      log.end(C.RUN_STOP, time_ms=int(run_stop * 1000), status=row["status"])
      if row["status"] == C.SUCCESS and not synthetic:
        row["time_to_train_s"] = (int(run_stop * 1000) - int(self.run_start * 1000)) / 1000
      result = self._row(row)
      # Never lose the row: an append that fails goes to a recovery CSV beside the log.
      saved = ""
      if opts.primary:
        self.row_saved, saved = results.save_row(opts.results_path, result, self.log_path)
      self.result, self.closed = result, True
      self._progress(closed=True)
      self._print(f"run_stop status={row['status']}"
                  + (f" ({row['abort_reason']})" if row["abort_reason"] else "")
                  + (f" time_to_train={result.time_to_train_s:.1f}s"
                     if result.time_to_train_s is not None else "")
                  + (f"; {saved}" if saved else ""))

  def _close_at_once(self, signum, reason=None, status=None):
    """A second signal (the watcher thread), or the supervisor's death (reason and status
    given: faults.SignalWatch.orphaned): close the run now and leave the process."""
    self.interrupted_by = self.interrupted_by or signum
    if not self.closed:
      self.state["abort_reason"] = reason or (f"{faults.signal_name(signum)} received, then "
                                              "another signal: ended at once")
      self.state["status"] = C.ABORTED
    self._close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status if status is not None else faults.signal_exit_status(signum))

  def _progress(self, closed=False, deferred=False):
    """The supervisor's copy of the run's state: the row as it stands (aborted until it is
    not), where the log is and whether run_start is in it."""
    if not self.opts.progress_path:
      return
    faults.write_progress(self.opts.progress_path, dict(
        run_id=self.run_id, log_path=self.log_path, primary=self.opts.primary,
        run_started=self.run_start is not None, closed=closed, deferred=deferred,
        row_saved=self.row_saved, results_path=self.opts.results_path,
        interrupted_by=self.interrupted_by,
        hosts=self.trainer.process_hosts,
        heartbeat_s=self.cfg.parallel.heartbeat_timeout_s,
        row=dataclasses.asdict(self._row(self.state))))

  def _synthetic(self, log, steps, row):
    """`steps` timed steps after SYNTHETIC_WARMUP_STEPS untimed ones (the batch's first
    transfer, the first dispatches): samples/s of the steady state, comparable with a bare
    step's (bench/gpu_harness.py)."""
    log.start(C.BLOCK_START, first_epoch_num=0, epoch_count=1)
    gbs = self.cfg.train.global_batch_size
    warm = self.trainer.train(SYNTHETIC_WARMUP_STEPS)      # returns after a host sync
    start = time.time()
    metrics = self.trainer.train(steps)
    elapsed = time.time() - start
    row["steps"] = steps + SYNTHETIC_WARMUP_STEPS
    log.end(C.BLOCK_STOP, first_epoch_num=0, epoch_count=1)
    timed = metrics.get("samples", steps * gbs)               # packed rows count their own
    row["throughput"] = timed / elapsed
    # describe's FLOPs are a step's over the nominal batch: MFU from the step rate
    row["step_throughput"] = steps * gbs / elapsed
    row["samples"] = warm.get("samples", SYNTHETIC_WARMUP_STEPS * gbs) + timed
    if not math.isfinite(metrics["loss"]):
      row["abort_reason"] = f"non-finite loss {metrics['loss']}"
      return
    row["status"] = C.SUCCESS
    self._print(f"{steps} steps | {row['throughput']:.1f} samples/s | loss {metrics['loss']:.4f}"
                + (f" | {metrics['progress']}" if metrics.get("progress") else ""))

  def _train_to_target(self, log, per_epoch, max_steps, row):
    cfg, trainer, metric = self.cfg, self.trainer, self.spec.metric
    gbs, target = cfg.train.global_batch_size, cfg.train.target
    by_samples = cadence.kind(cfg.train) == cadence.EVERY_SAMPLES
    # packed rows (BERT): a step's samples vary, so blocks end at sample counts, not steps
    variable = by_samples and trainer.variable_samples
    steps_done, samples_done, train_time = 0, 0, 0.0
    run_start = time.time()
    for end_step, first, count in cadence.plan(cfg.train, per_epoch, max_steps):
      block_steps = end_step - steps_done
      # variable: the step budget is --steps alone (the sample budget ends the plan)
      cap = (self.opts.steps - steps_done) if self.opts.steps else None
      if variable and samples_done >= first + count:
        continue                              # an earlier block's last step passed this point
      if (variable and cap is not None and cap <= 0) or (not variable and block_steps <= 0):
        break
      log.start(C.BLOCK_START, first_epoch_num=first, epoch_count=count)
      start = time.time()
      if variable:
        metrics = self._train_samples(first + count - samples_done, cap)
        steps_done, samples_done = metrics["step"], samples_done + metrics["samples"]
      else:
        metrics = self._train_block(block_steps, steps_done, per_epoch)
        steps_done += block_steps
        samples_done = steps_done * gbs
      train_time += time.time() - start
      epoch = samples_done / (per_epoch * gbs)
      if not math.isfinite(metrics["loss"]):
        log.end(C.BLOCK_STOP, first_epoch_num=first, epoch_count=count)
        row["abort_reason"] = f"non-finite loss {metrics['loss']} at epoch {epoch:g}"
        return
      if by_samples:                          # MLPerf BERT: epoch_num = samples trained
        epoch_num = samples_done
        progress = f"samples {epoch_num}/{cfg.train.max_samples}"
      elif cadence.kind(cfg.train) == cadence.PER_EPOCH:   # MLPerf DLRM: the epoch fraction
        epoch_num = cadence.epoch_fraction(steps_done, per_epoch)
        progress = f"epoch {epoch_num:g}/{cfg.train.max_epochs:g}"
      else:
        epoch_num = min(first + count, math.ceil(epoch))   # less if --steps cut the block
        progress = f"epoch {epoch:g}/{cfg.train.max_epochs:g}"
      # the samples trained, beside epoch_num: what the 5.1 rules' LLM benchmarks check
      # ('samples_count' in eval_accuracy's metadata) and their RCP checker reads
      at = {"epoch_num": epoch_num, **({"samples_count": samples_done} if by_samples else {})}
      log.start(C.EVAL_START, **at)
      value = trainer.evaluate()[metric.name]
      log.event(C.EVAL_ACCURACY, metric.logged(value), **at)
      log.end(C.EVAL_STOP, **at)
      log.end(C.BLOCK_STOP, first_epoch_num=first, epoch_count=count)
      row.update(metric=value, epochs=epoch, samples=samples_done,
                 throughput=samples_done / train_time,
                 step_throughput=steps_done * gbs / train_time)
      self._progress()
      if self.tb:
        self.tb.scalars(steps_done, {"train/loss": metrics["loss"], "train/lr": metrics["lr"],
                                     f"eval/{metric.name}": value,
                                     "train/samples_per_s": row["throughput"],
                                     **metrics.get("scalars", {})})
      self._print(f"{progress} | {samples_done / train_time:.1f}"
                  f" samples/s | loss {metrics['loss']:.4f} | lr {metrics['lr']:.4g} | "
                  f"{metric.name} {value:.4f} (target {target:g}) | "
                  + _extra(metrics) + f"elapsed {time.time() - run_start:.1f}s")
      if metric.reached(value, target):
        row["status"] = C.SUCCESS
        return
      self._check_signals()
    row["abort_reason"] = (f"target {target} not reached within {steps_done} steps "
                           + (f"({samples_done} samples)" if by_samples
                              else f"({steps_done / per_epoch:g} epochs)"))

  def _train_samples(self, block_samples, max_steps=None):
    """A block of at least `block_samples` samples (a step's own count: packed rows), or of
    `max_steps` steps where that comes first, in one call: its end is reported with its eval."""
    metrics = self.trainer.train(max_steps, samples=block_samples)
    self.state["steps"] = metrics["step"]
    self.state["trained"] = self.state.get("trained", 0) + metrics["samples"]
    self._progress()
    return metrics

  def _train_block(self, block_steps, steps_before=0, per_epoch=0):
    """Runs a block in chunks of train.steps_per_loop, or (0) of one epoch when the block
    spans several (a reference ResNet block is 4 epochs): a progress line per chunk inside
    the block; the block's end is reported with its eval."""
    chunk = self.cfg.train.steps_per_loop or (
        per_epoch if 0 < per_epoch < block_steps else block_steps)
    gbs = self.cfg.train.global_batch_size
    metrics, done = {}, 0
    while done < block_steps:
      n = min(chunk, block_steps - done)
      start = time.time()
      metrics = self.trainer.train(n)
      done += n
      self.state["steps"] = steps_before + done
      self._progress()
      if not math.isfinite(metrics["loss"]):
        break
      if done < block_steps:
        step = steps_before + done
        speed = n * gbs / max(time.time() - start, 1e-9)
        self._print(f"  step {step} (epoch {step / per_epoch:.2f}, block {done}/{block_steps})"
                    f" | {speed:.1f} samples/s | loss {metrics['loss']:.4f} | "
                    f"lr {metrics['lr']:.4g}" if per_epoch else
                    f"  step {step} (block {done}/{block_steps}) | {speed:.1f} samples/s | "
                    f"loss {metrics['loss']:.4f}")
        if self.tb:
          self.tb.scalars(step, {"train/loss": metrics["loss"], "train/lr": metrics.get("lr"),
                                 "train/samples_per_s": speed})
        self._check_signals()
    return metrics

  def _samples_trained(self, r):
    """Samples trained so far: a packed step's own count (the trainer's, per block; a
    synthetic run's in its row), else steps x the global batch."""
    if self.trainer.variable_samples:
      return r.get("trained") or r["samples"] or 0
    return r["steps"] * self.cfg.train.global_batch_size

  def _row(self, r) -> results.ResultRow:
    cfg, trainer, opts = self.cfg, self.trainer, self.opts
    synthetic = is_synthetic(cfg)
    completed = self._samples_trained(r)
    return results.ResultRow(
        run_id=self.run_id, started_at=self.started_at,
        system=opts.system or socket.gethostname(), workload=self.spec.name,
        mlperf_benchmark=self.spec.mlperf_benchmark, framework=opts.framework,
        preset=opts.preset, status=r["status"], abort_reason=r["abort_reason"],
        time_to_train_s=r["time_to_train_s"], init_s=round(r["init_s"], 3),
        epochs_to_converge=r["epochs"] if r["status"] == C.SUCCESS and not synthetic else None,
        samples_to_converge=r["samples"] if r["status"] == C.SUCCESS and not synthetic else None,
        final_metric=r["metric"], metric_name=self.spec.metric_name,
        target=None if synthetic else cfg.train.target,
        global_batch_size=cfg.train.global_batch_size, num_devices=trainer.num_devices,
        device_kind=trainer.device_kind, mesh=trainer.mesh_description, seed=self.seed,
        throughput=r["throughput"],
        mfu=devices.mfu(r["flops"], r.get("step_throughput") or r["throughput"],
                        trainer.device_kind, trainer.num_devices, cfg.train.precision),
        host=socket.gethostname(), git_commit=_git_commit(), versions=_versions(),
        log_path=self.log_path,
        epochs_completed=(None if synthetic or not r["steps"] else
                          round(completed / (self.per_epoch * cfg.train.global_batch_size), 6)),
        samples_completed=completed)


class RunResults(list):
  """The rows of run_all, and how the command should end: `interrupted_by` the signal that
  stopped a run (None if none), `rows_not_saved` how many rows missed the result CSV."""
  interrupted_by = None
  rows_not_saved = 0

  def exit_status(self) -> int:
    if self.interrupted_by is not None:
      return faults.signal_exit_status(self.interrupted_by)
    if self.rows_not_saved:
      return errors.EXIT_ROW_NOT_SAVED
    return 0 if all(r.status == C.SUCCESS for r in self) else errors.EXIT_ABORTED


def run_all(spec, cfg, opts: RunOptions, make_trainer) -> RunResults:
  """Runs opts.runs runs; each gets a fresh trainer (built before its log opens) and seed. A
  signal ends the current run (its row written) and the runs after it are not started."""
  rows = RunResults()
  for index in range(opts.runs):
    if opts.signals and opts.signals.received is not None:
      rows.interrupted_by = opts.signals.received
      break
    seed = opts.seed + index if opts.seed is not None else int.from_bytes(os.urandom(3), "big")
    trainer = make_trainer(seed)
    run = Run(spec, cfg, opts, index, trainer, seed)
    rows.append(run.execute())
    if opts.signals:
      opts.signals.on_second = None
    rows.rows_not_saved += not run.row_saved
    if run.interrupted_by is not None:
      rows.interrupted_by = run.interrupted_by
      break
  return rows
