"""`run_benchmark.py simulate`: the collective simulator from the command line.

    simulate --topology torus:32x32 --algorithm 2d --bytes 100MB [--failed 3,5 17,2] [--json]
    simulate --machine dgx-a100 --topology multinode:16x8 --algorithm all
    simulate --workload resnet50 --machine dgx-h100     # one training step, 8..4096 chips
    simulate --measurements                             # the model against published figures
    simulate --topology mesh:16x16 --failure-sweep 1,2,4,8 --heatmap load.png --failed 3,5 9,9
"""
import dataclasses
import json
import math
import os
import re

from harness import devices
from harness.commsim import algorithms, machine as machine_lib, tables
from harness.errors import UsageError

_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
          "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30}
GRAD_DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}


def parse_bytes(text: str) -> float:
  m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
  if not m or m.group(2).lower() not in _UNITS or float(m.group(1)) <= 0:
    raise UsageError(f"--bytes {text!r} is not a size; allowed: a positive number with an "
                     "optional unit B, KB, MB, GB, KiB, MiB, GiB (e.g. 100MB)")
  return float(m.group(1)) * _UNITS[m.group(2).lower()]


def _counts(text: str) -> tuple[int, ...]:
  try:
    counts = tuple(int(c) for c in text.split(","))
  except ValueError:
    counts = ()
  if not counts or min(counts) < 1:
    raise UsageError(f"--failure-sweep {text!r} is not a list of counts; allowed: positive "
                     "integers separated by commas, e.g. 1,2,4,8")
  return counts


def add_parser(sub):
  p = sub.add_parser(
      "simulate", help="collective-communication simulator (ring, 2-D torus, failed chips)",
      description="Simulate a collective on a pod-scale machine: its time, algorithm and bus "
                  "bandwidth and per-link load (alpha-beta with link contention), optionally "
                  "checked by executing it on data. Framework-neutral (numpy).")
  p.add_argument("--machine", choices=sorted(machine_lib.PRESETS),
                 help="link figures of a real machine, with its efficiency terms fitted to "
                      "published measurements where it has them (default: tpu-v3; dgx-a100 "
                      "for multinode topologies)")
  p.add_argument("--ideal", action="store_true",
                 help="the ideal alpha-beta model: no efficiency terms (link efficiency, "
                      "protocols, launch, in-network reduction)")
  p.add_argument("--measurements", action="store_true",
                 help="print every published figure of measurements.csv beside the simulated "
                      "one and the error (fit and held-out rows)")
  p.add_argument("--topology", help=machine_lib.TOPOLOGY_SYNTAX + " (default: the machine's)")
  p.add_argument("--collective", default="all-reduce", choices=algorithms.COLLECTIVES)
  p.add_argument("--algorithm", default="all",
                 help=f"one of {', '.join(algorithms.ALGORITHMS)}, or all (default): every "
                      "algorithm that runs on the topology, side by side")
  p.add_argument("--bytes", default="100MB", help="vector size per chip (default 100MB)")
  p.add_argument("--failed", nargs="+", default=[], metavar="CHIP",
                 help="failed chips by coordinates: X,Y (mesh/torus), I (ring), NODE,GPU")
  p.add_argument("--failed-link", nargs="+", default=[], metavar="A-B",
                 help="failed links between neighbours, e.g. 3,5-4,5")
  g = p.add_argument_group("link figures (override the machine's)")
  g.add_argument("--link-bandwidth", type=float, metavar="GB/S", help="per direction")
  g.add_argument("--link-latency", type=float, metavar="US", help="per hop")
  g.add_argument("--overhead", type=float, metavar="US", help="per message")
  g.add_argument("--injection-bandwidth", type=float, metavar="GB/S",
                 help="what one chip can send in total per step (default: no limit)")
  g.add_argument("--network-bandwidth", type=float, metavar="GB/S",
                 help="multinode: per rail and direction")
  g.add_argument("--network-latency", type=float, metavar="US", help="multinode: per message")
  g.add_argument("--nics-per-node", type=int, metavar="K",
                 help="multinode: network ports a node (default: the machine's; one per GPU)")
  w = p.add_argument_group("a workload's gradient all-reduce (sets --bytes)")
  w.add_argument("--workload", help="a workload of `list` (e.g. resnet50)")
  w.add_argument("--framework", default="jax", choices=("jax", "tf"),
                 help="whose model the parameters are counted from (default jax)")
  w.add_argument("--preset", default="reference", help="the workload's preset (default "
                                                       "reference)")
  w.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                 help="override a workload config value")
  w.add_argument("--grad-dtype", default="float32", choices=sorted(GRAD_DTYPES),
                 help="dtype of the all-reduced gradients (default float32)")
  w.add_argument("--peak-tflops", type=float, metavar="T",
                 help="a chip's peak rate for the step's compute (default: the machine's)")
  w.add_argument("--mfu", type=float, default=0.4,
                 help="the step's model-FLOP utilisation: its compute takes FLOPs / (peak x "
                      "MFU) (default 0.4)")
  w.add_argument("--bucket-mb", type=float, metavar="MB",
                 help="gradient bucket size (default: the framework's: jax 30 MiB, XLA's "
                      "all-reduce combiner; tf one bucket after the backward pass)")
  w.add_argument("--flops-per-example", type=float, metavar="F",
                 help="the step's training FLOPs per example (default: XLA's cost analysis of "
                      "the workload's JAX step, compiled here at a batch of 2)")
  w.add_argument("--mesh", metavar="data=D,model=M",
                 help="with --workload: time one step's collectives on this layout (the "
                      "gradient all-reduce over data of the bytes per device, the model axis's "
                      "all-reduces of activations at the preset's batch, counted in the JAX "
                      "step compiled on M simulated devices); D x M = the machine's chips")
  p.add_argument("--scaling", action="store_true",
                 help="also the table from 8 to 1024 chips (with --workload: the step from 8 "
                      "to 4096 chips)")
  p.add_argument("--failure-sweep", type=str, metavar="COUNTS",
                 help="slowdown with this many random failed chips, e.g. 1,2,4,8")
  p.add_argument("--seed", type=int, default=0, help="seed of the random failed chips")
  p.add_argument("--check", action="store_true",
                 help="also execute the collective on data (1,024 elements per chip) and check "
                      "that every live chip holds the exact result")
  p.add_argument("--heatmap", metavar="PNG", help="write the link-load heat map (mesh/torus)")
  p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
  return p


