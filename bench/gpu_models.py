"""Training-step throughput and MFU of the JAX models on one accelerator, at the workloads'
reference model shapes: every registered workload whose folder has a bare_step.py (its model,
loss, synthetic batch, per-device batch and public anchor: workloads/common/jax_bare_step.py).

Each step is the model's whole training step (forward, backward, optimizer update) compiled
with jit, the state donated, on one synthetic batch of the input pipeline's shapes and dtypes
(spec.batch_layout) reused every step; parameters float32, compute in --dtype (bfloat16 by
default, as the reference presets' train.precision). The model and its train-mode call (batch
norm statistics updated through mutable=['batch_stats'], dropout keyed per step) are built as
each workload's jax_trainer.py builds them; the losses are the trainers' (from each
workload's jax_model and common/jax_top1); the optimizer is plain optax SGD with
momentum or AdamW in place of the recipes' LARS / LAMB / RMSProp / TF-Adam (an elementwise
update, small next to the model), and EfficientNet's weight EMA is left out.

Reported per workload: the per-device batch, step time, samples/s (transformer: packed rows of
256 tokens), model FLOPs per step from XLA's cost analysis of the lowered step or else the
jaxpr's count (per sample in the table; `step_flops`), the TFLOP/s they make and MFU against
the device's dense bf16 peak (harness/devices.py's table: H100/H200 989e12, H100 PCIe 756e12,
A100 312e12; otherwise n/a),
under --dtype float32 too (XLA's GPU matmuls then run in TF32). A workload that fails (e.g. out
of memory: lower its --batch) prints one line and is left out of the table; the exit status is
then 1.

It runs outside the harness (no driver, trainer, recipe optimizer or input pipeline): it is the
bare-step peer bench/gpu_harness.py measures the harness's own synthetic run against. It imports
workloads.<w>.bare_step (and through it the workload's jax_model and spec,
workloads.common.jax_top1, transformer.mini_corpus for the synthetic packed rows); no
TensorFlow.

  python bench/gpu_models.py [--workloads bert,efficientnet,resnet50,ssd,transformer]
      [--steps 20] [--batch resnet50=256,bert=32] [--dtype bfloat16|float32]
      [--out bench_gpu.csv] [--preset reference] [--set KEY=VALUE ...] [--profile FILE]
"""
import argparse
import csv
import gc
import importlib
import logging
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from harness import devices  # noqa: E402  pylint: disable=wrong-import-position

devices.prepare_jax_gpu()   # the harness's GPU XLA flags, so the bare step is its like-for-like peer

import jax  # noqa: E402  pylint: disable=wrong-import-position,wrong-import-order
import jax.numpy as jnp  # noqa: E402  pylint: disable=wrong-import-position
import optax  # noqa: E402  pylint: disable=wrong-import-position

from bench import trace_summary  # noqa: E402  pylint: disable=wrong-import-position
from harness import registry  # noqa: E402  pylint: disable=wrong-import-position
from workloads.parallel import jax_flops  # noqa: E402  pylint: disable=wrong-import-position

WARMUP_STEPS = 2
PROFILE_STEPS = 3                 # steps traced by --profile, after the timed ones
# XLA's backend optimisation level 0 for the one-off parameter initialisation (as
# jax_trainer_base.initial_state): the same values, a much shorter compile on CPU.
LEVEL_0 = {"xla_backend_optimization_level": 0}
# (preset, --set overrides) the builders configure their workload with: the reference shapes,
# or (--preset, --set) a smaller model for a check on a CPU (tests/bench/test_gpu_harness.py).
SHAPES = ["reference", []]
COLUMNS = ("workload", "batch", "step_ms", "samples_per_s", "gflop_per_sample", "tflops", "mfu",
           "loss")


# ----------------------------------------------------------------------------- device

def memory_gb(compiled):
  """Device memory the compiled step uses (arguments + outputs + temporaries, aliased bytes
  counted once), in GB, or None where the backend does not say."""
  try:
    m = compiled.memory_analysis()
    total = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
             - m.alias_size_in_bytes)
    return total / 1e9
  except Exception:  # pylint: disable=broad-except
    return None


