"""Step time of each TF distributed feature against plain data parallelism, on the same
devices in the same process (ratios, not absolute times: on a CPU host the "devices" are
logical CPU devices sharing its cores).

  python bench/tf_distributed_overhead.py [--devices 8] [--batch 64] [--image-size 64] [--steps 20]
                                          [--repeats 5]

Configurations (mini ResNet, LARS): data=N with global batch norm (the baseline), batch norm
in groups of 2, weight-update sharding, data=N/2 x spatial=2, and one replica for scale. All
are built first, then timed interleaved over --repeats rounds (bench/method.py): each ratio is
the median of per-round ratios to the baseline, with its min-max.
"""
import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import method  # noqa: E402  pylint: disable=wrong-import-position


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--devices", type=int, default=8)
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--image-size", type=int, default=64)
  parser.add_argument("--steps", type=int, default=20)
  method.add_repeats_arg(parser)
  args = parser.parse_args()
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  from workloads.parallel import tf_runtime
  tf_runtime.use_logical_cpus(args.devices)
  from harness.workload import RunContext
  from workloads.resnet import spec

  n = args.devices
  configs = {
      f"data={n} (baseline)": [f"parallel.mesh=data={n}"],
      "bn groups of 2": [f"parallel.mesh=data={n}", "parallel.bn_group_size=2"],
      "weight-update sharding": [f"parallel.mesh=data={n}", "parallel.weight_update_sharding=true"],
      f"data={n // 2},spatial=2": [f"parallel.mesh=data={n // 2},spatial=2"],
      "1 replica": ["parallel.mesh=data=1"],
  }
  trainers = {}
  for name, overrides in configs.items():
    cfg = spec.SPEC.configure("mini", [f"train.global_batch_size={args.batch}",
                                       f"data.image_size={args.image_size}", *overrides])
    trainer = spec.SPEC.make_trainer("tf", cfg, RunContext(seed=0, preset="mini"))
    trainer.init()
    trainer.train(2)                                  # data pipeline up, caches warm
    trainers[name] = trainer

  def step_time(trainer):
    start = time.perf_counter()
    trainer.train(args.steps)
    return (time.perf_counter() - start) / args.steps

  values = method.interleaved({n: (lambda t=t: step_time(t)) for n, t in trainers.items()},
                              args.repeats, log=None)
  base = f"data={n} (baseline)"
  print(f"step time / data={n} step time (batch {args.batch}, {args.image_size}px, "
        f"{args.steps} steps):")
  method.report(values, [(f"{name} / baseline", name, base) for name in values if name != base],
                unit="s/step")


if __name__ == "__main__":
  main()
  # TensorFlow's interpreter teardown (tf.distribute strategies, runtime threads) can take
  # minutes after everything is printed: leave without it, as tests/conftest.py does.
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(0)
