"""Training-step throughput of our Llama 3.1 (the MLPerf llama31_8b model) against keras-hub's
Llama3Backbone with an untied output layer, same sizes, each framework against keras-hub on the
same Keras backend:

  ours (TF, Keras layers + XLA custom loop, torch-form AdamW)   vs  keras-hub, TF backend, fit
  ours (JAX, flax + optax, jit, optax AdamW)                    vs  keras-hub, JAX backend, fit

The peer: Llama3Backbone (RMSNorm, grouped-query attention, SwiGLU, RoPE with Llama 3.1's
frequency scaling, tie_word_embeddings=False) and a bias-free Dense over the vocabulary, Keras'
AdamW (betas 0.9/0.95, epsilon 1e-5, weight decay 0.1) with global_clipnorm 1.0, sparse cross
entropy on the logits. Each measurement runs in its own process (Keras picks its backend at
import); synthetic device-resident batches, float32, timed after compilation. Needs the bench
extras: pip install --no-deps -r bench/requirements.txt

  python bench/llama_vs_keras_hub.py [--batch 16] [--seq 128] [--layers 2] [--hidden 256]
                                     [--heads 4] [--kv-heads 2] [--vocab 8192] [--steps 10]
                                     [--repeats 5] [--frameworks tf,jax]

Each side runs in its own process, kept alive between the --repeats interleaved rounds
(bench/method.py); ratios are medians of per-round ratios with their min-max; model FLOPs per
sample are counted on both sides by TF's graph profiler.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import method  # noqa: E402  pylint: disable=wrong-import-position

WORKLOAD = "llama31_8b"
SMALL = ["--batch=16", "--seq=128", "--layers=2", "--hidden=256", "--heads=4",
         "--kv-heads=2", "--vocab=8192", "--steps=5"]                 # bench/all.py's size


def add_args(p):
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq", type=int, default=128)
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--hidden", type=int, default=256)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--kv-heads", type=int, default=2)
  p.add_argument("--vocab", type=int, default=8192)
  p.add_argument("--steps", type=int, default=10)


def check_args(p, args):
  if args.hidden % args.heads or args.heads % args.kv_heads:
    p.error(f"--hidden {args.hidden} --heads {args.heads} --kv-heads {args.kv_heads}: allowed: "
            "heads dividing hidden and kv-heads dividing heads")


def peer_name(args):
  return "keras-hub Llama3Backbone + Dense head"


def ffn(args):
  return 7 * args.hidden // 2           # Llama 3.1 8B's 14,336 / 4,096


def title(args):
  return (f"Llama training step: {args.layers} layers, hidden {args.hidden}, {args.heads} query / "
          f"{args.kv_heads} key-value heads, SwiGLU {ffn(args)}, vocab {args.vocab}, sequence "
          f"{args.seq}, batch {args.batch}, {args.steps} timed steps, float32")


def ours(framework, args):
  from harness.workload import RunContext
  from workloads.llama31_8b import spec
  cfg = spec.SPEC.configure("synthetic", [
      f"train.global_batch_size={args.batch}", f"data.max_seq_length={args.seq}",
      f"model.num_layers={args.layers}", f"model.hidden_size={args.hidden}",
      f"model.num_heads={args.heads}", f"model.num_kv_heads={args.kv_heads}",
      f"model.intermediate_size={ffn(args)}", f"model.vocab_size={args.vocab}",
      f"model.rope_original_max_position={args.seq}", "train.precision=float32"])
  trainer = spec.SPEC.make_trainer(framework, cfg, RunContext(seed=0, preset="synthetic"))
  return method.trainer_side(trainer, args.batch, args.steps)


def peer(args):
  import keras
  import keras_hub
  import numpy as np
  backbone = keras_hub.models.Llama3Backbone(
      vocabulary_size=args.vocab, num_layers=args.layers, num_query_heads=args.heads,
      hidden_dim=args.hidden, intermediate_dim=ffn(args), num_key_value_heads=args.kv_heads,
      rope_max_wavelength=500_000, rope_position_scaling_factor=8.0,
      rope_frequency_adjustment_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
      rope_pretraining_sequence_length=args.seq, layer_norm_epsilon=1e-5,
      tie_word_embeddings=False)
  inputs = dict(backbone.input)
  hidden = backbone(inputs)
  logits = keras.layers.Dense(args.vocab, use_bias=False)(hidden)
  model = keras.Model(inputs, logits)
  model.compile(optimizer=keras.optimizers.AdamW(4e-4, weight_decay=0.1, beta_1=0.9,
                                                 beta_2=0.95, epsilon=1e-5, global_clipnorm=1.0),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                jit_compile=True)
  rng = np.random.default_rng(0)
  b, s = args.batch, args.seq
  x = {"token_ids": rng.integers(0, args.vocab, (b, s)).astype("int32"),
       "padding_mask": np.ones((b, s), "int32")}
  y = rng.integers(0, args.vocab, (b, s)).astype("int32")
  return method.keras_side(model, x, y, b, args.steps)


if __name__ == "__main__":
  method.main(sys.modules[__name__], __file__)
