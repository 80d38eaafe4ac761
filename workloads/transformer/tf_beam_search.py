"""Beam search for the MLPerf Transformer (WMT En-De) in TensorFlow: the MLPerf reference's
algorithm (mlcommons/training, retired_benchmarks/transformer/tensorflow/transformer/model/
beam_search.py) on fixed shapes in one tf.while_loop, so that it compiles under
tf.function(jit_compile=True) and runs inside tf.distribute replica functions.

jax_beam_search.py states the algorithm, the stopping rule and how the shapes differ from the
reference's (sequences are [batch, beam, max_decode_length + 1] from the start, with 0 in
every position not written); the two files are kept step for step alike.
"""
import tensorflow as tf

# The reference's "infinity": finite, so that a 0/1 flag times INF is 0 rather than NaN.
INF = 1e7


def length_penalty(alpha, length):
  """((5 + length) / 6) ** alpha: the length normalisation of finished scores."""
  return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, tf.constant(alpha, tf.float32))


def _gather_beams(x, indices):
  """x[b, indices[b, j], ...] for x [batch, beams, ...] and indices [batch, k]."""
  return tf.gather(x, indices, axis=1, batch_dims=1)


def _loop_shape(x):
  """x's static shape with the batch dimension left open: tf.shape-derived batch sizes make
  the body's outputs less specific than the inputs when the caller's batch is static."""
  return tf.TensorShape([None]).concatenate(x.shape[1:])


def beam_search(symbols_to_logits_fn, initial_ids, initial_cache, vocab_size, beam_size, alpha,
                max_decode_length, eos_id):
  """Beam search from `initial_ids` (int32 [batch]); returns (sequences int32 [batch, beam,
  max_decode_length + 1], scores float32 [batch, beam]), best first.

  symbols_to_logits_fn(ids, i, cache) -> (logits, cache): ids int32 [batch * beam], the token
  at position i of every alive sequence; i a scalar int32 tensor; cache a nested structure
  (dicts, lists) of tensors [batch * beam, ...] (initial_cache's are [batch, ...], tiled by
  beam here, batch-major); logits [batch * beam, vocab_size], any float dtype. The returned
  cache must keep its structure, dtypes and shapes (beyond the batch dimension); its tensors
  are reordered along axis 0 to follow the surviving beams.
  vocab_size, beam_size, alpha, max_decode_length and eos_id are Python numbers.
  """
  initial_ids = tf.cast(initial_ids, tf.int32)
  # a static batch where there is one keeps every shape static for XLA
  batch = initial_ids.shape[0] if initial_ids.shape[0] is not None else tf.shape(initial_ids)[0]
  beam, length = beam_size, max_decode_length + 1
  neg_inf = tf.constant(-INF, tf.float32)

  first = tf.one_hot(0, length, on_value=True, off_value=False, dtype=tf.bool)
  alive_seq = tf.where(first, initial_ids[:, None, None], tf.zeros([batch, beam, length], tf.int32))
  alive_log_probs = tf.tile(tf.constant([[0.0] + [-float("inf")] * (beam - 1)], tf.float32),
                            [batch, 1])
  cache = tf.nest.map_structure(lambda x: tf.repeat(x, beam, axis=0), initial_cache)
  finished_seq = tf.zeros([batch, beam, length], tf.int32)
  finished_scores = tf.fill([batch, beam], neg_inf)
  finished_flags = tf.zeros([batch, beam], tf.bool)
  state = (tf.constant(0), alive_seq, alive_log_probs, cache,
           finished_seq, finished_scores, finished_flags)
  max_penalty = length_penalty(alpha, max_decode_length)
  positions = tf.range(length)

  def keep_going(i, alive_seq, alive_log_probs, cache, finished_seq, finished_scores,
                 finished_flags):
    del alive_seq, cache, finished_seq
    best_alive = alive_log_probs[:, 0] / max_penalty
    # the reference multiplies by the flags: unflagged entries (fillers) read as 0
    lowest = tf.reduce_min(finished_scores * tf.cast(finished_flags, tf.float32), axis=1)
    lowest += (1.0 - tf.cast(tf.reduce_any(finished_flags, axis=1), tf.float32)) * neg_inf
    return tf.logical_and(i < max_decode_length,
                          tf.logical_not(tf.reduce_all(lowest > best_alive)))

  def step(i, alive_seq, alive_log_probs, cache, finished_seq, finished_scores, finished_flags):
    ids = tf.reshape(tf.gather(alive_seq, i, axis=2), [-1])
    logits, cache = symbols_to_logits_fn(ids, i, cache)
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
    log_probs = tf.reshape(log_probs, [batch, beam, vocab_size]) + alive_log_probs[:, :, None]

    # the 2 * beam best extensions: their source beam, token and sequence
    cand_log_probs, flat = tf.math.top_k(tf.reshape(log_probs, [batch, beam * vocab_size]),
                                         k=2 * beam)
    source, token = flat // vocab_size, flat % vocab_size
    cand_seq = tf.where(tf.equal(positions, i + 1), token[:, :, None],
                        _gather_beams(alive_seq, source))
    ended = tf.equal(token, eos_id)

    # alive: the best that did not end in EOS, and their cache rows
    alive_masked = cand_log_probs + tf.cast(ended, tf.float32) * neg_inf
    alive_log_probs, keep = tf.math.top_k(alive_masked, k=beam)
    alive_seq = _gather_beams(cand_seq, keep)
    rows = tf.range(batch)[:, None] * beam + tf.gather(source, keep, batch_dims=1)
    cache = tf.nest.map_structure(lambda x: tf.gather(x, tf.reshape(rows, [-1]), axis=0), cache)

    # finished: the best of the old entries and the candidates, the non-EOS ones near -INF
    new_scores = cand_log_probs / length_penalty(alpha, i + 1)
    new_scores += (1.0 - tf.cast(ended, tf.float32)) * neg_inf
    finished_scores, best = tf.math.top_k(tf.concat([finished_scores, new_scores], axis=1),
                                          k=beam)
    finished_seq = _gather_beams(tf.concat([finished_seq, cand_seq], axis=1), best)
    finished_flags = _gather_beams(tf.concat([finished_flags, ended], axis=1), best)
    return (i + 1, alive_seq, alive_log_probs, cache,
            finished_seq, finished_scores, finished_flags)

  invariants = tf.nest.map_structure(_loop_shape, state)
  invariants = (tf.TensorShape([]),) + invariants[1:]
  (_, alive_seq, alive_log_probs, _, finished_seq, finished_scores,
   finished_flags) = tf.while_loop(keep_going, step, state, shape_invariants=invariants,
                                   maximum_iterations=max_decode_length)
  any_finished = tf.reduce_any(finished_flags, axis=1)
  sequences = tf.where(any_finished[:, None, None], finished_seq, alive_seq)
  scores = tf.where(any_finished[:, None], finished_scores, alive_log_probs)
  return tf.stop_gradient(sequences), tf.stop_gradient(scores)
