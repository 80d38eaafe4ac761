"""Beam search for the MLPerf Transformer (WMT En-De) in JAX: the MLPerf reference's algorithm
(mlcommons/training, retired_benchmarks/transformer/tensorflow/transformer/model/
beam_search.py, itself Tensor2Tensor's) on fixed shapes, in one lax.while_loop, so that a
jitted decode compiles once per batch shape. tf_beam_search.py is the same in TensorFlow.

The algorithm, per batch element, in float32 (INF is the reference's finite 1e7):

  alive:    `beam` sequences with their log-probs; beam 0 starts at 0, the others at -inf,
            so the first step expands beam 0 only. finished: `beam` sequences, scores
            (-INF at first) and flags (False at first).
  step i:   log_softmax of the logits for every alive beam's last token, plus the beam's
            log-prob; the best 2 * beam of the beam * vocab extensions are the candidates
            (2 * beam, so that at least `beam` of them did not end in EOS).
            alive <- the best `beam` candidates by log-prob, those ending in EOS at -INF.
            finished <- the best `beam` of the old finished entries and the candidates, scored
            log-prob / ((5 + i + 1) / 6) ** alpha if they end in EOS, that minus INF if not.
  stop:     before step i, when i == max_decode_length, or when for EVERY batch element the
            lowest finished score (unflagged entries read as 0; -INF if it has none) is greater
            than its best alive log-prob / ((5 + max_decode_length) / 6) ** alpha.
  result:   finished sequences and scores, best first; an element with no finished sequence
            returns its alive sequences and their raw (not length-normalised) log-probs.

Where this differs from the reference, only in shapes: the reference grows its sequences by one
position per step and returns [batch, beam, steps + 1]; here they are [batch, beam,
max_decode_length + 1] from the start, position 0 the initial id and every position not written
yet 0. Finished sequences therefore hold 0 (the pad id) after EOS in both, and an early stop
leaves zeros at the end. Tokens are passed to the model one at a time (the reference passes the
whole prefix and its model reads the last one), and the cache is reordered once per step, where
the reference gathers it into the 2 * beam candidates and then into the alive beams: the same.
Ties in top_k go to the lower index, as in tf.nn.top_k, so lower beams match the reference too.
"""
import jax
import jax.numpy as jnp

# The reference's "infinity": finite, so that a 0/1 flag times INF is 0 rather than NaN.
INF = 1e7


