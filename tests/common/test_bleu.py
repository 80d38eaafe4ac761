"""BLEU as the MLPerf Transformer reference scores it: worked examples whose counts and scores
are derived by hand below, the mteval-v14 tokenization rules on realistic text, and the
corpus-level summing of statistics that multi-host evaluation relies on."""
import math

import numpy as np
import pytest

from workloads.common import bleu


def _stats(matches, possible, hyp_len, ref_len):
  return np.array([*matches, *possible, hyp_len, ref_len], np.float64)


# Two sentences worked by hand.
# 1) hyp "the cat sat on the mat" (6 tokens), ref "the cat sat on a mat" (6 tokens)
#    1-grams: the x2 (ref has one: clipped to 1), cat, sat, on, mat -> 5 of 6
#    2-grams: the cat, cat sat, sat on match; on the, the mat do not -> 3 of 5
#    3-grams: the cat sat, cat sat on match; sat on the, on the mat do not -> 2 of 4
#    4-grams: the cat sat on matches; cat sat on the, sat on the mat do not -> 1 of 3
# 2) hyp "a dog barks" (3 tokens), ref "the dog barks loudly" (4 tokens)
#    1-grams: dog, barks match, a does not -> 2 of 3; 2-grams: dog barks -> 1 of 2
#    3-grams: "a dog barks" is not in the reference -> 0 of 1; 4-grams: none possible (0 of 0)
# Corpus: matches 7, 4, 2, 1 of 9, 7, 5, 3; hypothesis length 9, reference length 10.
# Every order has a match, so no smoothing: precisions 7/9, 4/7, 2/5, 1/3 with product
# 56/945 = 8/135, geometric mean (8/135)^(1/4); brevity penalty exp(1 - 10/9) = exp(-1/9).
HYPS = ["the cat sat on the mat", "a dog barks"]
REFS = ["the cat sat on a mat", "the dog barks loudly"]
CORPUS_BLEU = 100 * (8 / 135) ** 0.25 * math.exp(-1 / 9)  # 44.1503...


def test_exact_match_is_100():
  text = "The cat sat on the mat, and the dog barked at 3.5 birds."
  assert bleu.corpus_bleu([text], [text]) == pytest.approx(100.0, abs=1e-12)
  assert bleu.corpus_bleu(HYPS, HYPS) == pytest.approx(100.0, abs=1e-12)


def test_two_sentence_corpus_worked_by_hand():
  np.testing.assert_array_equal(bleu.sentence_stats(HYPS[0], REFS[0]),
                                _stats([5, 3, 2, 1], [6, 5, 4, 3], 6, 6))
  np.testing.assert_array_equal(bleu.sentence_stats(HYPS[1], REFS[1]),
                                _stats([2, 1, 0, 0], [3, 2, 1, 0], 3, 4))
  stats = bleu.corpus_stats(HYPS, REFS)
  np.testing.assert_array_equal(stats, _stats([7, 4, 2, 1], [9, 7, 5, 3], 9, 10))
  assert stats.dtype == np.float64 and stats.shape == (bleu.NUM_STATS,)
  assert bleu.corpus_bleu(HYPS, REFS) == pytest.approx(CORPUS_BLEU, abs=1e-9)
  assert round(CORPUS_BLEU, 4) == 44.1503


def test_orders_without_matches_are_smoothed_by_doubling():
  # hyp "the quick brown fox jumps" vs ref "the quick red fox jumps" (5 tokens each: no penalty)
  # 1-grams 4 of 5 (brown), 2-grams 2 of 4 (the quick, fox jumps), 3-grams 0 of 3, 4-grams 0 of 2.
  # First zero order: 1 / (2 * 3) = 1/6; second: 1 / (4 * 2) = 1/8.
  # Product 4/5 * 1/2 * 1/6 * 1/8 = 1/120, so BLEU = 100 * 120^(-1/4) = 30.2137...
  hyp, ref = "the quick brown fox jumps", "the quick red fox jumps"
  np.testing.assert_array_equal(bleu.sentence_stats(hyp, ref), _stats([4, 2, 0, 0], [5, 4, 3, 2],
                                                                        5, 5))
  assert bleu.corpus_bleu([hyp], [ref]) == pytest.approx(100 * (1 / 120) ** 0.25, abs=1e-9)
  # The same smoothing in the second sentence of the worked corpus alone: 3-grams 0 of 1 gives
  # 1 / (2 * 1); 4-grams are impossible (precision 0, left out of the log sum).
  # (2/3 * 1/2 * 1/2)^(1/4) * exp(1 - 4/3) = 45.78...
  assert bleu.corpus_bleu(HYPS[1:], REFS[1:]) == pytest.approx(
      100 * (1 / 6) ** 0.25 * math.exp(-1 / 3), abs=1e-9)


