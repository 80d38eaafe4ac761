"""BLEU as the MLPerf Transformer reference scores it (mlcommons/training, retired transformer
benchmark, compute_bleu.py, which is Tensor2Tensor's bleu_hook): uncased, mteval-v14
"international" tokenization, clipped n-gram precision up to order 4 against one reference,
the reference's smoothing of orders without matches and its brevity penalty, in BLEU points.

The quality target (25.0 uncased BLEU on newstest2014) is only meaningful when measured with
that exact recipe: sacreBLEU's default (13a tokenizer, cased, other smoothing) gives other
numbers. BLEU is a corpus statistic, so the score is built in two steps: per-sentence counts
(`sentence_stats`), which can be summed over sentences and over hosts, and one score from the
sums (`bleu_from_stats`). Framework-neutral: standard library and numpy only."""
import collections
import functools
import math
import re
import sys
import unicodedata

import numpy as np

MAX_ORDER = 4
# [matches per order, possible matches per order, hypothesis length, reference length].
NUM_STATS = 2 * MAX_ORDER + 2


def _category_chars(prefix, exclude=""):
  """Every code point whose Unicode general category starts with `prefix` ("P": punctuation,
  "S": symbols), escaped for a regex character class. Like the reference, it stops one short of
  sys.maxunicode (U+10FFFF is unassigned, so nothing is lost)."""
  return "".join(re.escape(chr(c)) for c in range(sys.maxunicode)
                 if unicodedata.category(chr(c)).startswith(prefix) and chr(c) not in exclude)


@functools.lru_cache(maxsize=None)
def _patterns():
  """The three tokenizer regexes, built on first use: scanning all code points takes about a
  second, which an import should not pay."""
  # The reference pastes the raw punctuation characters into its character class, where the
  # backslash (U+005C, category Po) escapes the "]" after it instead of standing for itself.
  # Its tokenizer therefore never splits at a backslash; leaving it out here keeps our tokens
  # identical to the reference's.
  punct = _category_chars("P", exclude="\\")
  symbols = _category_chars("S")
  # \d is any Unicode decimal digit, as in the reference (Python 3 str patterns). mteval-v14
  # itself says "not a number" (\P{N}); the difference only shows for non-Nd numerals (e.g. "½").
  return (re.compile(r"(\D)([" + punct + r"])"),  # punctuation after a non-digit
          re.compile(r"([" + punct + r"])(\D)"),  # punctuation before a non-digit
          re.compile(r"([" + symbols + r"])"))   # every symbol


def tokenize(text):
  """mteval-v14 international tokenization as the reference does it (case is left alone):
  punctuation is split off unless it sits between two digits ("3.5", "1,000" stay whole), and
  every symbol ("$", "+", "€") is split off. The substitutions run one after another with
  non-overlapping matches, so quirks such as "2018." at the very end of a line staying one token
  are the reference's (and mteval-v14's) too."""
  after_nondigit, before_nondigit, symbol = _patterns()
  text = after_nondigit.sub(r"\1 \2 ", text)
  text = before_nondigit.sub(r" \1 \2", text)
  text = symbol.sub(r" \1 ", text)
  return text.split()


def _ngram_counts(tokens, max_order):
  counts = collections.Counter()
  for n in range(1, max_order + 1):
    for i in range(len(tokens) - n + 1):
      counts[tuple(tokens[i:i + n])] += 1
  return counts


def sentence_stats(hypothesis, reference, max_order=MAX_ORDER):
  """Counts of one hypothesis against its reference, after lower-casing and tokenizing both:
  float64 [clipped matches per order, hypothesis n-grams per order, hypothesis length,
  reference length]. Counts are integers, exact in float64, so sums over any split agree."""
  hyp = tokenize(hypothesis.lower())
  ref = tokenize(reference.lower())
  ref_counts = _ngram_counts(ref, max_order)
  stats = np.zeros(2 * max_order + 2, np.float64)
  for ngram, count in _ngram_counts(hyp, max_order).items():
    # Clipping: an n-gram is credited at most as often as the reference has it.
    stats[len(ngram) - 1] += min(count, ref_counts[ngram])
    stats[max_order + len(ngram) - 1] += count
  stats[-2] = len(hyp)
  stats[-1] = len(ref)
  return stats


def corpus_stats(hypotheses, references, max_order=MAX_ORDER):
  """Sum of `sentence_stats` over aligned hypotheses and references."""
  hypotheses, references = list(hypotheses), list(references)
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
  total = np.zeros(2 * max_order + 2, np.float64)
  for hyp, ref in zip(hypotheses, references):
    total += sentence_stats(hyp, ref, max_order)
  return total


def bleu_from_stats(stats, max_order=MAX_ORDER):
  """BLEU points (0-100) from summed statistics, with the reference's arithmetic.

  Kept from the reference on purpose: an order without matches gets precision
  1 / (2^k * possible), k counting such orders so far (1 for the first, 2 for the second, ...);
  an order the hypotheses are too short to have contributes nothing to the log sum, which is
  still divided by max_order (a fully matching one-word corpus scores 100 before the brevity
  penalty); no hypothesis tokens at all score 0. The brevity penalty is exp(1 - r/c) for c < r,
  1 when c >= r, 0 when c == 0, and 1 when r == 0 (Tensor2Tensor's guarded form; the MLPerf copy
  divides by zero there instead). The reference returns float32; this stays float64."""
  stats = np.asarray(stats, np.float64)
  if stats.shape != (2 * max_order + 2,):
    raise ValueError(f"expected {2 * max_order + 2} statistics, got shape {stats.shape}")
  matches, possible = stats[:max_order], stats[max_order:2 * max_order]
  hyp_len, ref_len = float(stats[-2]), float(stats[-1])

  precisions = []
  smooth = 1.0
  for m, p in zip(matches.tolist(), possible.tolist()):
    if p <= 0:
      precisions.append(0.0)
    elif m > 0:
      precisions.append(m / p)
    else:
      smooth *= 2
      precisions.append(1.0 / (smooth * p))
  geo_mean = 0.0
  if max(precisions) > 0:
    geo_mean = math.exp(sum(math.log(p) for p in precisions if p) / max_order)

  if not ref_len:
    brevity = 1.0
  else:
    ratio = hyp_len / ref_len
    if ratio <= 0.0:
      brevity = 0.0
    elif ratio >= 1.0:
      brevity = 1.0
    else:
      brevity = math.exp(1.0 - 1.0 / ratio)
  return 100.0 * geo_mean * brevity


def corpus_bleu(hypotheses, references, max_order=MAX_ORDER):
  """Uncased corpus BLEU in points, as the MLPerf Transformer reference reports it."""
  return bleu_from_stats(corpus_stats(hypotheses, references, max_order), max_order)
