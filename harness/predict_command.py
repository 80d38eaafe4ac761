"""`run_benchmark.py predict`: the command line of harness/predict.py (its docstring has the
model): one prediction's breakdown, or the backtest table over MLPerf result folders."""
import json
import math

from harness.commsim import machine as machine_lib
from harness.errors import UsageError

LINK_FLAGS = ("link_bandwidth", "link_latency", "overhead", "injection_bandwidth",
              "network_bandwidth", "network_latency", "nics_per_node")


def add_parser(sub):
  p = sub.add_parser(
      "predict", help="time to train on a system you do not have, from one measured result",
      description="Predict MLPerf's time to train on a target system from one measured "
                  "result (an MLPerf result folder or this harness's result CSV): samples to "
                  "converge from the benchmark's RCPs, the measured step scaled to the "
                  "target's examples per chip, the gradient all-reduce simulated on the "
                  "target's topology, the evals. --backtest checks it on every scaling family "
                  "of MLPerf result folders. Framework-neutral.")
  p.add_argument("result", nargs="?", help="<org>/results/<system>/<benchmark> (with "
                                           "<org>/systems/<system>.json), or a result CSV")
  p.add_argument("--system", metavar="SYSTEM_JSON",
                 help="the target in MLPerf's system-description format (accelerator model, "
                      "accelerators per node, number of nodes)")
  p.add_argument("--chips", type=int, help="the target's chips (instead of --system)")
  p.add_argument("--machine", choices=sorted(machine_lib.PRESETS),
                 help="the target's simulator preset (default: from the accelerator's name)")
  p.add_argument("--topology", help=machine_lib.TOPOLOGY_SYNTAX +
                 " (default: the squarest torus of the chips, or nodes of the system's size)")
  p.add_argument("--batch", type=int, help="the target's global batch (default: the largest "
                                           "batch the RCPs cover that divides over the chips)")
  p.add_argument("--step-s", type=float, metavar="SECONDS",
                 help="the training step measured on one chip of the target's accelerator at "
                      "the measured run's examples per chip: required where the measured run's "
                      "accelerator has no simulator preset (a CPU or simulated-device row of "
                      "this harness) and the target's differs; it replaces the measured step")
  p.add_argument("--backtest", nargs="+", metavar="FOLDER",
                 help="every scaling family in these MLPerf result folders, each larger "
                      "system predicted from the family's smallest")
  p.add_argument("--calibrate", action="store_true",
                 help="with --backtest: print the model-error term of the stated range (the "
                      "split-conformal quantile of the backtest's |log error|) to set as "
                      "MODEL_ERROR in harness/predict.py")
  p.add_argument("--json", action="store_true", help="print JSON")
  g = p.add_argument_group("link figures (a machine without a preset, as simulate takes them)")
  g.add_argument("--link-bandwidth", type=float, metavar="GB/S", help="per direction")
  g.add_argument("--link-latency", type=float, metavar="US", help="per hop")
  g.add_argument("--overhead", type=float, metavar="US", help="per message")
  g.add_argument("--injection-bandwidth", type=float, metavar="GB/S")
  g.add_argument("--network-bandwidth", type=float, metavar="GB/S")
  g.add_argument("--network-latency", type=float, metavar="US")
  g.add_argument("--nics-per-node", type=int, metavar="K")


