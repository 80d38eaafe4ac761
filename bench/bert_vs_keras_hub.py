"""Training-step throughput of our BERT pre-training model against keras-hub's BertBackbone
with its MaskedLMHead (output projection tied to the token embedding) and a next-sentence
head, same sizes, each framework against keras-hub on the same Keras backend:

  ours (TF, Keras layers + XLA custom loop, MLPerf LAMB)  vs  keras-hub, TF backend, fit step
  ours (JAX, flax + optax, jit, MLPerf LAMB)              vs  keras-hub, JAX backend, fit step

The peer trains with Keras' Lamb. Each measurement runs in its own process (Keras picks its
backend at import); synthetic device-resident batches, float32, no dropout, timed after
compilation. Needs the bench extras: pip install --no-deps -r bench/requirements.txt

  python bench/bert_vs_keras_hub.py [--batch 16] [--seq 128] [--layers 2] [--hidden 256] [--steps 10]
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

VOCAB = 30522
WORKLOAD = "bert"
SMALL = ["--batch=16", "--seq=128", "--layers=2", "--hidden=256", "--steps=5"]   # bench/all.py


def add_args(p):
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq", type=int, default=128)
  p.add_argument("--preds", type=int, default=20)
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--hidden", type=int, default=256)
  p.add_argument("--steps", type=int, default=10)


def check_args(p, args):
  if args.hidden % 64:
    p.error(f"--hidden {args.hidden}: allowed: a multiple of 64 (heads of 64, as BERT-large)")


def peer_name(args):
  return "keras-hub BertBackbone + MaskedLMHead"


def title(args):
  return (f"BERT pre-training step: {args.layers} layers, hidden {args.hidden}, vocab {VOCAB}, "
          f"sequence {args.seq}, {args.preds} predictions, batch {args.batch}, "
          f"{args.steps} timed steps, float32")


def ours(framework, args):
  from harness.workload import RunContext
  from workloads.bert import spec
  cfg = spec.SPEC.configure("synthetic", [
      f"train.global_batch_size={args.batch}", f"data.max_seq_length={args.seq}",
      f"data.max_predictions_per_seq={args.preds}", f"model.num_layers={args.layers}",
      f"model.hidden_size={args.hidden}", f"model.num_heads={args.hidden // 64}",
      f"model.intermediate_size={4 * args.hidden}", "model.dropout=0.0",
      "train.precision=float32"])
  trainer = spec.SPEC.make_trainer(framework, cfg, RunContext(seed=0, preset="synthetic"))
  return method.trainer_side(trainer, args.batch, args.steps)


def peer(args):
  import keras
  import keras_hub
  import numpy as np
  backbone = keras_hub.models.BertBackbone(
      vocabulary_size=VOCAB, num_layers=args.layers, num_heads=args.hidden // 64,
      hidden_dim=args.hidden, intermediate_dim=4 * args.hidden, dropout=0.0,
      max_sequence_length=args.seq)
  inputs = dict(backbone.input)
  inputs["mask_positions"] = keras.Input((args.preds,), dtype="int32", name="mask_positions")
  outputs = backbone({k: inputs[k] for k in backbone.input})
  mlm = keras_hub.layers.MaskedLMHead(vocabulary_size=VOCAB,
                                      token_embedding=backbone.token_embedding,
                                      intermediate_activation="gelu")(
                                          outputs["sequence_output"], inputs["mask_positions"])
  nsp = keras.layers.Dense(2)(outputs["pooled_output"])
  model = keras.Model(inputs, [mlm, nsp])
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  model.compile(optimizer=keras.optimizers.Lamb(1e-4), loss=[loss, loss], jit_compile=True)
  rng = np.random.default_rng(0)
  b, s = args.batch, args.seq
  x = {"token_ids": rng.integers(0, VOCAB, (b, s)).astype("int32"),
       "segment_ids": (np.arange(s) >= s // 2).astype("int32")[None].repeat(b, 0),
       "padding_mask": np.ones((b, s), "int32"),
       "mask_positions": np.sort(rng.integers(1, s, (b, args.preds)), 1).astype("int32")}
  y = [rng.integers(0, VOCAB, (b, args.preds)).astype("int32"),
       rng.integers(0, 2, (b,)).astype("int32")]
  return method.keras_side(model, x, y, b, args.steps)


if __name__ == "__main__":
  method.main(sys.modules[__name__], __file__)