# ----------------------------------------------------------------------------- workloads
# workload -> its bare step module, workloads/<w>/bare_step.py (workloads/common/jax_bare_step.py
# says what one holds), for each registered workload that has one, in the registry's order. Each
# is the workload's own by necessity: a model's train-mode call, its loss and its batch's value
# ranges live in jax_trainer.py and input_pipeline.py, which import TensorFlow (absent from the
# GPU image). A registered workload without one is listed as such.
BARE_STEPS = {name: importlib.import_module(module) for name in registry.names()
              for module in [registry.get(name).own_module("bare_step")] if module}
WORKLOADS = tuple(BARE_STEPS)
# Per-device batches that fit an 80 GB GPU in bf16 without rematerialisation (each module's).
DEFAULT_BATCH = {name: module.GPU_BATCH for name, module in BARE_STEPS.items()}


# ----------------------------------------------------------------------------- the step

def check_layout(spec, cfg, data, batch):
  """The synthetic batch has exactly spec.batch_layout's keys, shapes and dtypes."""
  layout = spec.SPEC.batch_layout(cfg, batch)
  if set(layout) != set(data):
    raise ValueError(f"batch keys {sorted(data)} differ from spec.batch_layout's {sorted(layout)}")
  for k, (shape, dtype, _) in layout.items():
    if tuple(data[k].shape) != tuple(shape) or data[k].dtype != np.dtype(dtype):
      raise ValueError(f"batch[{k!r}] is {data[k].shape} {data[k].dtype}, the layout "
                       f"{shape} {dtype}")


def make_train_step(loss_fn, tx):
  def train_step(state, batch):
    key = jax.random.fold_in(state["dropout_key"], state["step"])

    def objective(params):
      return loss_fn(params, state.get("batch_stats"), batch, key)
    (loss, stats), grads = jax.value_and_grad(objective, has_aux=True)(state["params"])
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    new = dict(state, params=optax.apply_updates(state["params"], updates),
               opt_state=opt_state, step=state["step"] + 1)
    if stats is not None:
      new["batch_stats"] = stats
    return new, loss
  return train_step


def compile_init(create, key):
  try:
    return jax.jit(create).lower(key).compile(compiler_options=LEVEL_0)
  except Exception:  # pylint: disable=broad-except  # an XLA without the option: default
    return jax.jit(create).lower(key).compile()


def bytes_accessed(compiled):
  """XLA's estimate of the bytes the compiled step reads and writes (its cost analysis: each
  fusion's and library call's operands and results), or None where it answers nothing."""
  try:
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    value = float((analysis or {}).get("bytes accessed", 0.0))
    return value or None
  except Exception:  # pylint: disable=broad-except
    return None


def profile(name, batch, compiled, state, data, step_s, path):
  """Traces PROFILE_STEPS steps with jax.profiler and appends to `path` where the device's time
  goes (bench/trace_summary.py) and the step's bytes over its time against the device's HBM
  bandwidth. -> the state after the traced steps (donated in, so it must be carried on)."""
  import tempfile  # pylint: disable=import-outside-toplevel
  kind = jax.devices()[0].device_kind
  moved, bandwidth = bytes_accessed(compiled), devices.peak_bandwidth(kind)
  lines = [f"{name} bare step, batch {batch}, {kind}: {step_s * 1e3:.2f} ms a step"]
  if moved:
    rate = moved / step_s
    lines.append(f"  bytes accessed (XLA's estimate, compiled step) {moved / 1e9:.2f} GB a step: "
                 f"{rate / 1e12:.2f} TB/s" + (f" = {rate / bandwidth:.0%} of the card's "
                                               f"{bandwidth / 1e12:.2f} TB/s" if bandwidth else ""))
  with tempfile.TemporaryDirectory(prefix="trace-") as folder:
    try:
      with jax.profiler.trace(folder, create_perfetto_trace=True):
        for _ in range(PROFILE_STEPS):
          state, loss = compiled(state, data)
        jax.block_until_ready((state, loss))
      found = trace_summary.trace_file(folder)
      summary = trace_summary.summarize(trace_summary.load_events(found), PROFILE_STEPS) \
          if found else None
      lines.append(trace_summary.format_summary(f"  trace of {PROFILE_STEPS} steps", summary))
    except Exception as e:  # pylint: disable=broad-except  # a profiler-less build: say so
      lines.append(f"  trace failed: {type(e).__name__}: {str(e)[:300]}")
  text = "\n".join(lines)
  print(text, flush=True)
  with open(path, "a") as f:
    f.write(text + "\n\n")
  return state


