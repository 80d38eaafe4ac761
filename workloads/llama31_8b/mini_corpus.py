"""The mini corpus: generated documents in the reference's file format (Megatron .bin/.idx, as
indexed_dataset.write writes them), with a structure a 2-layer Llama of hidden 64 learns in
about a minute on a CPU, and whose best achievable log-perplexity is known exactly.

Vocabulary: token 0 is the end-of-document token (EOD, appended to every document, as
preprocess_data_for_megatron --append-eod would), 1..V-1 are words. Each document draws one of
`topics` topics uniformly; its first word is uniform over the words; each following position
ends the document with probability q = 1 / mean_document_length (geometric lengths: the end
is unpredictable, and says nothing of the topic) or else moves to one of the current word's
SUCCESSORS successors under the topic's chain (distinct words, probabilities
SUCCESSOR_PROBS). Topics share the vocabulary, so the chain a document follows must be read
from its context: a model that only sees the previous token does worse (`bigram`) than one
that infers the topic (`true`).

`entropies` gives, on the eval samples (each predicted only from the sample's own earlier
tokens, as the model sees them):
  true     the Bayes-optimal mean log-loss: the topic posterior filtered over the window (its
           start weighted by each topic's occupancy of the first token, reset at each EOD)
  bigram   the best predictor from the previous token alone
  unigram  the best context-free predictor (the stationary token distribution)
A mini target belongs between `true` and `bigram`.
"""
import numpy as np

from workloads.llama31_8b import indexed_dataset

EOD = 0
SUCCESSORS = 3
SUCCESSOR_PROBS = (0.8, 0.15, 0.05)
MINI_FORMAT_VERSION = 1                 # bump when the generator changes
TRAIN_PREFIX = "mini-train_text_document"
EVAL_PREFIX = "mini-eval_text_document"


class Chains:
  """The generator's parameters: successors [topics, V, SUCCESSORS] (row EOD unused) and
  their probabilities; q the per-position end probability."""

  def __init__(self, vocab_size, topics, mean_document_length, seed):
    if vocab_size < SUCCESSORS + 2:
      raise ValueError(f"vocab_size={vocab_size}; allowed: at least {SUCCESSORS + 2}")
    rng = np.random.default_rng(seed)
    self.vocab_size, self.topics = vocab_size, topics
    self.q = 1.0 / mean_document_length
    self.probs = np.asarray(SUCCESSOR_PROBS, np.float64)
    words = vocab_size - 1
    self.successors = np.zeros((topics, vocab_size, SUCCESSORS), np.int64)
    for k in range(topics):
      for w in range(1, vocab_size):
        self.successors[k, w] = 1 + rng.choice(words, SUCCESSORS, replace=False)
    self.rng = rng

  def transition(self, k) -> np.ndarray:
    """P_k[w, w'] of topic k's word chain (given the document goes on), [V, V]."""
    p = np.zeros((self.vocab_size, self.vocab_size))
    for j in range(SUCCESSORS):
      np.add.at(p, (np.arange(1, self.vocab_size), self.successors[k, 1:, j]), self.probs[j])
    return p

  def occupancy(self) -> np.ndarray:
    """mu[k, w]: the chance a word position of a topic-k document holds w: the first word
    uniform, then the chain, each position reached with (1 - q)^t: q u (I - (1-q) P_k)^-1."""
    v = self.vocab_size
    u = np.full(v, 1.0 / (v - 1))
    u[EOD] = 0.0
    mu = np.zeros((self.topics, v))
    for k in range(self.topics):
      a = np.eye(v) - (1 - self.q) * self.transition(k)
      mu[k] = self.q * np.linalg.solve(a.T, u)
    return mu

  def documents(self, count):
    """`count` documents (int arrays ending in EOD) and their topics."""
    rng, v = self.rng, self.vocab_size
    topics = rng.integers(self.topics, size=count)
    lengths = rng.geometric(self.q, size=count)            # words, at least 1
    tokens = np.zeros((count, int(lengths.max())), np.int64)
    tokens[:, 0] = rng.integers(1, v, size=count)
    cumulative = np.cumsum(self.probs)
    cumulative[-1] = 1.0
    for t in range(1, tokens.shape[1]):
      pick = np.searchsorted(cumulative, rng.random(count), side="right")
      tokens[:, t] = self.successors[topics, tokens[:, t - 1], pick]
    docs = [np.append(tokens[i, :lengths[i]], EOD) for i in range(count)]
    return docs, topics