def _target(args, measured):
  """The target system (predict.Target) from --system, or --chips with --machine (or link
  figures)."""
  from harness import predict
  from harness.commsim import command as simulate_command
  if args.system and args.chips:
    raise UsageError("--system and --chips both given; allowed: one of them")
  links = any(getattr(args, f) is not None for f in LINK_FLAGS)
  if args.system:
    desc = predict.read_system_json(args.system)
    machine = args.machine or predict.machine_of(desc["accelerator"], desc["system_name"])
    chips, per_node, accelerator = desc["chips"], desc["per_node"], desc["accelerator"]
  elif args.chips is not None:
    machine, chips, per_node = args.machine or measured.machine, args.chips, 8
    accelerator = measured.accelerator
  else:
    raise UsageError("a target is required; allowed: --system SYSTEM_JSON, or --chips N "
                     "with --machine M (or link figures)")
  if links:
    if not args.topology:
      raise UsageError("link figures need --topology (e.g. torus:32x32 or multinode:16x8)")
    args.ideal = machine is None
    args.machine = machine
    topology, kwargs, _ = simulate_command.machine_args(args)
    kind, shape = machine_lib.parse_topology(topology)
    if math.prod(shape) != chips:
      raise UsageError(f"--topology {topology} has {math.prod(shape)} chips, the target "
                       f"{chips}; allowed: a topology of {chips} chips")
    return predict.Target(chips, machine, topology, kwargs, accelerator,
                          f"{machine or 'given links'} {topology}")
  if machine is None:
    raise UsageError(f"accelerator {accelerator!r} has no simulator preset; allowed: --machine "
                     f"{'/'.join(machine_lib.PRESETS)}, or link figures (--link-bandwidth and "
                     "the rest, with --topology)")
  if args.topology:
    kind, shape = machine_lib.parse_topology(args.topology)
    if math.prod(shape) != chips:
      raise UsageError(f"--topology {args.topology} has {math.prod(shape)} chips, the target "
                       f"{chips}; allowed: a topology of {chips} chips")
  return predict.make_target(chips, machine, args.topology, accelerator, per_node)


def run(args) -> int:
  from harness import predict    # pandas and the summarizer: not needed to build the parser
  if args.calibrate and not args.backtest:
    raise UsageError("--calibrate needs --backtest FOLDER...: the model's error is measured "
                     "on a backtest")
  if args.backtest:
    rows = predict.backtest(args.backtest)
    if args.calibrate:
      error = predict.conformal_model_error(rows)
      print(f"MODEL_ERROR = {math.ceil(error * 1000) / 1000} (|log(predicted / measured)|, "
            f"level {predict.MODEL_ERROR_LEVEL:g} of {predict.backtest_summary(rows)['predicted']}"
            f" scored pairs; now {predict.MODEL_ERROR})")
      return 0
    if args.json:
      print(json.dumps([{k: r.get(k) for k in predict.BACKTEST_KEYS} for r in rows],
                       indent=1))
    else:
      print_backtest(rows)
    return 0
  if not args.result:
    raise UsageError("a RESULT is required (an MLPerf result folder or a result CSV), or "
                     "--backtest FOLDER...")
  measured = predict.read_result(args.result)
  if args.batch is not None and args.batch < 1:
    raise UsageError(f"--batch {args.batch} is out of range; allowed: >= 1")
  out = predict.predict(measured, _target(args, measured), args.batch, args.step_s)
  if args.json:
    print(json.dumps(out, indent=1))
  else:
    print_breakdown(out)
  return 0


