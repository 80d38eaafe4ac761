"""`simulate --workload W --mesh stage=K[,data=D] --set parallel.microbatches=M`: one GPipe
step on a machine, from the workload's own layers (harness/pipeline.py's schedule).

What goes in, and where it comes from:
- each pipeline layer's forward FLOPs and the bytes it hands on, from XLA's cost analysis of
  the layer lowered on one micro-batch (the JAX trainer's `layer_profile`; nothing runs);
- a chip's peak rate (--peak-tflops, or the machine preset's), at which compute is timed;
- the machine's link figures for a stage shift (neighbouring chips: one message over one
  link) and for the data axis's all-reduce of each stage's gradients (the best algorithm on a
  ring of D, as `simulate --bytes` times it).

The step, as jax_pipeline.py runs it: M + K - 1 forward iterations, each as long as the
slowest stage's forward plus a shift, then M + K - 1 backward iterations (backward = 2x the
forward's FLOPs, 3x with re-materialization), then the gradient all-reduce (not overlapped).
A stage computes its micro-batch in FLOPs / peak: no efficiency below peak is modelled, so
the figures are upper bounds whose ratios (speedup vs K and M, GPipe's Table 2) are the point.
"""
import math

from harness import devices
from harness import mesh as mesh_lib
from harness import pipeline
from harness.commsim import algorithms, machine as machine_lib, tables
from harness.errors import UsageError

TABLE_STAGES, TABLE_MICROBATCHES = (1, 2, 4, 8), (1, 4, 32)


def _profile(args):
  from harness import registry
  from harness.workload import RunContext
  spec = registry.get(args.workload)
  cfg = spec.configure(args.preset, args.overrides)
  axes = mesh_lib.ParallelConfig(mesh=args.mesh).axes()
  stages, data = axes["stage"], axes["data"] or 1
  others = [a for a in mesh_lib.AXES if a not in ("data", "stage") and axes[a] > 1]
  if stages < 2 or others:
    raise UsageError(f"--mesh {args.mesh!r}: a pipeline step is timed on stage=K,data=D; "
                     "allowed: stage >= 2, no model, expert or spatial axis")
  if spec.pipeline_layers is None:
    cut = [name for name in registry.names() if registry.get(name).pipeline_layers]
    raise UsageError(f"--workload {spec.name} has no pipeline layers; allowed: "
                     f"{', '.join(cut)}")
  parallel = mesh_lib.ParallelConfig(mesh=f"data={data},stage={stages}",
                                     microbatches=cfg.parallel.microbatches,
                                     stage_layers=cfg.parallel.stage_layers)
  gbs = cfg.train.global_batch_size
  mesh_lib.check_fits(parallel, framework="jax", workload=spec.name,
                      workload_axes=spec.mesh_axes, global_batch_size=gbs,
                      layers=spec.pipeline_layers(cfg))
  cfg.parallel = mesh_lib.ParallelConfig(mesh="data=1")
  if hasattr(cfg.data, "init_checkpoint"):
    cfg.data.init_checkpoint = ""
  devices.prepare("jax", 1)
  trainer = spec.make_trainer("jax", cfg, RunContext(seed=0, preset=args.preset,
                                                     describing=True))
  rows = gbs // data // parallel.microbatches
  return spec, cfg, parallel, data, rows, trainer


def _step_time(flops, sends, stage_bytes, cut, microbatches, scale, peak, link, allreduce,
               remat):
  """Seconds of one step: `flops`/`sends` per layer at the profiled micro-batch, x `scale`."""
  ranges = pipeline.stage_ranges(cut)
  forward = [sum(flops[a:b]) * scale / peak for a, b in ranges]
  shift = max([link(sends[b - 1] * scale) for a, b in ranges[:-1]] or [0.0])
  iterations = pipeline.iterations(len(cut), microbatches)
  compute = iterations * (max(forward) + shift) + iterations * (
      (3.0 if remat else 2.0) * max(forward) + shift)
  return compute + max(allreduce(b) for b in stage_bytes)


