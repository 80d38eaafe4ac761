"""Subword tokenizer of the MLPerf Transformer reference (WMT En-De, `vocab.ende.32768`).

The reference turns source sentences into ids and model output ids back into text with a
Tensor2Tensor-style subword vocabulary. BLEU is computed on the decoded text, so any difference
in how text is split, escaped, matched against the vocabulary or joined back would change the
score; this module reimplements that algorithm step for step, with the standard library only, so
both frameworks' pipelines and the eval share one copy and need no TensorFlow to tokenize.

Encoding: the text is cut into runs of alphanumeric characters (Unicode categories L* and N*)
and runs of everything else; a lone space between two alphanumeric runs is dropped, since
decoding puts it back. Each run is escaped ("\\" -> "\\\\", "_" -> "\\u", a character outside
the vocabulary's alphabet -> "\\<code point>;"), marked as a word end with "_", and cut into
vocabulary entries by greedy longest match from the left. Decoding concatenates the entries,
cuts at the "_" word ends, unescapes, and joins with a space between two alphanumeric runs.

Vocabulary files hold one entry per line in single quotes, "<pad>" (id 0) and "<EOS>" (id 1)
first. `build_word_level` makes a small valid vocabulary for generated test corpora;
`from_learned_pieces` one from subwords learned by tfds' SubwordTextEncoder.
"""
import itertools
import operator
import re
import string
import unicodedata

import numpy as np

PAD_ID = 0
EOS_ID = 1
RESERVED = ("<pad>", "<EOS>")

# Every character an escaped token can need besides its own ones: "\" opens each escape, "u"
# ends the escape of "_", digits and ";" spell "\<code point>;", and "_" ends each token. They
# belong to every alphabet, so encoding never depends on them occurring in the entries.
_ESCAPE_CHARS = frozenset("\\_u;0123456789")
_UNESCAPE = re.compile(r"\\u|\\\\|\\([0-9]+);")
# What an escape naming no valid code point decodes to (U+3013, as in the reference).
_BAD_CODE_POINT = "\u3013"
# Bound on the per-encoder memo of token -> ids; corpora repeat words, so it saves most of the
# matching, and clearing it when full keeps memory flat on a whole WMT pass.
_CACHE_LIMIT = 1 << 20


def _is_alnum(char):
  # The reference tests membership in the set of code points whose category starts with L or N;
  # asking unicodedata per character is the same test without building a million-entry set.
  return unicodedata.category(char)[0] in "LN"


def split_tokens(text):
  """Alternating alphanumeric / other runs of `text`, single spaces between words dropped.

  A run of exactly one space is dropped only inside the list: as the first or last run it is
  kept (the reference never drops the final run), so leading and trailing spaces survive."""
  runs = ["".join(group) for _, group in itertools.groupby(text, _is_alnum)]
  last = len(runs) - 1
  # Runs alternate in kind, so an inner " " run always sits between two alphanumeric runs,
  # exactly where join_tokens puts a space back.
  return [run for i, run in enumerate(runs) if run != " " or i in (0, last)]


def join_tokens(tokens):
  """Inverse of split_tokens: a space between two tokens that both start alphanumeric."""
  # Only the first character of each token is looked at (as in the reference); it matters for
  # decoded model output, whose tokens need not be pure runs.
  out = []
  for i, token in enumerate(tokens):
    if i and _is_alnum(tokens[i - 1][0]) and _is_alnum(token[0]):
      out.append(" ")
    out.append(token)
  return "".join(out)


def escape_token(token, alphabet):
  """`token` in the vocabulary's escaped form, with the "_" word-end mark appended."""
  # Backslashes first, so the backslash of "\u" is not doubled; a newline is always escaped
  # (as in the reference), which keeps it out of one-entry-per-line vocabulary files.
  token = token.replace("\\", "\\\\").replace("_", "\\u")
  return "".join(c if c in alphabet and c != "\n" else f"\\{ord(c)};" for c in token) + "_"