def machine_args(args) -> tuple[str, dict, machine_lib.Preset]:
  """(topology, Machine keyword arguments, preset) from the flags."""
  name = args.machine or ("dgx-a100" if (args.topology or "").startswith("multinode")
                          else "tpu-v3")
  preset = machine_lib.PRESETS[name]
  topology = args.topology or preset.topology
  def pick(value, default, scale):
    if value is None:
      return default
    if value < 0 or (scale == 1e9 and value == 0):
      raise UsageError(f"a link figure of {value} is out of range; allowed: > 0 "
                       "(bandwidth) or >= 0 (latency)")
    return value * scale
  if args.nics_per_node is not None and args.nics_per_node < 1:
    raise UsageError(f"--nics-per-node {args.nics_per_node} is out of range; allowed: >= 1")
  nics = args.nics_per_node or preset.nics_per_node
  kwargs = dict(
      link_bandwidth=pick(args.link_bandwidth, preset.link_bandwidth, 1e9),
      link_latency=pick(args.link_latency, preset.link_latency, 1e-6),
      overhead=pick(args.overhead, preset.overhead, 1e-6),
      injection_bandwidth=pick(args.injection_bandwidth, preset.injection_bandwidth, 1e9),
      network_bandwidth=pick(args.network_bandwidth, preset.network_bandwidth, 1e9),
      network_latency=pick(args.network_latency, preset.network_latency, 1e-6),
      nics_per_node=nics, efficiency=None if args.ideal else preset.efficiency)
  if topology.startswith("multinode") and not kwargs["network_bandwidth"]:
    raise UsageError(f"--topology {topology} needs a network: --network-bandwidth or "
                     "--machine dgx-a100")
  return topology, kwargs, preset


def _workload_bytes(args, chips) -> tuple[float, str]:
  """The gradient bytes of a workload's step: its trainable parameters x the gradient dtype.
  Counted from the model's shapes in the chosen framework (nothing is compiled). With
  --collective all-to-all: what one chip sends into one of the step's all-to-alls (an MoE
  layer's dispatch) with the batch over the `chips`."""
  from harness import registry
  from harness.workload import RunContext
  spec = registry.get(args.workload)
  cfg = spec.configure(args.preset, args.overrides)
  if args.collective == "all-to-all":
    found = spec.all_to_all_bytes(cfg, chips)
    if found is None:
      raise UsageError(f"--collective all-to-all --workload {spec.name}: its step has no "
                       "all-to-all (no expert layers); allowed: a workload with them, e.g. "
                       "transformer --set model.moe.num_experts=E")
    return found[0], f"{spec.name} ({args.preset}): {found[1]}"
  if hasattr(cfg.data, "init_checkpoint"):
    cfg.data.init_checkpoint = ""                # the shapes, not the weights
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  try:
    trainer = spec.make_trainer(args.framework, cfg, RunContext(seed=0, preset=args.preset))
  except ValueError as e:
    raise UsageError(str(e)) from None
  params = trainer.parameter_count()
  nbytes = params * GRAD_DTYPES[args.grad_dtype]
  return nbytes, (f"{spec.name} ({args.preset}, {args.framework}): {params:,} parameters x "
                  f"{GRAD_DTYPES[args.grad_dtype]} B ({args.grad_dtype}) = {nbytes / 1e6:.2f} MB "
                  "of gradients per step")


