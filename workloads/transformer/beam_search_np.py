"""Beam search of the MLPerf Transformer (WMT En-De) in plain numpy, one batch element and one
candidate at a time: the independent reference the tests hold the JAX and TF versions to.

The algorithm is the MLPerf reference's (mlcommons/training, retired_benchmarks/transformer/
tensorflow/transformer/model/beam_search.py, from Tensor2Tensor), which the jax_beam_search and
tf_beam_search docstrings spell out. This file keeps its arithmetic in float32 and its ordering
rules (ties go to the lower index, as tf.nn.top_k and lax.top_k break them) so that the lower
beams, which the reference fills with non-finished candidates scored about -1e7, agree too.

It returns fixed-size sequences [batch, beam, max_decode_length + 1] whose unused positions
(after EOS, or after the step the loop stopped at) hold 0, where the reference returns
[batch, beam, steps + 1] with the same zeros after EOS.
"""
import numpy as np

# The reference's "infinity": finite, so that multiplying by a 0/1 flag gives 0 rather than NaN.
INF = np.float32(1e7)


def length_penalty(alpha, length):
  """((5 + length) / 6) ** alpha in float32, as the reference computes it."""
  return np.power(np.float32((5.0 + length) / 6.0), np.float32(alpha))


def _top(values, k):
  """Indices of the k largest values, ties to the lower index (stable sort of the negation)."""
  return list(np.argsort(-np.asarray(values, np.float32), kind="stable")[:k])


def _log_softmax(logits):
  logits = logits.astype(np.float64)
  shifted = logits - logits.max(axis=-1, keepdims=True)
  return (shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))).astype(np.float32)


def _map(fn, tree):
  if isinstance(tree, dict):
    return {k: _map(fn, v) for k, v in tree.items()}
  if isinstance(tree, (list, tuple)):
    return type(tree)(_map(fn, v) for v in tree)
  return fn(tree)


def _continue(step, alive_log_probs, finished_scores, finished_flags, alpha, max_decode_length):
  """The reference's loop condition, for the whole batch at once: go on unless the maximum
  length is reached or, for every batch element, the lowest flagged finished score beats the
  best alive log-prob divided by the maximum-length penalty (the best that element's alive
  beams could still score). Unflagged finished entries count as 0 in the minimum, and an
  element with no finished sequence counts as -INF: it can never end the search early."""
  if step >= max_decode_length:
    return False
  best_alive = alive_log_probs[:, 0] / length_penalty(alpha, max_decode_length)
  lowest = (finished_scores * finished_flags.astype(np.float32)).min(axis=1)
  lowest = lowest + (1.0 - finished_flags.any(axis=1).astype(np.float32)) * -INF
  return not bool(np.all(lowest > best_alive))


def beam_search(symbols_to_logits_fn, initial_ids, initial_cache, vocab_size, beam_size, alpha,
                max_decode_length, eos_id, return_steps=False):
  """See jax_beam_search.beam_search for the contract; cache leaves are numpy arrays.
  With return_steps, also returns how many decoding steps the loop ran."""
  initial_ids = np.asarray(initial_ids, np.int32)
  batch, beam, length = initial_ids.shape[0], beam_size, max_decode_length + 1

  alive_seq = np.zeros([batch, beam, length], np.int32)
  alive_seq[:, :, 0] = initial_ids[:, None]
  alive_log_probs = np.full([batch, beam], -np.inf, np.float32)
  alive_log_probs[:, 0] = 0.0
  cache = _map(lambda x: np.repeat(np.asarray(x), beam, axis=0), initial_cache)
  finished_seq = np.zeros([batch, beam, length], np.int32)
  finished_scores = np.full([batch, beam], -INF, np.float32)
  finished_flags = np.zeros([batch, beam], bool)

  step = 0
  while _continue(step, alive_log_probs, finished_scores, finished_flags, alpha,
                  max_decode_length):
    logits, cache = symbols_to_logits_fn(alive_seq[:, :, step].reshape(-1), step, cache)
    log_probs = _log_softmax(np.asarray(logits, np.float32)).reshape(batch, beam, vocab_size)
    penalty = length_penalty(alpha, step + 1)
    rows = np.zeros([batch, beam], np.int64)  # which old row every new alive beam extends
    next_alive_seq = np.zeros_like(alive_seq)
    next_alive_log_probs = np.zeros_like(alive_log_probs)
    for b in range(batch):
      # every (beam, token) extension, scored by its total log-prob; keep the best 2 * beam
      totals = (log_probs[b] + alive_log_probs[b][:, None]).reshape(-1)
      candidates = []
      for flat in _top(totals, 2 * beam):
        src, token = divmod(int(flat), vocab_size)
        seq = alive_seq[b, src].copy()
        seq[step + 1] = token
        candidates.append((src, seq, totals[flat], token == eos_id))

      # alive: the best `beam` candidates that did not just end in EOS
      masked = [lp + (-INF if ended else np.float32(0)) for _, _, lp, ended in candidates]
      for slot, c in enumerate(_top(masked, beam)):
        rows[b, slot] = b * beam + candidates[c][0]
        next_alive_seq[b, slot] = candidates[c][1]
        next_alive_log_probs[b, slot] = masked[c]

      # finished: the best `beam` of the old finished entries and the new candidates, which
      # score log-prob / penalty when they ended in EOS and about -INF (unflagged) otherwise
      pool = [(finished_seq[b, j], finished_scores[b, j], finished_flags[b, j])
              for j in range(beam)]
      for _, seq, lp, ended in candidates:
        score = lp / penalty
        pool.append((seq, score if ended else score + -INF, ended))
      best = _top([score for _, score, _ in pool], beam)
      finished_seq[b] = np.stack([pool[j][0] for j in best])
      finished_scores[b] = [pool[j][1] for j in best]
      finished_flags[b] = [pool[j][2] for j in best]

    alive_seq, alive_log_probs = next_alive_seq, next_alive_log_probs
    cache = _map(lambda x: np.asarray(x)[rows.reshape(-1)], cache)
    step += 1

  # an element that finished nothing returns its alive beams and their raw log-probs
  any_finished = finished_flags.any(axis=1)
  sequences = np.where(any_finished[:, None, None], finished_seq, alive_seq)
  scores = np.where(any_finished[:, None], finished_scores, alive_log_probs)
  return (sequences, scores, step) if return_steps else (sequences, scores)
