"""Training tokens/s of the ST-MoE Transformer at capacity factor 1.25 against 2.0, and against
the dense Transformer of equal feed-forward FLOPs per token (nominal top-2: an expert layer
computes two feed-forwards a token, so the dense model's d_ff is d_ff x (N + n) / N with n of
the N layers a stack holding experts), in one framework:

  moe-1.25   model.moe.capacity_factor_train=1.25 (ST-MoE's and Mesh-TF's training default)
  moe-2.0    model.moe.capacity_factor_train=2.0  (ST-MoE: +7% step time on its L model,
                                                   +14% at 32B, for fewer dropped tokens)
  dense      the same Transformer without experts, d_ff widened to the MoE's FLOPs per token

Synthetic packed rows (the workload's synthetic pipeline), the harness's own trainers, each
built and compiled once, then timed over --steps steps in --repeats interleaved rounds
(bench/method.py): per side the median tokens/s, and the ratios' medians with min-max.

  python bench/moe_capacity.py [--framework jax|tf] [--mesh data=2,expert=2 --cpu-devices 4]
      [--hidden 128] [--filter 512] [--layers 4] [--experts 8] [--every 2] [--batch 32]
      [--length 64] [--group 256] [--steps 5] [--repeats 5]
"""
import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import method  # noqa: E402  pylint: disable=wrong-import-position


def overrides(args, side):
  base = ["data.source=synthetic", "model.vocab_size=1024", "train.precision=float32",
          f"model.hidden_size={args.hidden}", f"model.num_heads={max(1, args.hidden // 32)}",
          f"model.num_layers={args.layers}", f"train.global_batch_size={args.batch}",
          f"data.max_length={args.length}", "model.dropout=0", "model.attention_dropout=0",
          "model.relu_dropout=0", f"parallel.mesh={args.mesh}"]
  if side == "dense":
    experts_per_stack = sum(i % args.every == args.every - 1 for i in range(args.layers))
    width = args.filter * (args.layers + experts_per_stack) // args.layers
    return base + [f"model.filter_size={width}"]
  factor = side.split("-")[1]
  return base + [f"model.filter_size={args.filter}", f"model.moe.num_experts={args.experts}",
                 f"model.moe.every={args.every}", f"model.moe.group_size={args.group}",
                 f"model.moe.capacity_factor_train={factor}"]


def trainer_for(args, side):
  from harness.workload import RunContext
  from workloads.transformer import spec
  cfg = spec.SPEC.configure("mini", overrides(args, side))
  trainer = spec.SPEC.make_trainer(args.framework, cfg, RunContext(seed=0, preset="mini"))
  trainer.init()
  trainer.train(1)                                     # first call: data setup, warm caches
  return trainer


def tokens_per_s(trainer, args):
  start = time.perf_counter()
  trainer.train(args.steps)                            # returns after its one host sync
  return args.steps * args.batch * args.length / (time.perf_counter() - start)


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--framework", choices=["jax", "tf"], default="jax")
  p.add_argument("--mesh", default="", help="e.g. data=2,expert=2 (with --cpu-devices)")
  p.add_argument("--cpu-devices", type=int, default=0, help="simulated CPU devices")
  p.add_argument("--hidden", type=int, default=128)
  p.add_argument("--filter", type=int, default=512)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--experts", type=int, default=8)
  p.add_argument("--every", type=int, default=2)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--length", type=int, default=64)
  p.add_argument("--group", type=int, default=256, help="tokens per routing group")
  p.add_argument("--steps", type=int, default=5)
  method.add_repeats_arg(p)
  args = p.parse_args()
  if args.cpu_devices:
    from harness import devices  # pylint: disable=import-outside-toplevel
    devices.prepare(args.framework, args.cpu_devices)
  sides = ("moe-1.25", "moe-2.0", "dense")
  print(f"Transformer {args.layers}+{args.layers} layers, hidden {args.hidden}, d_ff "
        f"{args.filter}, {args.experts} experts every {args.every} layers, groups of "
        f"{args.group}; batch {args.batch} x {args.length} tokens, {args.framework}, "
        f"mesh {args.mesh or 'one device'}, {args.steps} timed steps, float32")
  trainers = {side: trainer_for(args, side) for side in sides}
  values = method.interleaved({s: (lambda s=s: tokens_per_s(trainers[s], args)) for s in sides},
                              args.repeats)
  method.report(values, [("moe 1.25 / moe 2.0", "moe-1.25", "moe-2.0"),
                         ("moe 1.25 / dense of equal FLOPs", "moe-1.25", "dense"),
                         ("moe 2.0 / dense of equal FLOPs", "moe-2.0", "dense")],
                unit="tokens/s")


if __name__ == "__main__":
  main()