def length_penalty(alpha, length):
  """((5 + length) / 6) ** alpha: the length normalisation of finished scores."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** jnp.float32(alpha)


def _gather_beams(x, indices):
  """x[b, indices[b, j], ...] for x [batch, beams, ...] and indices [batch, k]."""
  return jnp.take_along_axis(x, indices.reshape(indices.shape + (1,) * (x.ndim - 2)), axis=1)


def beam_search(symbols_to_logits_fn, initial_ids, initial_cache, vocab_size, beam_size, alpha,
                max_decode_length, eos_id):
  """Beam search from `initial_ids` (int32 [batch]); returns (sequences int32 [batch, beam,
  max_decode_length + 1], scores float32 [batch, beam]), best first.

  symbols_to_logits_fn(ids, i, cache) -> (logits, cache): ids int32 [batch * beam], the token
  at position i of every alive sequence; i a scalar int32; cache leaves [batch * beam, ...]
  (initial_cache's leaves [batch, ...], tiled by beam here, batch-major); logits
  [batch * beam, vocab_size], any float dtype. The returned cache must keep its shapes and
  dtypes; its leaves are reordered along axis 0 to follow the surviving beams.
  vocab_size, beam_size, alpha, max_decode_length and eos_id are Python numbers (static).
  """
  initial_ids = jnp.asarray(initial_ids, jnp.int32)
  batch, beam, length = initial_ids.shape[0], beam_size, max_decode_length + 1
  neg_inf = jnp.float32(-INF)

  alive_seq = jnp.zeros([batch, beam, length], jnp.int32).at[:, :, 0].set(initial_ids[:, None])
  alive_log_probs = jnp.tile(jnp.array([0.0] + [-jnp.inf] * (beam - 1), jnp.float32),
                             [batch, 1])
  cache = jax.tree.map(lambda x: jnp.repeat(x, beam, axis=0), initial_cache)
  finished_seq = jnp.zeros([batch, beam, length], jnp.int32)
  finished_scores = jnp.full([batch, beam], neg_inf)
  finished_flags = jnp.zeros([batch, beam], bool)
  state = (jnp.int32(0), alive_seq, alive_log_probs, cache,
           finished_seq, finished_scores, finished_flags)
  max_penalty = length_penalty(alpha, max_decode_length)

  def keep_going(state):
    i, _, alive_log_probs, _, _, finished_scores, finished_flags = state
    best_alive = alive_log_probs[:, 0] / max_penalty
    # the reference multiplies by the flags: unflagged entries (fillers) read as 0
    lowest = jnp.min(finished_scores * finished_flags.astype(jnp.float32), axis=1)
    lowest = lowest + (1.0 - jnp.any(finished_flags, axis=1).astype(jnp.float32)) * neg_inf
    return (i < max_decode_length) & ~jnp.all(lowest > best_alive)

  def step(state):
    i, alive_seq, alive_log_probs, cache, finished_seq, finished_scores, finished_flags = state
    ids = jax.lax.dynamic_index_in_dim(alive_seq, i, axis=2, keepdims=False).reshape(-1)
    logits, cache = symbols_to_logits_fn(ids, i, cache)
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    log_probs = log_probs.reshape(batch, beam, vocab_size) + alive_log_probs[:, :, None]

    # the 2 * beam best extensions: their source beam, token and sequence
    cand_log_probs, flat = jax.lax.top_k(log_probs.reshape(batch, beam * vocab_size), 2 * beam)
    source, token = flat // vocab_size, flat % vocab_size
    cand_seq = jax.lax.dynamic_update_index_in_dim(
        _gather_beams(alive_seq, source), token, i + 1, axis=2)
    ended = token == eos_id

    # alive: the best that did not end in EOS, and their cache rows
    alive_masked = cand_log_probs + ended.astype(jnp.float32) * neg_inf
    alive_log_probs, keep = jax.lax.top_k(alive_masked, beam)
    alive_seq = _gather_beams(cand_seq, keep)
    rows = jnp.arange(batch)[:, None] * beam + jnp.take_along_axis(source, keep, axis=1)
    cache = jax.tree.map(lambda x: jnp.take(x, rows.reshape(-1), axis=0), cache)

    # finished: the best of the old entries and the candidates, the non-EOS ones near -INF
    new_scores = cand_log_probs / length_penalty(alpha, i + 1)
    new_scores = new_scores + (1.0 - ended.astype(jnp.float32)) * neg_inf
    pool_scores = jnp.concatenate([finished_scores, new_scores], axis=1)
    finished_scores, best = jax.lax.top_k(pool_scores, beam)
    finished_seq = _gather_beams(jnp.concatenate([finished_seq, cand_seq], axis=1), best)
    finished_flags = _gather_beams(jnp.concatenate([finished_flags, ended], axis=1), best)
    return (i + 1, alive_seq, alive_log_probs, cache,
            finished_seq, finished_scores, finished_flags)

  _, alive_seq, alive_log_probs, _, finished_seq, finished_scores, finished_flags = (
      jax.lax.while_loop(keep_going, step, state))
  any_finished = jnp.any(finished_flags, axis=1)
  sequences = jnp.where(any_finished[:, None, None], finished_seq, alive_seq)
  scores = jnp.where(any_finished[:, None], finished_scores, alive_log_probs)
  return jax.lax.stop_gradient(sequences), jax.lax.stop_gradient(scores)