def unigram(chains) -> np.ndarray:
  """The stationary token distribution: a document is 1/q words on average and one EOD."""
  q = chains.q
  p = chains.occupancy().mean(0) / (1 + q)
  p[EOD] = q / (1 + q)
  return p


def predictive(chains, samples):
  """The three predictors' probabilities of each label: samples [N, L + 1] -> dict of [N, L]
  arrays ('true', 'bigram', 'unigram'); label t is samples[:, t + 1] given samples[:, :t + 1]."""
  samples = np.asarray(samples, np.int64)
  n, length = samples.shape[0], samples.shape[1] - 1
  q, v, k_count = chains.q, chains.vocab_size, chains.topics
  trans = np.stack([chains.transition(k) for k in range(k_count)])      # [K, V, V]
  mu = chains.occupancy()                                               # [K, V]
  first = 1.0 / (v - 1)
  out = {name: np.zeros((n, length)) for name in ("true", "bigram", "unigram")}
  # topic posterior given the window so far: at its start, by each topic's occupancy of x_0
  post = mu[:, samples[:, 0]].T.copy()                                  # [N, K]
  post[samples[:, 0] == EOD] = 1.0
  post /= post.sum(1, keepdims=True)
  # bigram: the topic posterior from the previous token alone
  w_post = mu / np.maximum(mu.sum(0, keepdims=True), 1e-300)            # [K, V]
  uni = unigram(chains)
  for t in range(length):
    cur, nxt = samples[:, t], samples[:, t + 1]
    after_eod = cur == EOD
    step = trans[:, cur, nxt].T                                         # [N, K]
    word = np.where(nxt == EOD, q, (1 - q) * (post * step).sum(1))
    # after an EOD the next document's first word: uniform over the words (never EOD)
    out["true"][:, t] = np.where(after_eod, first, word)
    big = np.where(nxt == EOD, q, (1 - q) * (w_post[:, cur].T * step).sum(1))
    out["bigram"][:, t] = np.where(after_eod, first, big)
    out["unigram"][:, t] = uni[nxt]
    # filter: a word after a word weighs each topic by its transition; EOD resets; the first
    # word of a document says nothing of its topic
    new = post * step
    new_sum = new.sum(1, keepdims=True)
    keep = (~after_eod) & (nxt != EOD) & (new_sum[:, 0] > 0)
    post = np.where(keep[:, None], new / np.where(new_sum > 0, new_sum, 1.0), post)
    post[(nxt == EOD) | after_eod] = 1.0 / k_count
  return out


def entropies(chains, samples) -> dict:
  """Mean log-loss (nats a token) of each predictor on `samples` ([N, L + 1] token windows),
  and the unigram distribution's entropy."""
  probs = predictive(chains, samples)
  out = {name: float(-np.log(p).mean()) for name, p in probs.items()}
  uni = unigram(chains)
  out["unigram_entropy"] = float(-(uni[uni > 0] * np.log(uni[uni > 0])).sum())
  return out


def write_corpus(folder, vocab_size, topics, mean_document_length, train_documents,
                 eval_documents, seed):
  """Writes TRAIN_PREFIX and EVAL_PREFIX (.bin/.idx) under folder; returns (chains, token
  counts)."""
  import os
  chains = Chains(vocab_size, topics, mean_document_length, seed)
  train, _ = chains.documents(train_documents)
  evals, _ = chains.documents(eval_documents)
  dtype = indexed_dataset.optimal_dtype(vocab_size)
  n_train = indexed_dataset.write(os.path.join(folder, TRAIN_PREFIX), train, dtype)
  n_eval = indexed_dataset.write(os.path.join(folder, EVAL_PREFIX), evals, dtype)
  return chains, {"train_tokens": n_train, "eval_tokens": n_eval}