def _layout_step(args, topology, kwargs) -> dict:
  """One step's collectives on a data x model layout, timed on the machine: the gradient
  all-reduce over the D data peers of each chip (every M-th chip: on a torus or mesh a
  (X/M) x Y grid whose hops cross M links; else a ring of D), and the model axis's
  all-reduces among M neighbouring chips (a ring). What they move comes from the workload's
  JAX train step compiled at data=1, model=M with the per-replica batch (gbs / D): its
  all-reduces over `model` (count and bytes) and its parameter bytes per device."""
  from harness import mesh as mesh_lib
  from harness import registry
  from harness.workload import RunContext
  layout = mesh_lib.ParallelConfig(mesh=args.mesh).axes()
  data, model = layout["data"], layout["model"]
  others = [a for a in mesh_lib.AXES if a not in ("data", "model") and layout[a] > 1]
  if not data or others:
    raise UsageError(f"--mesh {args.mesh!r}: simulate times data=D,model=M layouts; allowed: "
                     "both sizes given, no other axis")
  kind, shape = machine_lib.parse_topology(topology)
  if data * model != math.prod(shape):
    raise UsageError(f"--mesh {args.mesh} needs {data * model} chips; --topology {topology} "
                     f"has {math.prod(shape)}; allowed: D x M = the chips")
  spec = registry.get(args.workload)
  cfg = spec.configure(args.preset, args.overrides)
  gbs = cfg.train.global_batch_size
  if gbs % data:
    raise UsageError(f"train.global_batch_size={gbs} is not divisible by the data axis "
                     f"({data}); allowed: --set train.global_batch_size=<a multiple of {data}>")
  mesh_lib.check_fits(mesh_lib.ParallelConfig(mesh=f"data=1,model={model}"), framework="jax",
                      workload=spec.name, workload_axes=spec.mesh_axes,
                      global_batch_size=gbs // data, dims=spec.split_dims(cfg))
  cfg.parallel.mesh, cfg.train.global_batch_size = f"data=1,model={model}", gbs // data
  if hasattr(cfg.data, "init_checkpoint"):
    cfg.data.init_checkpoint = ""
  devices.prepare("jax", model)
  trainer = spec.make_trainer("jax", cfg, RunContext(seed=0, preset=args.preset,
                                                     describing=True))
  info = trainer.describe()
  ops, tensors, activation_bytes = (info.collectives_by_axis or {}).get(("all-reduce", "model"),
                                                                   (0, 0, 0))
  grad_bytes = info.parameter_bytes_per_device // 4 * GRAD_DTYPES[args.grad_dtype]
  out = {"layout": f"data={data},model={model}", "per_replica_batch": gbs // data,
         "gradient_bytes": grad_bytes, "model_all_reduces": ops,
         "model_all_reduce_tensors": tensors, "model_all_reduce_bytes": activation_bytes}
  hops = model if kind in ("torus", "mesh") else 1
  data_kwargs = {**kwargs, "link_latency": kwargs["link_latency"] * hops}
  if kind in ("torus", "mesh") and shape[0] % model == 0 and data > 1:
    data_topology = f"{kind}:" + "x".join(map(str, (shape[0] // model, *shape[1:])))
  elif kind == "multinode" and shape[1] % model == 0 and data > 1:
    data_topology = f"multinode:{shape[0]}x{shape[1] // model}"
  else:
    data_topology = f"ring:{data}"
  for name, topo, nbytes, count, figures in (
      ("data", data_topology, grad_bytes, 1 if data > 1 else 0, data_kwargs),
      ("model", f"ring:{model}", activation_bytes / max(ops, 1), ops if model > 1 else 0,
       kwargs)):
    if not count:
      out[name] = {"topology": "-", "algorithm": "-", "time_s": 0.0}
      continue
    machine = machine_lib.Machine(topo, **figures)
    best = min((tables.simulate(machine, "all-reduce", a, nbytes)
                for a in algorithms.applicable(machine, "all-reduce")),
               key=lambda r: r["time_s"])
    out[name] = {"topology": topo, "algorithm": best["algorithm"],
                 "time_s": best["time_s"] * count}
  out["step_collectives_s"] = out["data"]["time_s"] + out["model"]["time_s"]
  return out


def run(args) -> int:
  if args.measurements:
    from harness.commsim import calibrate
    out = calibrate.report()
    if args.json:
      print(json.dumps(out, indent=1, default=float))
    else:
      calibrate.print_report(out)
    return 0
  topology, kwargs, preset = machine_args(args)
  if args.mesh:
    if not args.workload:
      raise UsageError("--mesh times a workload's step; allowed: with --workload W")
    if "stage" in args.mesh:
      from harness.commsim import pipeline_step
      out = pipeline_step.run(args, topology, kwargs, GRAD_DTYPES[args.grad_dtype])
      if args.json:
        print(json.dumps(out, indent=1, default=float))
      else:
        pipeline_step.print_result(out, topology)
      return 0
    out = _layout_step(args, topology, kwargs)
    if args.json:
      print(json.dumps(out, indent=1, default=float))
      return 0
    print(f"machine:  {topology} ({args.machine or 'default figures'})")
    print(f"layout:   {out['layout']}, {out['per_replica_batch']} per replica "
          f"({args.workload}, {args.preset})")
    print(f"gradient all-reduce over data: {out['gradient_bytes'] / 1e6:.4g} MB per chip on "
          f"{out['data']['topology']} ({out['data']['algorithm']}): "
          f"{out['data']['time_s'] * 1e3:.4g} ms")
    print(f"all-reduces over model: {out['model_all_reduces']} ops ({out['model_all_reduce_tensors']}"
          f" tensors), {out['model_all_reduce_bytes'] / 1e6:.4g} MB per chip on "
          f"{out['model']['topology']} ({out['model']['algorithm']}): "
          f"{out['model']['time_s'] * 1e3:.4g} ms")
    print(f"step collectives (not overlapped): {out['step_collectives_s'] * 1e3:.4g} ms")
    return 0
  failed = [machine_lib.parse_chip(c) for c in args.failed]
  links = [machine_lib.parse_link(l) for l in args.failed_link]
  sweep = _counts(args.failure_sweep) if args.failure_sweep else ()
  nbytes = parse_bytes(args.bytes)
  machine = machine_lib.Machine(topology, **kwargs, failed_chips=failed, failed_links=links)
  if args.algorithm == "all":
    names = algorithms.applicable(machine, args.collective)
  else:
    if args.algorithm not in algorithms.ALGORITHMS:
      raise UsageError(f"--algorithm {args.algorithm!r} is not an algorithm; allowed: "
                       f"{', '.join(algorithms.ALGORITHMS)} or all")
    names = [args.algorithm]
    algorithms.build(machine, args.collective, args.algorithm)   # applicable here? (one line)
  if args.heatmap and (machine.kind not in ("mesh", "torus") or len(machine.shape) != 2):
    raise UsageError(f"--heatmap draws a 2-D mesh or torus; {topology} is not one")
  if args.heatmap:
    folder = os.path.dirname(os.path.abspath(args.heatmap))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
      raise UsageError(f"--heatmap {args.heatmap!r} cannot be written: {folder!r} is not a "
                       "writable folder")
  source = ""
  if args.workload:
    nbytes, source = _workload_bytes(args, len(machine.live_chips))

  out = {"machine": machine.describe(), "preset": args.machine or "",
         "link_figures": {k: v for k, v in kwargs.items() if k != "efficiency"},
         "efficiency": dataclasses.asdict(machine.efficiency), "bytes": nbytes,
         "results": [tables.simulate(machine, args.collective, n, nbytes, check=args.check)
                     for n in names]}
  if source:
    out["workload"] = source
  # with --workload the step's own table (8 to 4096 chips) says how it scales; the
  # collective's table (the same bytes on 8 to 1024 chips) when asked for
  if args.scaling:
    out["scaling"] = tables.scaling(kwargs, machine.kind, args.collective, names, nbytes,
                                    gpus_per_node=machine.shape[-1], dims=len(machine.shape))
  if args.workload and args.collective == "all-reduce":
    from harness.commsim import step
    out["step"] = step.run(args, machine, kwargs, preset, GRAD_DTYPES[args.grad_dtype])
  if sweep:
    out["failure_sweep"] = tables.failure_sweep(topology, kwargs, args.collective, names,
                                                nbytes, sweep, args.seed)
  if args.heatmap:
    best = min(out["results"], key=lambda r: r["time_s"])["algorithm"]
    from harness.commsim import timing
    result = timing.simulate(machine, algorithms.build(machine, args.collective, best), nbytes)
    out["heatmap"] = tables.heatmap(machine, result.link_bytes, args.heatmap,
                                    f"{args.collective} {best}, {nbytes / 1e6:g} MB per chip\n"
                                    f"{machine.describe()}")
  if args.json:
    print(json.dumps(out, indent=1, default=float))
    return 0
  _print(out, args, preset)
  return 0


def _efficiency_line(eff) -> str:
  protocols = eff["protocols"]
  if not protocols and eff["link"] == 1 and eff["network"] == 1 and not eff["nvls"]:
    return "ideal alpha-beta (no efficiency terms: --ideal, or a machine without measurements)"
  parts = [f"link efficiency {eff['link']:.3g}", f"network {eff['network']:.3g}"]
  if eff["launch"]:
    parts.append(f"launch {eff['launch'] * 1e6:.3g} us")
  for p in protocols:
    piece = "" if math.isinf(p["piece_bytes"]) else f" per {p['piece_bytes'] / 1e6:.3g} MB"
    parts.append(f"{p['name']} {p['step_latency'] * 1e6:.3g} us{piece} at "
                 f"{p['bandwidth_fraction']:.3g}")
  if eff["nvls"]:
    parts.append(f"NVLS {eff['nvls']:.3g} (+{eff['nvls_latency'] * 1e6:.3g} us)")
  return ", ".join(parts) + " (fitted: simulate --measurements)"


def _print(out, args, preset):
  import pandas as pd
  print(f"machine:  {out['machine']}")
  figures = out["link_figures"]
  print("links:    {:.4g} GB/s per direction, {:.3g} us per hop, {:.3g} us per message".format(
      figures["link_bandwidth"] / 1e9, figures["link_latency"] * 1e6, figures["overhead"] * 1e6)
        + (", network {:.4g} GB/s per rail".format(figures["network_bandwidth"] / 1e9)
           if figures["network_bandwidth"] else ""))
  if preset.source and not any(getattr(args, k) is not None for k in (
      "link_bandwidth", "link_latency", "overhead")):
    print(f"source:   {preset.source}")
  print("model:    " + _efficiency_line(out["efficiency"]))
  if "workload" in out:
    print(f"workload: {out['workload']}")
  print(f"{args.collective} of {out['bytes'] / 1e6:g} MB per chip:")
  columns = ["algorithm", "protocol", "time_s", "steps", "algbw_GBps", "busbw_GBps",
             "max_link_bytes", "busiest_link"] + (["functional_check"] if args.check else [])
  frame = pd.DataFrame(out["results"])[columns]
  frame["time_ms"] = frame.pop("time_s") * 1e3
  with pd.option_context("display.width", 200):
    print(frame.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
  if "scaling" in out:
    print(f"\nscaling ({args.collective} of {out['bytes'] / 1e6:g} MB per chip, time in ms):")
    frame = pd.DataFrame(out["scaling"])
    frame["chips"] = frame["participants"]
    table = frame.pivot_table(index=["chips", "topology"], columns="algorithm",
                              values="time_s", sort=False) * 1e3
    print(table.to_string(float_format=lambda v: f"{v:.4g}"))
  if "failure_sweep" in out:
    print("\nfailed chips (random, --seed {}): time in ms, slowdown against none".format(
        args.seed))
    frame = pd.DataFrame(out["failure_sweep"])
    frame["cell"] = [f"{t * 1e3:.4g} ({s:.3f}x)" for t, s in zip(frame["time_s"],
                                                                  frame["slowdown"])]
    table = frame.pivot_table(index=["failed"], columns="algorithm", values="cell",
                              aggfunc="first", sort=False)
    print(table.to_string())
    chips = frame.drop_duplicates("failed")[["failed", "failed_chips"]]
    print("chips: " + "; ".join(f"{f}: {c}" for f, c in zip(chips["failed"], chips["failed_chips"])
                                if f))
  if "heatmap" in out:
    print(f"\nheat map: {out['heatmap']}")
  if "step" in out:
    from harness.commsim import step
    step.print_step(out["step"])
