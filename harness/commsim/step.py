"""`simulate --workload W --step`: one data-parallel training step on a machine, the gradient
all-reduce overlapped with the backward pass, and how it scales from 8 to 4,096 chips.

The step, per chip, at a fixed global batch (MLPerf's: the batch does not grow with the
machine, so each chip's share shrinks while the gradient stays the same size; the TPU-pod
papers' "fixed batch size limits data parallelism"):

  compute   = FLOPs per example x examples per chip / (peak x MFU); the forward pass is a
              third of it, the backward two thirds (backward = 2 x forward FLOPs)
  gradients become ready during the backward pass in reverse parameter order (Keras' creation
              order, flax's parameter tree sorted by name); a parameter's
              gradient is ready once the backward pass has covered it, the backward FLOPs
              spread over the parameters in proportion to their size (exact for dense layers,
              where a layer's FLOPs are 2 x tokens x parameters; for convolutions the early
              layers do more FLOPs per parameter, so their gradients, the last ones, come
              later than assumed: the exposed time is then a lower bound)
  buckets   the gradients are all-reduced in buckets as the framework issues them:
              jax  XLA's all-reduce combiner fuses gradients up to 30 MiB + 7 B
                   (kDefaultAllReduceCombineThreshold, xla/service/collective_utils.h) and
                   its async collectives start a bucket as soon as its gradients exist
              tf   the harness's TF step sums all gradients in one all_reduce call after the
                   backward pass (tf_trainer_base._apply: `rt.all_sum(grads)`): one bucket
              --bucket-mb overrides the size
  all-reduce buckets run one after another on the network, each timed by the simulator on the
              machine (the best algorithm, the machine's efficiency terms included)
  exposed   the time the last bucket ends after the backward pass does (>= 0)
  step      compute + exposed; scaling efficiency = compute / step (a chip's ideal share of a
              one-chip step over what it takes).
"""
import math

from harness import devices
from harness.commsim import algorithms, machine as machine_lib, tables, timing
from harness.errors import UsageError

SCALING_CHIPS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
BUCKET_BYTES = {"jax": 30 * 1024 * 1024 + 7, "tf": math.inf}
BUCKET_SOURCE = {"jax": "XLA's all-reduce combiner threshold (30 MiB), async collectives",
                 "tf": "one all_reduce of every gradient after the backward pass"}


def buckets(sizes_bytes, bucket_bytes, backward_s, forward_s=0.0):
  """[(ready time, bytes)]: gradients in reverse order (the backward pass's), fused until a
  bucket reaches `bucket_bytes`; a bucket is ready when its last gradient is."""
  total = float(sum(sizes_bytes)) or 1.0
  out, done, fill = [], 0.0, 0.0
  for size in reversed(list(sizes_bytes)):
    done += size
    fill += size
    if fill >= bucket_bytes:
      out.append((forward_s + backward_s * done / total, fill))
      fill = 0.0
  if fill > 0:
    out.append((forward_s + backward_s, fill))
  return out


def overlap(ready_bytes, all_reduce_s, compute_s):
  """Seconds of communication exposed after `compute_s`: buckets start when ready and when
  the previous one has finished (one network), in order."""
  end = 0.0
  for ready, nbytes in ready_bytes:
    end = max(end, ready) + all_reduce_s(nbytes)
  return max(0.0, end - compute_s)


def predict(sizes_bytes, flops_per_example, per_chip_batch, peak, mfu, bucket_bytes,
            all_reduce_s) -> dict:
  """One step's compute, buckets and exposed communication on one machine."""
  compute = flops_per_example * per_chip_batch / (peak * mfu)
  forward, backward = compute / 3, compute * 2 / 3
  ready = buckets(sizes_bytes, bucket_bytes, backward, forward)
  exposed = overlap(ready, all_reduce_s, compute)
  serial = sum(all_reduce_s(b) for _, b in ready)
  step = compute + exposed
  return {"compute_s": compute, "buckets": len(ready), "all_reduce_s": serial,
          "exposed_s": exposed, "step_s": step,
          "scaling_efficiency": compute / step if step > 0 else 1.0}