def _unescape_match(match):
  if match.group(1) is None:
    return "_" if match.group(0) == "\\u" else "\\"
  try:
    return chr(int(match.group(1)))
  except (ValueError, OverflowError):  # model output can spell any number, valid or not
    return _BAD_CODE_POINT


def unescape_token(escaped):
  """Inverse of escape_token for one word without its "_" mark."""
  return _UNESCAPE.sub(_unescape_match, escaped)


def _as_ids(ids):
  """`ids` (a list, tuple or 1-D integer array) as a list of Python ints."""
  if isinstance(ids, np.ndarray):
    if ids.ndim != 1:
      raise ValueError(f"decode takes one sequence of ids, got shape {ids.shape}")
    ids = ids.tolist()
  ids = [operator.index(i) for i in ids]  # rejects floats rather than truncating them
  if any(i < 0 for i in ids):
    # The reference would index its list from the end here; no model emits negative ids, so
    # one means a caller bug and is better raised than decoded as some unrelated entry.
    raise ValueError(f"negative id in {ids}")
  return ids


def until_eos(ids):
  """`ids` up to (not including) the first EOS_ID or PAD_ID."""
  ids = _as_ids(ids)
  for i, token_id in enumerate(ids):
    if token_id in (EOS_ID, PAD_ID):
      return ids[:i]
  return ids


