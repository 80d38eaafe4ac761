"""The DLRM eval's AUC: computed on the device (jax_auc.py: sort and integer counts, the scores
never leaving the device; tf_auc.py: the same count with TF ops) against the host AUC
(auc.roc_auc: SciPy's average ranks in float64 of scores already on the host), on this
machine's default device, for N examples in eval batches of 65,536 (the reference's): scores
rounded to 4 decimals (ties), 25% positive.

  device (jax)  the batches as device arrays -> jax_auc.roc_auc_counts -> three integers
  device (tf)   the batches as TF tensors -> tf_auc.roc_auc_counts
  host          the batches already copied to the host (the copy itself not timed: on a CPU
                it is none) -> concatenated -> auc.roc_auc

The JAX program is compiled once before timing (the eval compiles it at its first finalize).
Each size is timed in --repeats interleaved rounds (bench/method.py); printed: each side's
median seconds and the ratio device / host per round (median, min-max).

  python bench/dlrm_auc.py [--sizes 1000000,10000000] [--repeats 5]
"""
import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import method  # noqa: E402  pylint: disable=wrong-import-position

BATCH = 65536


def batches(n, seed=0):
  import numpy as np
  rng = np.random.default_rng(seed)
  labels = (rng.random(n) < 0.25).astype(np.float32)
  scores = np.round(rng.random(n) * 0.7 + labels * 0.2, 4).astype(np.float32)
  cut = list(range(BATCH, n, BATCH))
  return np.split(scores, cut), np.split(labels, cut), np.split(np.ones(n, np.float32), cut)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="1000000,10000000")
  method.add_repeats_arg(parser)
  args = parser.parse_args()
  import jax
  import numpy as np
  import tensorflow as tf
  from workloads.dlrm import auc, jax_auc, tf_auc

  print(f"JAX device {jax.devices()[0].device_kind}, {os.cpu_count()} CPUs")
  for n in (int(s) for s in args.sizes.split(",")):
    scores, labels, masks = batches(n)
    on_jax = [[jax.device_put(x) for x in xs] for xs in (scores, labels, masks)]
    on_tf = [[tf.constant(x) for x in xs] for xs in (scores, labels, masks)]
    jax_auc.roc_auc_counts(*on_jax)                      # compiled once, as the eval does
    tf_auc.roc_auc_counts(*on_tf)

    def timed(fn):
      def measure():
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
      return measure

    def host():
      keep = np.concatenate(masks) > 0
      return auc.roc_auc(np.concatenate(scores)[keep], np.concatenate(labels)[keep])

    want = host()
    for name, got in (("jax", jax_auc.roc_auc(*on_jax)), ("tf", tf_auc.roc_auc(*on_tf))):
      assert abs(got - want) < 1e-12, (name, got, want)
    print(f"{n:,} examples ({len(scores)} batches), AUC {want:.6f}:")
    values = method.interleaved({"device-jax": timed(lambda: jax_auc.roc_auc_counts(*on_jax)),
                                 "device-tf": timed(lambda: tf_auc.roc_auc_counts(*on_tf)),
                                 "host": timed(host)}, args.repeats, log=None)
    for name, vs in values.items():
      print(f"  {name}: median {np.median(vs):.3f} s")
    for side in ("device-jax", "device-tf"):
      print("  " + method.ratio_line(f"{side} / host (time)", method.ratios(values, side,
                                                                             "host")))


if __name__ == "__main__":
  main()