def print_breakdown(out):
  from harness import predict
  unit = "samples" if out["sample_unit"] != "epochs" else "samples"
  measured = (f"; its score {out['measured_minutes']:.3f} min"
              if out["measured_minutes"] else "")
  print(f"from:      {out['benchmark']} on {out['from']}: {out['from_chips']} chips, batch "
        f"{out['from_batch']}{measured}")
  print(f"to:        {out['to']}: {out['chips']} chips, global batch {out['batch']} "
        f"({out['per_chip']:.4g} a chip)")
  print(f"converge:  {out['samples_mean']:,.0f} {unit} ({out['samples_low']:,.0f} .. "
        f"{out['samples_high']:,.0f}); {out['convergence']}")
  print(f"steps:     {out['steps_mean']:,} ({out['steps_low']:,} .. {out['steps_high']:,})")
  if out["same_system"]:
    print(f"step:      the measured system at its own batch: each run's own step (median "
          f"{out['measured_step_s'] * 1e3:.4g} ms) and evals, unchanged")
  else:
    given = (f"given {out['given_step_s'] * 1e3:.4g} ms on one chip (the run measured "
             f"{out['measured_step_s'] * 1e3:.4g} ms)" if out["given_step_s"] else
             f"measured {out['measured_step_s'] * 1e3:.4g} ms (less "
             f"{out['source_exposed_s'] * 1e3:.3g} ms of exposed all-reduce)")
    achieved = (f"; the source ran at {out['achieved_fraction']:.1%} of the bf16 peak"
                if out.get("achieved_fraction") else "")
    print(f"step:      {given} -> compute {out['compute_s'] * 1e3:.4g} ms a step here "
          f"({out['fixed_s'] * 1e3:.3g} ms fixed: "
          + (f"the {out['floor_s'] * 1e3:g} ms floor and " if out["floor_s"] else
             "no floor (the source's step is shorter than it), ")
          + "the optimizer's update"
          f"{', capped at half the source compute' if out['update_capped'] else ''}; the rest "
          f"per example; chip speed x{out['chip_speed']:.3g}{achieved})")
    if out.get("layout"):
      print(f"layout:    {out['layout']}")
    if out.get("all_to_all_s"):
      share = out.get("all_to_all_share")
      print(f"all-to-all: {out['all_to_all_s'] * 1e3:.4g} ms a step (DLRM's pooled vectors "
            "out and their gradients back, not overlapped"
            + (f"; {share:.4g} of them travel: the hybrid embedding's infrequent rows)"
               if share is not None and share < 1 else ")"))
    print(f"figures:   {out['figures_source']}")
    print(f"all-reduce: {out['all_reduced_parameters']:,.0f} parameters a replica x "
          f"{out['gradient_bytes']} B: "
          f"{out['all_reduce_s'] * 1e3:.4g} ms, {out['exposed_s'] * 1e3:.4g} ms exposed after "
          f"the backward pass -> each run's step x{out['step_ratio']:.4g} (median "
          f"{out['step_s'] * 1e3:.4g} ms)")
  print(f"evals:     {out['evals_mean']:.3g} x {out['eval_s']:.3g} s"
        + (f", and {out['tail_s']:.3g} s at the end waiting on the last one's host part "
           "(asynchronous evals)" if out.get("tail_s") else ""))
  print(f"predicted: {out['minutes_mean']:.3f} minutes ({out['minutes_low']:.3f} .. "
        f"{out['minutes_high']:.3f}: the fastest and slowest of the {out['runs']} measured "
        f"runs carried over), {out['scoring']}, run_start to run_stop")
  print(f"range:     {out['range_low']:.3f} .. {out['range_high']:.3f} minutes (x/÷ "
        f"{1 + out['range_relative']:.3f}: the model's own error, {out['range_model']:.3g} as a "
        f"log ratio, with +-{out['range_runs']:.1%}: {predict.RANGE_SIGMAS:g} standard errors "
        "of the source runs' spread, the RCP's at the target's batch and the RCP ratio's)")


def print_backtest(rows):
  import pandas as pd                            # pylint: disable=import-outside-toplevel
  from harness import predict
  if not rows:
    print("no scaling family (the same round, submitter, benchmark and accelerator at two or "
          "more system sizes) in these folders: nothing to predict")
    return
  frame = pd.DataFrame(rows, columns=["family", "from", "to", "predicted_minutes",
                                      "measured_minutes", "error"])
  frame["error"] = frame["error"].map(lambda e: "" if e is None or e != e else f"{e:+.1%}")
  with pd.option_context("display.width", 250, "display.max_colwidth", 90,
                         "display.max_rows", None):
    print(frame.to_string(index=False, float_format=lambda v: f"{v:.3f}", na_rep="-"))
  refused = [r for r in rows if r["reason"]]
  if refused:                      # in full, one line each: they name the file and the field
    print("refused:")
    for r in refused:
      print(f"  {r['family']} -> {r['to']}: {r['reason']}")
  groups = predict.backtest_groups(rows)
  if groups:
    print("by accelerator and benchmark:")
    table = pd.DataFrame(groups)
    for key in ("median_abs_error", "worst_abs_error", "inside_share"):
      table[key] = table[key].map(lambda v: "-" if v is None else f"{v:.1%}")
    print(table.to_string(index=False))
  summary = predict.backtest_summary(rows)
  line = (f"{summary['predicted']} predicted, {summary['refused']} refused, "
          f"{summary['unscored']} without a measured score")
  if summary["predicted"]:
    line += (f"; |error| median {summary['median_abs_error']:.1%}, worst "
             f"{summary['worst_abs_error']:.1%}; measured inside the stated range in "
             f"{summary['inside']} of {summary['predicted']} ({summary['inside_share']:.0%})")
  print(line)