class SubwordEncoder:
  """Encodes text to subword ids and decodes ids to text with a reference-format vocabulary."""

  def __init__(self, subtokens):
    subtokens = list(subtokens)
    if tuple(subtokens[:len(RESERVED)]) != RESERVED:
      raise ValueError(f"a vocabulary starts with {RESERVED}, got {subtokens[:2]}")
    rest = subtokens[len(RESERVED):]
    # Reserved tokens elsewhere would vanish from a saved file when it is read back (the
    # reference's loader skips them), and every later id would shift.
    if any(s in RESERVED for s in rest):
      raise ValueError(f"{RESERVED} may only be the first entries")
    if any("\n" in s for s in subtokens):
      raise ValueError("a vocabulary entry cannot contain a newline")
    self._subtokens = subtokens
    # A duplicated entry maps to its last id, as the reference's dict built in order does.
    self._ids = {s: i for i, s in enumerate(subtokens)}
    # Characters of every entry, reserved ones included (the reference does the same), plus
    # the escape characters; anything else in a text is escaped as "\<code point>;".
    self._alphabet = frozenset(itertools.chain.from_iterable(subtokens)) | _ESCAPE_CHARS
    # No match can be longer than the longest entry, so the search starts there.
    self._max_len = max(len(s) for s in subtokens)
    self._cache = {}

  @classmethod
  def from_file(cls, path):
    """Reads a vocabulary file as the reference does: the line stripped of surrounding white
    space, its first and last characters (the quotes) dropped, "<pad>" and "<EOS>" skipped
    wherever they are and put at ids 0 and 1."""
    # Lines end at "\n" only (like TensorFlow's file reader); a "\r" is stripped at line ends.
    with open(path, encoding="utf-8", newline="\n") as f:
      entries = [line.strip()[1:-1] for line in f]
    return cls(list(RESERVED) + [s for s in entries if s not in RESERVED])

  def save(self, path):
    """Writes the vocabulary file from_file reads: each entry in single quotes, one a line."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
      f.writelines(f"'{s}'\n" for s in self._subtokens)

  @property
  def vocab_size(self):
    """Number of entries, reserved tokens included."""
    return len(self._subtokens)

  @property
  def subtokens(self):
    return tuple(self._subtokens)

  def encode(self, text):
    """Subword ids of `text`; no EOS_ID is appended."""
    ids = []
    for token in split_tokens(text):
      ids.extend(self._token_ids(token))
    return ids

  def _token_ids(self, token):
    cached = self._cache.get(token)
    if cached is not None:
      return cached
    if len(self._cache) >= _CACHE_LIMIT:
      self._cache.clear()
    ids = self._cache[token] = self._longest_matches(escape_token(token, self._alphabet))
    return ids

  def _longest_matches(self, escaped):
    ids, start = [], 0
    while start < len(escaped):
      for end in range(min(len(escaped), start + self._max_len), start, -1):
        token_id = self._ids.get(escaped[start:end])
        if token_id is not None:
          ids.append(token_id)
          start = end
          break
      else:
        # Only a vocabulary lacking a single-character entry for one of its alphabet's
        # characters gets here; reference vocabularies have them all.
        raise ValueError(f"no vocabulary entry matches {escaped[start:]!r} (of {escaped!r})")
    return ids

  def decode(self, ids):
    """Text of `ids`. Every id is decoded, reserved ones as their literal text (strip EOS and
    padding first, e.g. with decode_until_eos); ids >= vocab_size decode to nothing, as in the
    reference (e.g. from an output layer padded past the vocabulary)."""
    size = len(self._subtokens)
    joined = "".join(self._subtokens[i] for i in _as_ids(ids) if i < size)
    return join_tokens([unescape_token(word) for word in joined.split("_") if word])

  def decode_until_eos(self, ids):
    """Text of `ids` up to the first EOS_ID or PAD_ID (a model's padded output row)."""
    return self.decode(until_eos(ids))


def build_word_level(words, extra_chars=""):
  """A vocabulary in the reference format for a small generated corpus: the reserved tokens,
  each of `words` as one entry, then one entry per character (those of the words and of
  `extra_chars`, ASCII letters, digits, punctuation, space and the escape characters), so any
  text encodes and an unknown word falls back to character pieces. Ids depend only on the set
  of words and characters, not on their order."""
  words = sorted(set(words))
  for word in words:
    if split_tokens(word) != [word]:
      # Encoding never presents a longer string to the vocabulary, so such an entry could
      # never be used.
      raise ValueError(f"{word!r} is not a single token: {split_tokens(word)}")
  chars = _alphabet(set(itertools.chain.from_iterable(words)) | set(extra_chars))
  # Every character of the words is a single-character entry, hence in the alphabet, so a
  # word's entry is its escaped form under any alphabet holding its characters.
  word_entries = [escape_token(word, chars) for word in words]
  return SubwordEncoder(list(RESERVED) + word_entries + sorted(chars))


# tfds' SubwordTextEncoder writes a literal "_" inside a piece as this string.
_TFDS_UNDERSCORE = "\\&undsc"


def _alphabet(chars):
  """`chars` plus the ASCII letters, digits, punctuation and space, the escape characters and
  the reserved tokens' characters; never a newline (always escaped, so never in an entry)."""
  return (set(chars) | _ESCAPE_CHARS | set(string.ascii_letters + string.digits
                                           + string.punctuation + " ")
          | set(itertools.chain.from_iterable(RESERVED))) - {"\n"}


def from_learned_pieces(pieces):
  """A reference-format vocabulary from subword pieces tfds' SubwordTextEncoder learned
  (`.subwords`): a trailing "_" marks a piece that ends a word in both conventions, so each
  piece is escaped as this tokenizer escapes (tfds' literal "_", "\\&undsc", becomes "\\u")
  and keeps its word-end mark; then one entry per alphabet character, so any text encodes.
  (tfds marks a word end only before a single space, so its pieces before punctuation lack
  the mark and match here only inside a word; encoding falls back to shorter entries there.)"""
  learned = []
  for piece in pieces:
    end = piece.endswith("_")
    core = (piece[:-1] if end else piece).replace(_TFDS_UNDERSCORE, "_")
    if core and "\n" not in core:
      learned.append((core, end))
  alphabet = _alphabet(itertools.chain.from_iterable(core for core, _ in learned))
  entries = [escape_token(core, alphabet)[:None if end else -1] for core, end in learned]
  entries = [e for e in dict.fromkeys(entries) if len(e) > 1]     # characters come last
  return SubwordEncoder(list(RESERVED) + entries + sorted(alphabet))