def _best_all_reduce(machine_kwargs, topology):
  machine = machine_lib.Machine(topology, **machine_kwargs)
  # each algorithm's schedule built once and timed at every size asked (its routes kept)
  schedules = [algorithms.build(machine, "all-reduce", a)
               for a in algorithms.applicable(machine, "all-reduce")]
  cache = {}

  def seconds(nbytes):
    if nbytes not in cache:
      cache[nbytes] = min(timing.simulate(machine, s, nbytes).time_s for s in schedules)
    return cache[nbytes]
  return seconds


def scaling(sizes_bytes, flops_per_example, global_batch, peak, mfu, bucket_bytes,
            machine_kwargs, kind, gpus_per_node, dims, chips=SCALING_CHIPS) -> list[dict]:
  """The step on 8 .. 4,096 chips of the machine's kind at a fixed global batch; a chip count
  above the batch (less than one example a chip) is reported and not timed."""
  rows = []
  for n in chips:
    topology = tables.scaling_shape(kind, n, gpus_per_node, dims)
    row = {"chips": n, "topology": topology, "per_chip_batch": global_batch / n}
    if global_batch < n:
      rows.append({**row, "note": "fewer examples than chips"})
      continue
    row.update(predict(sizes_bytes, flops_per_example, global_batch / n, peak, mfu,
                       bucket_bytes, _best_all_reduce(machine_kwargs, topology)))
    rows.append(row)
  return rows


def check_rates(peak, mfu):
  if not peak > 0:
    rated = "/".join(n for n, p in machine_lib.PRESETS.items() if p.peak_flops)
    raise UsageError("a step is timed at a chip's peak rate; allowed: --peak-tflops T (> 0) "
                     f"or --machine {rated}")
  if not 0 < mfu <= 1:
    raise UsageError(f"--mfu {mfu} is out of range; allowed: 0 < MFU <= 1")


def workload_inputs(args) -> dict:
  """What the step needs from the workload: its parameter sizes in order (from shapes) and its
  training FLOPs per example (--flops-per-example, or XLA's cost analysis of the framework's
  train step compiled on one device at a batch of 2: FLOPs per example do not depend on the
  batch), and its global batch."""
  from harness import mesh as mesh_lib
  from harness import registry
  from harness.workload import RunContext
  if args.flops_per_example is not None and not args.flops_per_example > 0:
    raise UsageError(f"--flops-per-example {args.flops_per_example} is out of range; "
                     "allowed: > 0")
  spec = registry.get(args.workload)
  cfg = spec.configure(args.preset, args.overrides)
  global_batch = cfg.train.global_batch_size
  if hasattr(cfg.data, "init_checkpoint"):
    cfg.data.init_checkpoint = ""                # the shapes, not the weights
  cfg.parallel = mesh_lib.ParallelConfig(mesh="data=1")
  cfg.train.global_batch_size = 2
  devices.prepare(args.framework, 1)
  try:
    trainer = spec.make_trainer(args.framework, cfg, RunContext(seed=0, preset=args.preset,
                                                                describing=True))
  except ValueError as e:
    raise UsageError(str(e)) from None
  if args.framework == "tf":             # Keras' creation order: the forward order
    if not hasattr(trainer, "model"):
      trainer.build()
    sizes = [math.prod(v.shape) for v in trainer.model.trainable_variables]
  else:                                  # flax's parameter tree (sorted by name)
    sizes = list(trainer.parameter_sizes().values())
  flops = args.flops_per_example
  if flops is None:
    flops = float(trainer.describe().train_flops_per_example)
  return {"spec": spec, "sizes": sizes, "flops_per_example": flops,
          "global_batch": global_batch, "flops_source": "--flops-per-example"
          if args.flops_per_example is not None else
          f"XLA cost analysis of the {args.framework} step"}


