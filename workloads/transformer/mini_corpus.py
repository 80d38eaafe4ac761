"""The mini parallel corpus: a seeded toy "English" grammar and its "German" translation, with
learnable structure and nothing random in the translation (framework-neutral).

Source sentences are  DET [ADJ] NOUN VERB DET [ADJ] NOUN [ADVERB] .  and the target language
maps every word to its own word and reorders: the adjective follows its noun and the verb goes
to the end of the clause, before the adverb. Every adverb has two translations, drawn at random
per sentence, so no model scores BLEU 100 (MLPerf's checker wants eval_accuracy < 1) and the
best one loses a little on every sentence with an adverb. Target words carry umlauts and sharp
s, so the tokenizer and BLEU see non-ASCII text.
"""
import numpy as np

from workloads.transformer import subwords

CLASSES = ("det", "adj", "noun", "verb", "adverb")
_SOURCE_SYLLABLES = ("ka", "lo", "mi", "ter", "pan", "so", "ril", "bo", "ne", "vu", "tas", "gri")
_TARGET_SYLLABLES = ("ün", "be", "ßa", "gö", "ra", "lich", "te", "mä", "sch", "ko", "ei", "da")


def _words(rng, syllables, count, taken):
  """`count` distinct pseudo-words of 2-3 syllables, none in `taken`."""
  out = []
  while len(out) < count:
    word = "".join(rng.choice(syllables, size=rng.integers(2, 4)))
    if word not in taken:
      taken.add(word)
      out.append(word)
  return out


def lexicon(seed: int, words_per_class: int) -> dict:
  """{class: (source words, target words)}; target word i translates source word i, and for
  adverbs target word i + words_per_class does too (the synonym)."""
  rng = np.random.default_rng(seed)
  taken_source, taken_target = set(), set()
  return {c: (_words(rng, _SOURCE_SYLLABLES, words_per_class, taken_source),
              _words(rng, _TARGET_SYLLABLES, words_per_class * (2 if c == "adverb" else 1),
                     taken_target)) for c in CLASSES}


def vocabulary(seed: int, words_per_class: int) -> subwords.SubwordEncoder:
  """A vocabulary in the reference's format: every word of both languages whole, plus single
  characters (so any text still encodes)."""
  lex = lexicon(seed, words_per_class)
  words = sorted({w for source, target in lex.values() for w in source + target})
  return subwords.build_word_level(words, extra_chars=".")


def _noun_phrase(rng, lex):
  """(source words, target words) of DET [ADJ] NOUN / DET NOUN [ADJ]."""
  pick = lambda c: rng.integers(len(lex[c][0]))
  det, noun = pick("det"), pick("noun")
  src, tgt = [lex["det"][0][det]], [lex["det"][1][det]]
  if rng.random() < 0.5:
    adj = pick("adj")
    src.append(lex["adj"][0][adj])
    return src + [lex["noun"][0][noun]], tgt + [lex["noun"][1][noun], lex["adj"][1][adj]]
  return src + [lex["noun"][0][noun]], tgt + [lex["noun"][1][noun]]


def sentence_pair(rng, lex) -> tuple[str, str]:
  subj_src, subj_tgt = _noun_phrase(rng, lex)
  obj_src, obj_tgt = _noun_phrase(rng, lex)
  verb = rng.integers(len(lex["verb"][0]))
  src = subj_src + [lex["verb"][0][verb]] + obj_src
  tgt = subj_tgt + obj_tgt + [lex["verb"][1][verb]]
  if rng.random() < 0.5:
    adverb = rng.integers(len(lex["adverb"][0]))
    src.append(lex["adverb"][0][adverb])
    tgt.append(lex["adverb"][1][adverb + len(lex["adverb"][0]) * rng.integers(2)])
  return " ".join(src) + ".", " ".join(tgt) + "."


def pairs(seed: int, words_per_class: int, count: int, stream: int) -> list[tuple[str, str]]:
  """`count` pairs; `stream` 0 for training, 1 for eval (independent draws, same lexicon)."""
  lex = lexicon(seed, words_per_class)
  rng = np.random.default_rng([seed, stream])
  return [sentence_pair(rng, lex) for _ in range(count)]


def synthetic_packed(rng, vocab_size, batch_size, length):
  """Synthetic packed rows (the synthetic preset's batches, numpy): EOS-ended examples of
  2..length/4 tokens; source and target share the split."""
  segments, positions = (np.zeros((batch_size, length), np.int32) for _ in range(2))
  for row in range(batch_size):
    start, segment = 0, 1
    while start < length - 1:
      size = min(int(rng.integers(2, max(3, length // 4 + 1))), length - start)
      segments[row, start:start + size] = segment
      positions[row, start:start + size] = np.arange(size)
      start, segment = start + size, segment + 1
  last = (segments > 0) & (np.roll(segments, -1, axis=1) != segments)
  batch = {}
  for name in ("inputs", "targets"):
    ids = rng.integers(2, vocab_size, (batch_size, length)).astype(np.int32)
    ids = np.where(last, subwords.EOS_ID, np.where(segments > 0, ids, 0)).astype(np.int32)
    batch.update({name: ids, f"{name}_segmentation": segments, f"{name}_position": positions})
  return batch