def bench(name, batch, dtype, steps, seed=0, profile_path=None):
  """-> the table row of one workload (and, with `profile_path`, its trace summary there)."""
  t0 = time.perf_counter()
  w = BARE_STEPS[name].build(batch, dtype, np.random.default_rng(seed + 1), SHAPES)
  check_layout(w["spec"], w["cfg"], w["batch"], batch)
  tx = w["tx"]

  def create(key):
    init_key, dropout_key = jax.random.split(key)
    variables = w["init"](init_key)
    state = {"params": variables["params"], "opt_state": tx.init(variables["params"]),
             "step": jnp.zeros((), jnp.int32), "dropout_key": dropout_key}
    if "batch_stats" in variables:
      state["batch_stats"] = variables["batch_stats"]
    return state

  key = jax.random.key(seed)
  state = compile_init(create, key)(key)
  n_params = sum(x.size for x in jax.tree.leaves(state["params"]))
  data = jax.device_put(w["batch"])
  t1 = time.perf_counter()
  lowered = jax.jit(make_train_step(w["loss"], tx), donate_argnums=0).lower(state, data)
  compiled = lowered.compile()
  t2 = time.perf_counter()
  flops, source = jax_flops.step_flops(make_train_step(w["loss"], tx), lowered, state, data)

  for _ in range(WARMUP_STEPS):
    state, loss = compiled(state, data)
  jax.block_until_ready((state, loss))
  start = time.perf_counter()
  for _ in range(steps):
    state, loss = compiled(state, data)
  jax.block_until_ready((state, loss))
  elapsed = time.perf_counter() - start

  step_s = elapsed / steps
  if profile_path:
    state = profile(name, batch, compiled, state, data, step_s, profile_path)
  peak = devices.peak_flops(jax.devices()[0].device_kind)
  achieved = flops / step_s if flops else None
  mem = memory_gb(compiled)
  print(f"  {name}: {w['shapes']}; {n_params / 1e6:.1f}M params; build+init "
        f"{t1 - t0:.1f} s, compile {t2 - t1:.1f} s; loss {float(loss):.4g}; "
        f"{'?' if not flops else f'{flops / 1e12:.3f}'} TFLOP/step ({source})"
        + (f"; {mem:.1f} GB" if mem is not None else ""), flush=True)
  return {"workload": name, "batch": batch, "step_ms": step_s * 1e3,
          "samples_per_s": batch / step_s,
          "gflop_per_sample": flops / batch / 1e9 if flops else None,
          "tflops": achieved / 1e12 if achieved else None,
          "mfu": achieved / peak if achieved and peak else None,
          "loss": float(loss)}          # the last step's: a NaN step's speed is no figure


# ----------------------------------------------------------------------------- output

def fmt(value, digits):
  if value is None:
    return "n/a"
  return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


DIGITS = {"step_ms": 2, "samples_per_s": 1, "gflop_per_sample": 2, "tflops": 1, "mfu": 3,
          "loss": 4}


def print_table(rows):
  cells = [COLUMNS] + [tuple(fmt(r[c], DIGITS.get(c, 0)) for c in COLUMNS) for r in rows]
  widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
  for i, row in enumerate(cells):
    print("  ".join(c.ljust(w) if j == 0 else c.rjust(w)
                    for j, (c, w) in enumerate(zip(row, widths))))
    if i == 0:
      print("  ".join("-" * w for w in widths))


