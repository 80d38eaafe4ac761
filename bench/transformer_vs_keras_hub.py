"""Training-step throughput of our Transformer (the MLPerf WMT En-De model) against the same
model assembled from keras-hub layers, each framework against keras-hub on the same backend:

  ours (TF, Keras layers + XLA custom loop, TF Adam)    vs  keras-hub, TF backend, fit step
  ours (JAX, flax + optax, jit, TF Adam)                vs  keras-hub, JAX backend, fit step

The peer: a ReversibleEmbedding (one table for source, target and the output projection, as
ours), SinePositionEncoding, pre-LayerNorm TransformerEncoder / TransformerDecoder layers
(normalize_first) with a final LayerNorm per stack, Keras' Adam (beta2 0.997, epsilon 1e-9),
sparse cross entropy over non-padding tokens (sample weights; ours adds label smoothing, a few
elementwise ops). keras-hub's attention has biases (Keras MultiHeadAttention's default), ours
has none, as the reference. Each measurement runs in its own process (Keras picks its backend
at import); synthetic device-resident batches, float32, no dropout, timed after compilation.
Needs the bench extras: pip install --no-deps -r bench/requirements.txt

  python bench/transformer_vs_keras_hub.py [--batch 16] [--length 64] [--layers 2]
                                           [--hidden 256] [--vocab 8192] [--steps 10] [--repeats 5]

Each side runs in its own process, kept alive between the --repeats interleaved rounds
(bench/method.py); ratios are medians of per-round ratios with their min-max; model FLOPs per
sample are counted on both sides by TF's graph profiler.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import method  # noqa: E402  pylint: disable=wrong-import-position


WORKLOAD = "transformer"
SMALL = ["--batch=16", "--length=64", "--layers=2", "--hidden=256", "--vocab=8192",
         "--steps=5"]                                          # bench/all.py's size


def add_args(p):
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--length", type=int, default=64)
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--hidden", type=int, default=256)
  p.add_argument("--vocab", type=int, default=8192)
  p.add_argument("--steps", type=int, default=10)


def check_args(p, args):
  if args.hidden % 64:
    p.error(f"--hidden {args.hidden}: allowed: a multiple of 64 (heads of 64, as Transformer-big)")


def peer_name(args):
  return "keras-hub TransformerEncoder/Decoder (pre-LN)"


def title(args):
  return (f"Transformer training step: {args.layers}+{args.layers} layers, hidden {args.hidden}, "
          f"vocab {args.vocab}, length {args.length}, batch {args.batch}, {args.steps} timed "
          "steps, float32")


def ours(framework, args):
  from harness.workload import RunContext
  from workloads.transformer import spec
  cfg = spec.SPEC.configure("synthetic", [
      f"train.global_batch_size={args.batch}", f"data.max_length={args.length}",
      f"model.num_layers={args.layers}", f"model.hidden_size={args.hidden}",
      f"model.num_heads={args.hidden // 64}", f"model.filter_size={4 * args.hidden}",
      f"model.vocab_size={args.vocab}", "model.dropout=0.0", "model.attention_dropout=0.0",
      "model.relu_dropout=0.0", "train.precision=float32",
      "data.packing=false"])   # a pair a row in both: keras-hub's layers have no packed masks
  trainer = spec.SPEC.make_trainer(framework, cfg, RunContext(seed=0, preset="synthetic"))
  return method.trainer_side(trainer, args.batch, args.steps)


def peer(args):
  import keras
  import keras_hub
  import numpy as np
  heads, filter_size = args.hidden // 64, 4 * args.hidden
  source = keras.Input((args.length,), dtype="int32", name="inputs")
  shifted = keras.Input((args.length,), dtype="int32", name="decoder_inputs")
  embedding = keras_hub.layers.ReversibleEmbedding(args.vocab, args.hidden, tie_weights=True)
  positions = keras_hub.layers.SinePositionEncoding()

  def embed(ids):
    x = embedding(ids) * args.hidden ** 0.5
    return x + positions(x)

  x = embed(source)
  for _ in range(args.layers):
    x = keras_hub.layers.TransformerEncoder(filter_size, heads, normalize_first=True)(
        x, padding_mask=source != 0)
  encoded = keras.layers.LayerNormalization(epsilon=1e-6)(x)
  y = embed(shifted)
  for _ in range(args.layers):
    y = keras_hub.layers.TransformerDecoder(filter_size, heads, normalize_first=True)(
        y, encoded, decoder_padding_mask=shifted != 0, encoder_padding_mask=source != 0)
  y = keras.layers.LayerNormalization(epsilon=1e-6)(y)
  logits = embedding(y, reverse=True)
  model = keras.Model({"inputs": source, "decoder_inputs": shifted}, logits)
  model.compile(optimizer=keras.optimizers.Adam(1e-4, beta_2=0.997, epsilon=1e-9),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                jit_compile=True)
  from workloads.transformer import spec, input_pipeline
  cfg = spec.SPEC.configure("synthetic", [f"data.max_length={args.length}",
                                          f"model.vocab_size={args.vocab}", "data.packing=false"])
  batch = input_pipeline.synthetic_batch(cfg, args.batch, 1)
  targets = batch["targets"]
  x = {"inputs": batch["inputs"], "decoder_inputs": np.pad(targets, ((0, 0), (1, 0)))[:, :-1]}
  weights = (targets != 0).astype("float32")
  return method.keras_side(model, x, targets, args.batch, args.steps, sample_weight=weights)


if __name__ == "__main__":
  method.main(sys.modules[__name__], __file__)
