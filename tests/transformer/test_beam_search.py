"""Beam search (MLPerf Transformer) in JAX and TF against the numpy reference, on a toy decoder
that exists in all three from the same random tables. Its logits depend on the last token, on a
running sum of the tokens so far and on a K/V-like buffer written at position i, all carried in
the cache: a beam search that reordered the cache wrongly would decode other sequences. The
numpy reference is itself checked against rescoring of its outputs and against greedy decoding.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import tensorflow as tf

from workloads.transformer import beam_search_np, jax_beam_search, tf_beam_search

VOCAB, PAD, EOS, START = 12, 0, 1, 0
BEAM, ALPHA, MAX_LEN, BATCH = 4, 0.6, 7, 3
FEAT = (2, 3)  # the buffer's per-position shape, as [heads, dim] in a real K/V cache


def make_tables(seed, scale=1.0, eos_bias=0.0):
  rng = np.random.default_rng(seed)
  f32 = lambda x: np.asarray(x, np.float32)
  bias = f32(rng.normal(size=(BATCH, VOCAB)) * 0.5)
  bias[:, PAD] = -1e4  # never decode the pad id: every 0 in an output is padding
  bias[:, EOS] += eos_bias
  return dict(next=f32(rng.normal(size=(VOCAB, VOCAB)) * scale),
              emb=f32(rng.normal(size=(VOCAB,) + FEAT)),
              proj=f32(rng.normal(size=(np.prod(FEAT), VOCAB)) * 0.5 * scale),
              w=f32(rng.normal(size=VOCAB) * 0.1 * scale), bias=bias)


def initial_cache(t):
  # nested, as the model's per-layer caches are; "kv" is written at index i every step
  return {"sum": np.zeros([BATCH], np.float32),
          "layer": {"kv": np.zeros((BATCH, MAX_LEN + 1) + FEAT, np.float32),
                    "bias": t["bias"]}}


def np_decoder(t):
  def fn(ids, i, cache):
    total = cache["sum"] + ids.astype(np.float32)
    kv = cache["layer"]["kv"].copy()
    kv[:, i] = t["emb"][ids]
    prev = kv[:, max(i - 1, 0)].reshape(len(ids), -1)
    logits = (t["next"][ids] + prev @ t["proj"] + t["w"] * total[:, None]
              + cache["layer"]["bias"])
    return logits, {"sum": total, "layer": {"kv": kv, "bias": cache["layer"]["bias"]}}
  return fn


def jax_decoder(t, calls=None):
  t = {k: jnp.asarray(v) for k, v in t.items()}

  def fn(ids, i, cache):
    if calls is not None:
      jax.debug.callback(lambda: calls.append(1))
    total = cache["sum"] + ids.astype(jnp.float32)
    kv = cache["layer"]["kv"].at[:, i].set(t["emb"][ids])
    prev = kv[:, jnp.maximum(i - 1, 0)].reshape(ids.shape[0], -1)
    logits = (t["next"][ids] + prev @ t["proj"] + t["w"] * total[:, None]
              + cache["layer"]["bias"])
    return logits, {"sum": total, "layer": {"kv": kv, "bias": cache["layer"]["bias"]}}
  return fn


def tf_decoder(t, calls=None):
  t = {k: tf.constant(v) for k, v in t.items()}

  def fn(ids, i, cache):
    total = cache["sum"] + tf.cast(ids, tf.float32)
    at_i = tf.equal(tf.range(MAX_LEN + 1), i)[None, :, None, None]
    kv = tf.where(at_i, tf.gather(t["emb"], ids)[:, None], cache["layer"]["kv"])
    prev = tf.reshape(tf.gather(kv, tf.maximum(i - 1, 0), axis=1), [tf.shape(ids)[0], -1])
    logits = (tf.gather(t["next"], ids) + prev @ t["proj"] + t["w"] * total[:, None]
              + cache["layer"]["bias"])
    if calls is not None:
      with tf.control_dependencies([calls.assign_add(1)]):
        logits = tf.identity(logits)
    return logits, {"sum": total, "layer": {"kv": kv, "bias": cache["layer"]["bias"]}}
  return fn


def run_np(t, beam=BEAM, ids=None):
  ids = np.full([BATCH], START, np.int32) if ids is None else ids
  return beam_search_np.beam_search(np_decoder(t), ids, initial_cache(t), VOCAB, beam, ALPHA,
                                    MAX_LEN, EOS, return_steps=True)


def run_jax(t, beam=BEAM, calls=None):
  search = jax.jit(functools.partial(
      jax_beam_search.beam_search, jax_decoder(t, calls), vocab_size=VOCAB, beam_size=beam,
      alpha=ALPHA, max_decode_length=MAX_LEN, eos_id=EOS))
  out = search(jnp.full([BATCH], START, jnp.int32), initial_cache(t))
  return tuple(np.asarray(x) for x in out)


def run_tf(t, beam=BEAM, jit=True, calls=None):
  @tf.function(jit_compile=jit)
  def search(ids, cache):
    return tf_beam_search.beam_search(tf_decoder(t, calls), ids, cache, VOCAB, beam, ALPHA,
                                      MAX_LEN, EOS)
  cache = tf.nest.map_structure(tf.constant, initial_cache(t))
  return tuple(x.numpy() for x in search(tf.fill([BATCH], START), cache))


def rescore(t, b, seq):
  """Log-prob of decoding seq[1:] (up to its EOS) for batch element b, step by step."""
  fn, cache = np_decoder(t), initial_cache(t)
  cache = {"sum": cache["sum"][b:b + 1],
           "layer": {k: v[b:b + 1] for k, v in cache["layer"].items()}}
  total, n = 0.0, 0
  for i in range(MAX_LEN):
    logits, cache = fn(seq[i:i + 1], i, cache)
    logits = logits[0].astype(np.float64)
    total += logits[seq[i + 1]] - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
    n += 1
    if seq[i + 1] == EOS:
      break
  return total, n


def assert_same(out, ref):
  np.testing.assert_array_equal(out[0], ref[0])
  np.testing.assert_allclose(out[1], ref[1], rtol=1e-5)


def test_matches_numpy_reference_and_reference_is_consistent():
  t = make_tables(0)
  seqs, scores, steps = run_np(t)
  assert steps == MAX_LEN
  assert seqs.shape == (BATCH, BEAM, MAX_LEN + 1) and (seqs[:, :, 0] == START).all()
  assert (np.diff(scores, axis=1) <= 0).all()
  finished = 0
  for b in range(BATCH):
    for k in range(BEAM):
      if scores[b, k] < -1e6:
        continue  # a non-finished filler the reference leaves in the lower beams
      seq = seqs[b, k]
      eos = np.flatnonzero(seq == EOS)
      assert len(eos) == 1 and (seq[1:eos[0]] != PAD).all() and (seq[eos[0] + 1:] == PAD).all()
      log_prob, length = rescore(t, b, seq)
      np.testing.assert_allclose(scores[b, k],
                                 log_prob / ((5 + length) / 6) ** ALPHA, rtol=1e-5)
      finished += 1
  # the case exercises several finished lengths across the batch
  assert finished >= BATCH * 2
  assert len({int(np.flatnonzero(s == EOS)[0]) for s in seqs.reshape(-1, MAX_LEN + 1)
              if EOS in s}) >= 3
  assert_same(run_jax(t), (seqs, scores))
  assert_same(run_tf(t, jit=True), (seqs, scores))
  assert_same(run_tf(t, jit=False), (seqs, scores))


def test_element_without_eos_returns_alive_beams():
  t = make_tables(2)
  t["bias"][1, EOS] = -1e9
  seqs, scores, steps = run_np(t)
  assert steps == MAX_LEN
  # element 1: full-length sequences with no EOS, scored by raw (unnormalised) log-probs
  assert EOS not in seqs[1] and (seqs[1, :, 1:] != PAD).all()
  for k in range(BEAM):
    np.testing.assert_allclose(scores[1, k], rescore(t, 1, seqs[1, k])[0], rtol=1e-5)
  # the others finished normally
  assert all(EOS in seqs[b, 0] for b in (0, 2))
  assert_same(run_jax(t), (seqs, scores))
  assert_same(run_tf(t), (seqs, scores))


def test_stops_early_when_finished_beats_alive():
  t = make_tables(5, eos_bias=2.0)
  seqs, scores, steps = run_np(t)
  assert 1 < steps < MAX_LEN
  assert (seqs[:, :, steps + 1:] == PAD).all()  # nothing written past the last step
  jax_calls = []
  assert_same(run_jax(t, calls=jax_calls), (seqs, scores))
  assert len(jax_calls) == steps
  tf_calls = tf.Variable(0)
  assert_same(run_tf(t, calls=tf_calls), (seqs, scores))
  assert int(tf_calls.numpy()) == steps


def test_tf_in_mirrored_replicas_with_unknown_batch():
  # two replicas (conftest's logical CPUs) decode elements [0, 1] and [1, 2]; the replica
  # function's signature leaves the batch unknown, so the tf.shape path is the one traced
  t = make_tables(0)
  seqs, scores, _ = run_np(t)
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  cache = initial_cache(t)

  def replica_inputs(ctx):
    rows = [0, 1] if ctx.replica_id_in_sync_group == 0 else [1, 2]
    return tf.fill([2], START), tf.nest.map_structure(lambda x: tf.constant(x[rows]), cache)

  @tf.function(input_signature=[
      tf.TensorSpec([None], tf.int32),
      tf.nest.map_structure(lambda x: tf.TensorSpec((None,) + x.shape[1:], x.dtype), cache)])
  def search(ids, cache):
    return tf_beam_search.beam_search(tf_decoder(t), ids, cache, VOCAB, BEAM, ALPHA, MAX_LEN,
                                      EOS)

  @tf.function
  def decode(inputs):
    return strategy.run(lambda pair: search(*pair), args=(inputs,))

  out = decode(strategy.experimental_distribute_values_from_function(replica_inputs))
  first, second = [[x.numpy() for x in strategy.experimental_local_results(o)] for o in out]
  np.testing.assert_array_equal(np.concatenate([first[0], first[1][1:]]), seqs)
  np.testing.assert_allclose(np.concatenate([second[0], second[1][1:]]), scores, rtol=1e-5)


def greedy(t, b):
  fn, cache = np_decoder(t), initial_cache(t)
  cache = {"sum": cache["sum"][b:b + 1],
           "layer": {k: v[b:b + 1] for k, v in cache["layer"].items()}}
  seq = np.zeros(MAX_LEN + 1, np.int32)
  seq[0] = START
  for i in range(MAX_LEN):
    logits, cache = fn(seq[i:i + 1], i, cache)
    seq[i + 1] = np.argmax(logits[0])
    if seq[i + 1] == EOS:
      break
  return seq


def test_beam_one_is_greedy():
  # Beam 1 is greedy only where the second-best token never finishes a sequence that later
  # beats the greedy one; peaked decoders make that so. With seed 5 greedy ends in EOS and the
  # finished set stops the search at once; with seed 4 it never does (nor is EOS ever second
  # best), so beam 1 returns its alive beam: the greedy path.
  ended = []
  for seed in (4, 5):
    t = make_tables(seed, scale=4.0, eos_bias=3.0)
    expected = np.stack([greedy(t, b) for b in range(BATCH)])
    ended += [EOS in s for s in expected]
    for out in (run_np(t, beam=1), run_jax(t, beam=1), run_tf(t, beam=1, jit=False)):
      np.testing.assert_array_equal(out[0][:, 0], expected)
  assert any(ended) and not all(ended)


def test_jax_compiles_once_per_batch_shape():
  traces = []
  base = jax_decoder(make_tables(0))

  def fn(ids, i, cache):
    traces.append(1)
    return base(ids, i, cache)
  search = jax.jit(functools.partial(
      jax_beam_search.beam_search, fn, vocab_size=VOCAB, beam_size=BEAM, alpha=ALPHA,
      max_decode_length=MAX_LEN, eos_id=EOS))
  ids = jnp.full([BATCH], START, jnp.int32)
  t = make_tables(0)
  # the same decoder (tables), another cache (per-element biases): no retrace
  for bias in (t["bias"], make_tables(1)["bias"]):
    tables = dict(t, bias=bias)
    seqs, scores = search(ids, initial_cache(tables))
    assert_same((np.asarray(seqs), np.asarray(scores)), run_np(tables)[:2])
  assert len(traces) == 1