def run(args, machine, kwargs, preset, grad_bytes_per_param) -> dict:
  """The step on this machine and the table from 8 to 4,096 chips of its kind."""
  if args.mfu is not None and not 0 < args.mfu <= 1:
    raise UsageError(f"--mfu {args.mfu} is out of range; allowed: 0 < MFU <= 1")
  if args.bucket_mb is not None and not args.bucket_mb > 0:
    raise UsageError(f"--bucket-mb {args.bucket_mb} is out of range; allowed: > 0")
  peak = args.peak_tflops * 1e12 if args.peak_tflops else preset.peak_flops
  check_rates(peak, args.mfu)
  inputs = workload_inputs(args)
  sizes = [n * grad_bytes_per_param for n in inputs["sizes"]]
  bucket = args.bucket_mb * 1e6 if args.bucket_mb else BUCKET_BYTES[args.framework]
  chips = len(machine.live_chips)
  gbs = inputs["global_batch"]
  here = (predict(sizes, inputs["flops_per_example"], gbs / chips, peak, args.mfu, bucket,
                  _best_all_reduce(kwargs, machine.topology))
          if gbs >= chips else {"note": "fewer examples than chips"})
  table = scaling(sizes, inputs["flops_per_example"], gbs, peak, args.mfu, bucket, kwargs,
                  machine.kind, machine.shape[-1], len(machine.shape))
  return {"workload": inputs["spec"].name, "framework": args.framework,
          "global_batch": gbs, "flops_per_example": inputs["flops_per_example"],
          "flops_source": inputs["flops_source"], "peak_flops": peak, "mfu": args.mfu,
          "gradient_bytes": float(sum(sizes)), "parameters": len(sizes),
          "bucket_bytes": bucket, "bucket_source": "--bucket-mb" if args.bucket_mb
          else BUCKET_SOURCE[args.framework],
          "this_machine": {"chips": chips, "topology": machine.topology, **here},
          "scaling": table}


def print_step(out):
  import pandas as pd                                # pylint: disable=import-outside-toplevel
  bucket = ("one bucket" if math.isinf(out["bucket_bytes"])
            else f"{out['bucket_bytes'] / 2 ** 20:.4g} MiB buckets")
  print(f"\nstep:     {out['workload']} ({out['framework']}), global batch "
        f"{out['global_batch']}, {out['flops_per_example'] / 1e9:.4g} GFLOP a training example "
        f"({out['flops_source']}), {out['peak_flops'] / 1e12:g} TFLOP/s x MFU {out['mfu']:g}")
  print(f"          {out['gradient_bytes'] / 1e6:.4g} MB of gradients in {bucket} "
        f"({out['bucket_source']}), overlapped with the backward pass")
  here = out["this_machine"]
  if "step_s" in here:
    print(f"on {here['topology']}: compute {here['compute_s'] * 1e3:.4g} ms, all-reduce "
          f"{here['all_reduce_s'] * 1e3:.4g} ms in {here['buckets']} buckets, exposed "
          f"{here['exposed_s'] * 1e3:.4g} ms, step {here['step_s'] * 1e3:.4g} ms, scaling "
          f"efficiency {here['scaling_efficiency']:.3f}")
  frame = pd.DataFrame(out["scaling"])
  if "step_s" not in frame:
    return
  for column in ("compute_s", "all_reduce_s", "exposed_s", "step_s"):
    frame[column.replace("_s", "_ms")] = frame.pop(column) * 1e3
  columns = ["chips", "topology", "per_chip_batch", "compute_ms", "all_reduce_ms", "exposed_ms",
             "step_ms", "scaling_efficiency"]
  print("\nscaling at the fixed global batch (time per step; efficiency = compute / step):")
  with pd.option_context("display.width", 200):
    print(frame[columns].to_string(index=False, float_format=lambda v: f"{v:.4g}",
                                   na_rep="-"))
  stops = [r for r in out["scaling"] if "note" in r]
  if stops:
    print(f"from {stops[0]['chips']} chips on: fewer examples than chips (the global batch is "
          f"{out['global_batch']})")