def run(args, topology, kwargs, grad_bytes_per_param):
  axes = mesh_lib.ParallelConfig(mesh=args.mesh).axes()    # checked before any framework
  kind, shape = machine_lib.parse_topology(topology)
  if axes["stage"] * max(axes["data"], 1) != math.prod(shape):
    raise UsageError(f"--mesh {args.mesh} needs {axes['stage'] * max(axes['data'], 1)} chips; "
                     f"--topology {topology} has {math.prod(shape)}; allowed: K x D = the chips")
  if args.peak_tflops is not None and not args.peak_tflops > 0:
    raise UsageError(f"--peak-tflops {args.peak_tflops} is out of range; allowed: > 0")
  preset = machine_lib.PRESETS.get(args.machine or "")
  peak = (args.peak_tflops * 1e12 if args.peak_tflops else
          preset.peak_flops if preset and preset.peak_flops else 0.0)
  if peak <= 0:
    rated = "/".join(n for n, p in machine_lib.PRESETS.items() if p.peak_flops)
    raise UsageError("a pipeline step is timed at a peak rate; allowed: --peak-tflops T (> 0) "
                     f"or --machine {rated}")
  spec, cfg, parallel, data, rows, trainer = _profile(args)
  stages, microbatches = parallel.axes()["stage"], parallel.microbatches
  profile = trainer.layer_profile(rows)
  flops, sends = [f for f, _ in profile], [b for _, b in profile]
  layers = spec.pipeline_layers(cfg)
  sizes = trainer.parameter_sizes()

  def link(nbytes):
    return kwargs["overhead"] + kwargs["link_latency"] + nbytes / kwargs["link_bandwidth"]

  def allreduce(nbytes):
    if data == 1:
      return 0.0
    machine = machine_lib.Machine(f"ring:{data}", **kwargs)
    return min(tables.simulate(machine, "all-reduce", a, nbytes)["time_s"]
               for a in algorithms.applicable(machine, "all-reduce"))

  def stage_bytes(cut):
    return [s["parameters"] * grad_bytes_per_param
            for s in pipeline.stage_summary(layers, cut, sizes)]

  remat = cfg.parallel.remat
  cut = pipeline.stage_cut(layers, stages, parallel.stage_layers)
  step = _step_time(flops, sends, stage_bytes(cut), cut, microbatches, 1.0, peak, link,
                    allreduce, remat)
  ranges = pipeline.stage_ranges(cut)
  one_chip = 3.0 * sum(flops) * microbatches / peak    # the replica's batch on one chip
  per_replica = rows * microbatches
  table = {}
  for k in TABLE_STAGES:
    if k > len(layers):
      continue
    for m in TABLE_MICROBATCHES:
      if per_replica % m == 0:
        c = pipeline.stage_cut(layers, k)
        table[(k, m)] = per_replica / _step_time(
            flops, sends, stage_bytes(c), c, m, per_replica / m / rows, peak, link,
            lambda b: 0.0, remat)
  base = table.get((2, 1)) or 1.0
  return {"workload": spec.name, "preset": args.preset, "layout": parallel.mesh,
          "microbatches": microbatches, "per_replica_batch": per_replica, "remat": remat,
          "peak_flops": peak, "cut": list(cut),
          "stage_forward_s": [sum(flops[a:b]) / peak for a, b in ranges],
          "shift_s": [link(sends[b - 1]) for a, b in ranges[:-1]],
          "gradient_all_reduce_s": max(allreduce(b) for b in stage_bytes(cut)),
          "bubble_fraction": pipeline.bubble_fraction(stages, microbatches),
          "step_s": step, "samples_per_s": per_replica * data / step,
          "speedup_vs_one_chip": one_chip / step * data,
          "throughput_vs_k2_m1": {f"K={k},M={m}": v / base for (k, m), v in table.items()}}


def print_result(out, topology):
  print(f"machine:  {topology}, peak {out['peak_flops'] / 1e12:g} TFLOP/s per chip")
  print(f"pipeline: {out['workload']} ({out['preset']}) on {out['layout']}, "
        f"M={out['microbatches']} of a {out['per_replica_batch']}-sample replica batch, cut "
        f"{out['cut']}, bubble {out['bubble_fraction']:.4f}, remat "
        f"{'on' if out['remat'] else 'off'}")
  print(f"step:     {out['step_s'] * 1e3:.4g} ms, {out['samples_per_s']:.4g} samples/s, "
        f"{out['speedup_vs_one_chip']:.3g}x one chip")
  print("throughput vs K=2,M=1 (GPipe Table 2's normalisation, gradient all-reduce left out):")
  for key, value in out["throughput_vs_k2_m1"].items():
    print(f"  {key:10s} {value:.3g}")