def write_csv(path, rows, columns=COLUMNS):
  """`rows` (dicts) as CSV: None blank, floats to 6 significant digits."""
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(columns)
    for r in rows:
      writer.writerow(["" if r[c] is None else (f"{r[c]:.6g}" if isinstance(r[c], float)
                                                else r[c]) for c in columns])


def parse_batches(text):
  batches = dict(DEFAULT_BATCH)
  for item in filter(None, (s.strip() for s in (text or "").split(","))):
    name, sep, value = item.partition("=")
    if not sep or name not in WORKLOADS or not value.isdigit() or int(value) < 1:
      raise SystemExit(f"--batch {item!r}: allowed NAME=N with NAME one of {', '.join(WORKLOADS)}"
                       " and N a positive integer")
    batches[name] = int(value)
  return batches


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workloads", default=",".join(WORKLOADS),
                      help="comma list of " + ", ".join(WORKLOADS))
  parser.add_argument("--steps", type=int, default=20, help="timed steps (after 2 of warm-up)")
  parser.add_argument("--batch", default="",
                      help="per-device batches as name=value pairs, e.g. resnet50=128,bert=16 "
                           "(defaults: " + ",".join(f"{k}={v}" for k, v in DEFAULT_BATCH.items())
                           + ")")
  parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                      help="compute dtype (parameters stay float32)")
  parser.add_argument("--out", default="bench_gpu.csv", help="CSV of the table")
  parser.add_argument("--preset", default="reference",
                      help="the workloads' preset whose model shapes are stepped (default "
                           "reference; tiny for a quick check on a CPU)")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="config overrides, as run_benchmark.py's --set")
  parser.add_argument("--profile", default="", metavar="FILE",
                      help=f"after the timed steps trace {PROFILE_STEPS} more with jax.profiler "
                           "and append to FILE where the device's time goes (kernels by time, "
                           "busy fraction, bytes against the card's bandwidth)")
  args = parser.parse_args(argv)
  SHAPES[:] = [args.preset, args.set]
  names = [n.strip() for n in args.workloads.split(",") if n.strip()]
  unknown = [n for n in names if n not in WORKLOADS]
  if unknown or not names:
    unbuilt = [n for n in registry.names() if n not in BARE_STEPS]
    raise SystemExit(f"--workloads {args.workloads!r}: allowed a comma list of "
                     f"{', '.join(WORKLOADS)}" + (f" ({', '.join(unbuilt)}: registered, but "
                                                  "no bare_step.py in its folder)" if unbuilt else ""))
  if args.steps < 1:
    raise SystemExit("--steps: allowed a positive integer")
  batches = parse_batches(args.batch)
  dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32

  device = jax.devices()[0]
  peak = devices.peak_flops(device.device_kind)
  print(f"jax {jax.__version__} on {jax.default_backend()}: {device.device_kind} "
        f"({jax.device_count()} device(s), using 1); compute {args.dtype}; peak "
        f"{'unknown (MFU n/a)' if peak is None else f'{peak / 1e12:.0f} TFLOP/s dense bf16'}; "
        f"{args.steps} timed steps after {WARMUP_STEPS} of warm-up", flush=True)

  rows, failures = [], []
  for name in names:
    try:
      rows.append(bench(name, batches[name], dtype, args.steps, profile_path=args.profile))
    except Exception as e:  # pylint: disable=broad-except
      message = " ".join(f"{type(e).__name__}: {e}".split())
      failures.append(name)
      print(f"  {name}: FAILED at batch {batches[name]}: {message[:400]}", flush=True)
    gc.collect()                      # free the last workload's device buffers

  print()
  print_table(rows)
  write_csv(args.out, rows)
  print(f"\nwrote {args.out}" + (f"; failed: {', '.join(failures)}" if failures else ""))
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
