"""Where a device's step time goes, from a `jax.profiler` trace (issue 53: a missed goal shows
what bounds it).

`jax.profiler.trace(dir, create_perfetto_trace=True)` writes the trace as Chrome-trace JSON
(`perfetto_trace.json.gz` under dir/plugins/profile/<run>/). `summarize` reads its device
processes' complete events (the kernels, `ph: X`, in processes named `/device:...`), and gives
the device's busy time (the union of its kernels' intervals, so overlapping streams count once)
over the traced window, per step, and the kernels by total time, each in a category read from
its name (matmul, convolution, attention, fusion, copy, collective). A device busy nearly all
the window is bound by its kernels (then by bandwidth where fusions lead); one idle much of it
waits on the host. Plain JSON: the xplane protobuf would need TensorFlow or xprof, which a JAX
image lacks.
"""
import collections
import glob
import gzip
import json
import os
import re

# first match wins: attention before convolution (cuDNN's fused attention kernels name cudnn)
CATEGORIES = (
    ("attention", re.compile(r"flash|fmha|sdpa|attention|softmax", re.I)),
    # conv but not XLA's convert fusions (the H100 run of 2026-11-27 counted those as convolutions)
    ("convolution", re.compile(r"conv(?!ert)|dgrad|wgrad|fprop|cudnn", re.I)),
    ("matmul", re.compile(r"gemm|cublas|cutlass|nvjet|xmma|wgmma|matmul|\bdot", re.I)),
    ("collective", re.compile(r"nccl|all-reduce|all_reduce|all-gather|reduce-scatter", re.I)),
    ("copy", re.compile(r"copy|memcpy|memset|transpose", re.I)),
    ("fusion", re.compile(r"fusion|reduce|loop_|input_|scatter|gather|select", re.I)),
)


def category(name):
  return next((c for c, pattern in CATEGORIES if pattern.search(name)), "other")


def trace_file(trace_dir):
  """The newest Chrome-trace JSON under `trace_dir` (None where there is none)."""
  for pattern in ("perfetto_trace.json.gz", "*.trace.json.gz"):
    paths = glob.glob(os.path.join(trace_dir, "**", pattern), recursive=True)
    if paths:
      return max(paths, key=os.path.getmtime)
  return None


def load_events(path):
  with gzip.open(path, "rt") as f:
    data = json.load(f)
  return data["traceEvents"] if isinstance(data, dict) else data


def device_events(events):
  """The complete events of the processes named /device:... (not /host:...)."""
  names = {e["pid"]: e.get("args", {}).get("name", "") for e in events
           if e.get("ph") == "M" and e.get("name") == "process_name"}
  devices = {pid for pid, name in names.items() if name.startswith("/device:")}
  return [e for e in events if e.get("ph") == "X" and e.get("pid") in devices and "dur" in e]


def busy_time(events):
  """Microseconds in which at least one of `events` ran (their intervals' union)."""
  total, end = 0.0, None
  for start, stop in sorted((e["ts"], e["ts"] + e["dur"]) for e in events):
    if end is None or start > end:
      total += stop - start
      end = stop
    elif stop > end:
      total += stop - end
      end = stop
  return total


def summarize(events, steps, top=12):
  """{'window_ms', 'busy_ms', 'busy_fraction', 'per_step_ms', 'categories': {category: ms a
  step}, 'top': [(kernel, category, ms a step, share of busy)]} of a trace of `steps` steps."""
  kernels = device_events(events)
  if not kernels:
    return None
  window = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
  busy = busy_time(kernels)
  by_name = collections.Counter()
  for e in kernels:
    by_name[e["name"]] += e["dur"]
  by_category = collections.Counter()
  for name, dur in by_name.items():
    by_category[category(name)] += dur
  kernel_total = sum(by_name.values())
  return {"window_ms": window / 1e3, "busy_ms": busy / 1e3,
          "busy_fraction": busy / window if window else 0.0,
          "per_step_ms": busy / 1e3 / steps,
          "categories": {c: d / 1e3 / steps for c, d in by_category.most_common()},
          "top": [(name, category(name), dur / 1e3 / steps, dur / kernel_total)
                  for name, dur in by_name.most_common(top)]}


def format_summary(title, summary):
  if summary is None:
    return f"{title}: the trace has no device kernels"
  lines = [f"{title}: device busy {summary['busy_fraction']:.1%} of the traced window "
           f"({summary['busy_ms']:.1f} of {summary['window_ms']:.1f} ms; "
           f"{summary['per_step_ms']:.2f} ms busy a step)",
           "  by category (ms a step): " + ", ".join(
               f"{c} {ms:.2f}" for c, ms in summary["categories"].items())]
  for name, cat, ms, share in summary["top"]:
    lines.append(f"  {ms:8.3f} ms  {share:6.1%}  {cat:<11} {name[:110]}")
  return "\n".join(lines)