def test_short_hypothesis_pays_the_brevity_penalty():
  # Every hypothesis n-gram matches (precisions 1), but 6 tokens against 7: exp(1 - 7/6).
  score = bleu.corpus_bleu(["the cat sat on the mat"], ["the cat sat on the mat today"])
  assert score == pytest.approx(100 * math.exp(-1 / 6), abs=1e-9)  # 84.648...
  assert score < 100


def test_long_hypothesis_has_no_brevity_penalty():
  # 7 tokens against 6 (ratio >= 1: penalty 1). Matches 6/7, 5/6, 4/5, 3/4: product 3/7.
  score = bleu.corpus_bleu(["the cat sat on the mat today"], ["the cat sat on the mat"])
  assert score == pytest.approx(100 * (3 / 7) ** 0.25, abs=1e-9)  # 80.91...


def test_orders_too_long_for_the_hypotheses_count_as_one():
  # "the cat" has no 3- or 4-grams: those precisions are 0 and skipped, yet the log sum is still
  # divided by 4, so the geometric mean is 1 and only the brevity penalty exp(1 - 3/2) remains.
  assert bleu.corpus_bleu(["the cat"], ["the cat sat"]) == pytest.approx(
      100 * math.exp(-0.5), abs=1e-9)
  assert bleu.corpus_bleu(["cat"], ["cat"]) == pytest.approx(100.0, abs=1e-12)


def test_empty_hypotheses():
  assert bleu.corpus_bleu([""], ["the cat sat on the mat"]) == 0.0
  assert bleu.corpus_bleu(["", ""], ["", ""]) == 0.0
  assert bleu.corpus_bleu([], []) == 0.0
  # An empty line in a corpus still adds its reference length: 6 hypothesis tokens, all
  # matching, against 6 + 2 reference tokens gives exp(1 - 8/6).
  score = bleu.corpus_bleu(["the cat sat on the mat", ""], ["the cat sat on the mat", "a dog"])
  assert score == pytest.approx(100 * math.exp(-1 / 3), abs=1e-9)


def test_empty_references_follow_the_guarded_brevity_penalty():
  # Reference length 0: penalty 1 (Tensor2Tensor's guard; the MLPerf copy divides by zero).
  # hyp "a b": 1-grams 0 of 2 -> 1/(2*2); 2-grams 0 of 1 -> 1/(4*1); (1/16)^(1/4) = 1/2.
  assert bleu.corpus_bleu(["a b"], [""]) == pytest.approx(50.0, abs=1e-9)


def test_bleu_from_stats_checks_its_input():
  assert bleu.NUM_STATS == 10
  with pytest.raises(ValueError):
    bleu.bleu_from_stats(np.zeros(8))
  with pytest.raises(ValueError):
    bleu.corpus_stats(["a"], ["a", "b"])
  # Other orders have their own layout: 2 * max_order + 2 numbers.
  assert bleu.sentence_stats("a b c", "a b d", max_order=2).shape == (6,)
  assert bleu.bleu_from_stats(_stats([2, 1], [3, 2], 3, 3), max_order=2) == pytest.approx(
      100 * (2 / 3 * 1 / 2) ** 0.5, abs=1e-9)


