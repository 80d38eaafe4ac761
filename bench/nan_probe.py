"""Where a harness run's loss turns NaN: the workload's own JAX train step (the trainer's, with
its recipe's optimizer, precision and synthetic batch), run step by step without donation,
checked on the host after every step; at the first non-finite loss or state it names the
state's non-finite leaves and re-runs that step under `jax.debug_nans`, which names the
primitive that made the first NaN (and its line in the model).

  python bench/nan_probe.py efficientnet [--preset synthetic] [--steps 20] [--set KEY=VALUE ...]

A diagnostic for a GPU box (the harness run aborts at a NaN loss, as the rules require, and the
AOT-compiled, donated step cannot be re-run); it prints one line a step and exits 1 at a NaN.
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from harness import devices, registry  # noqa: E402  pylint: disable=wrong-import-position
from harness.workload import RunContext  # noqa: E402  pylint: disable=wrong-import-position


def nonfinite_leaves(tree, limit=8):
  """The paths of up to `limit` leaves of `tree` holding a NaN or an infinity."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  bad = []
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    value = np.asarray(jax.device_get(leaf))
    if value.dtype.kind == "f" or str(value.dtype) == "bfloat16":
      if not np.isfinite(value.astype(np.float32)).all():
        bad.append(jax.tree_util.keystr(path))
        if len(bad) == limit:
          break
  return bad


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
  parser.add_argument("workload")
  parser.add_argument("--preset", default="synthetic")
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  args = parser.parse_args(argv)
  devices.prepare("jax", None)
  import jax  # pylint: disable=import-outside-toplevel

  spec = registry.get(args.workload)
  cfg = spec.configure(args.preset, args.set)
  trainer = spec.make_trainer("jax", cfg, RunContext(seed=0, preset=args.preset))
  trainer.init()
  state, batch = trainer.state, trainer.synthetic_batch()
  step = jax.jit(trainer._train_fn)           # pylint: disable=protected-access
  print(f"{args.workload} ({args.preset}, {cfg.train.precision}) on {jax.devices()[0].device_kind}",
        flush=True)
  for i in range(args.steps):
    with trainer.runtime.tracing():
      new_state, loss = step(state, batch)
    loss = float(loss)
    bad = nonfinite_leaves(new_state)
    print(f"step {i}: loss {loss:.4f}" + (f"; non-finite: {', '.join(bad)}" if bad else ""),
          flush=True)
    if bad or loss != loss or abs(loss) == float("inf"):
      print("re-running this step under jax.debug_nans:", flush=True)
      try:
        with jax.debug_nans(True), trainer.runtime.tracing():
          jax.block_until_ready(step(state, batch))
        print("debug_nans found no NaN (an infinity, or a NaN only in the compiled fusion)")
      except FloatingPointError as e:
        print(f"FloatingPointError: {e}".splitlines()[0])
        import traceback  # pylint: disable=import-outside-toplevel
        frames = [f for f in traceback.extract_tb(e.__traceback__) if "/workloads/" in f.filename]
        for f in frames[-8:]:
          print(f"  {os.path.relpath(f.filename, ROOT)}:{f.lineno} {f.name}: {f.line}")
      return 1
    state = new_state
  return 0


if __name__ == "__main__":
  sys.exit(main())