@pytest.mark.parametrize("text, tokens", [
    # Decimal points and thousands separators sit between digits and stay; "%" follows a digit
    # but precedes a space, so it is split; "€" is a symbol (Sc) and "." then follows a non-digit.
    ("Der Preis stieg um 3.5% auf 1,000 €.",
     ["Der", "Preis", "stieg", "um", "3.5", "%", "auf", "1,000", "€", "."]),
    # German quotes (Ps/Pi), an en dash and a hyphen are punctuation next to letters; umlauts
    # and "ß" are letters.
    ("Sie sagte: „Das ist ein gut-bekanntes Maß“ – wirklich!",
     ["Sie", "sagte", ":", "„", "Das", "ist", "ein", "gut", "-", "bekanntes", "Maß", "“", "–",
      "wirklich", "!"]),
    ("Größere Straßen in Köln's Süden", ["Größere", "Straßen", "in", "Köln", "'", "s", "Süden"]),
    # Symbols are split even between digits (only punctuation is protected there).
    ("2+2=4 and $1,000.50", ["2", "+", "2", "=", "4", "and", "$", "1,000.50"]),
    # Punctuation that follows a space is split even before a digit ...
    ("minus -5 Grad", ["minus", "-", "5", "Grad"]),
    # ... but not at the start of a line, and a number's final dot at the end of a line stays
    # attached (mteval-v14 does the same).
    ("-5 Grad im Jahr 2018.", ["-5", "Grad", "im", "Jahr", "2018."]),
    ("Es war 2018. Dann", ["Es", "war", "2018", ".", "Dann"]),
    # English quotes, comma, a double hyphen and a final quote after "?".
    ('He said, "It costs $1,000.50 -- really?"',
     ["He", "said", ",", '"', "It", "costs", "$", "1,000.50", "-", "-", "really", "?", '"']),
    # The reference never splits at a backslash (see bleu._patterns), but does at a slash.
    ("path\\to and/or", ["path\\to", "and", "/", "or"]),
])
def test_tokenize_follows_the_mteval_international_rules(text, tokens):
  assert bleu.tokenize(text) == tokens


def test_uncased():
  assert bleu.tokenize("The Cat") == ["The", "Cat"]  # tokenize leaves case to the caller
  assert bleu.corpus_bleu(["The Cat"], ["the cat"]) == pytest.approx(100.0, abs=1e-12)
  np.testing.assert_array_equal(bleu.sentence_stats("Über DEN Fluß", "über den fluß"),
                                _stats([3, 2, 1, 0], [3, 2, 1, 0], 3, 3))


def test_corpus_bleu_is_not_the_mean_of_sentence_bleus():
  # Alone, sentence 1 scores (5/6 * 3/5 * 2/4 * 1/3)^(1/4) = (1/12)^(1/4) -> 53.73 and
  # sentence 2 scores 45.78 (see the smoothing test); their mean is 49.76, the corpus 44.15.
  first = bleu.corpus_bleu(HYPS[:1], REFS[:1])
  second = bleu.corpus_bleu(HYPS[1:], REFS[1:])
  assert first == pytest.approx(100 * (1 / 12) ** 0.25, abs=1e-9)
  mean = (first + second) / 2
  assert mean == pytest.approx(49.755, abs=1e-3)
  corpus = bleu.corpus_bleu(HYPS, REFS)
  assert corpus == pytest.approx(CORPUS_BLEU, abs=1e-9)
  assert abs(corpus - mean) > 5


def test_stats_summed_over_hosts_give_the_corpus_score():
  hyps = HYPS + ["The quick brown fox jumps.", "Es war 2018 sehr kalt.", "Er zahlte 1,000 €"]
  refs = REFS + ["The quick red fox jumps!", "Es war 2018 kalt.", "Er bezahlte 1,000 €."]
  whole = bleu.corpus_stats(hyps, refs)
  host0, host1 = bleu.corpus_stats(hyps[:2], refs[:2]), bleu.corpus_stats(hyps[2:], refs[2:])
  np.testing.assert_array_equal(host0 + host1, whole)
  assert bleu.bleu_from_stats(host0 + host1) == bleu.corpus_bleu(hyps, refs)
  # Averaging per-host scores instead would be wrong.
  per_host = (bleu.bleu_from_stats(host0) + bleu.bleu_from_stats(host1)) / 2
  assert abs(per_host - bleu.corpus_bleu(hyps, refs)) > 1
