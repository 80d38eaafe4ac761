"""The Transformer's subword tokenizer against ids and splits worked out by hand from the
MLPerf reference's algorithm (mlcommons/training, retired transformer, utils/tokenizer.py)."""
import numpy as np
import pytest

from workloads.transformer import subwords
from workloads.transformer.subwords import EOS_ID, PAD_ID, SubwordEncoder

# A vocabulary file in the reference format, written out line by line.
HAND_VOCAB = [
    "<pad>", "<EOS>",                                 # 0, 1
    "hell", "o_", "he", "world_", ", _", "!_",        # 2..7
    "ab", "abc", "cd_",                               # 8..10
    "h", "e", "l", "o", "_", "w", "r", "d", ",", " ",  # 11..20
    "!", "a", "b", "c", "\\", "u", ";",               # 21..27
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9",  # 28..37
]


@pytest.fixture
def hand(tmp_path):
  path = tmp_path / "vocab.hand"
  path.write_text("".join(f"'{s}'\n" for s in HAND_VOCAB), encoding="utf-8")
  return SubwordEncoder.from_file(str(path))


@pytest.fixture(scope="module")
def words():
  corpus = "the cat sat on the mat . die Katze saß auf der Matte über Äpfeln , 42 mal !"
  return subwords.build_word_level(corpus.split())


SENTENCES = [
    "Hello, world!",
    "The cat sat on the mat, 42 times; then 7 more...",
    "Die Katze saß auf der Matte und aß Äpfel über Öl für Übermut.",
    "snake_case names and a back\\slash",
    "it costs 5€ (€ is outside the alphabet)",
    "  leading and trailing spaces  ",
    "two\nlines\tand a tab",
    "",
]


@pytest.mark.parametrize("text", SENTENCES)
def test_round_trip(words, text):
  ids = words.encode(text)
  assert all(isinstance(i, int) and 0 <= i < words.vocab_size for i in ids)
  assert (ids == []) == (text == "")
  assert words.decode(ids) == text


def test_out_of_alphabet_characters_are_escaped_as_code_points(words):
  pieces = "".join(words.subtokens[i] for i in words.encode("5€\n_"))
  # "5" and "€\n_" are the two tokens; "€" (U+20AC = 8364) is not in the alphabet, a newline
  # is always escaped, and "_" becomes "\u".
  assert pieces == "5_\\8364;\\10;\\u_"


def test_escape_and_unescape_token():
  # Backslash doubled before "_" turns into "\u"; "c" is outside the alphabet (which, as in
  # every vocabulary, holds the escape characters); a newline is escaped even when it is in.
  alphabet = set("ab\n") | set("\\_u;0123456789")
  assert subwords.escape_token("a\nb_\\c", alphabet) == "a\\10;b\\u\\\\\\99;_"
  assert subwords.unescape_token("a\\10;b\\u\\\\\\99;") == "a\nb_\\c"
  # Escapes naming no code point (model output can spell any) decode to U+3013.
  assert subwords.unescape_token("\\1114112;x\\99999999999999999999999;") == "\u3013x\u3013"


def test_exact_ids_from_a_hand_made_vocab_file(hand):
  assert hand.vocab_size == 38
  # "hello_": the longest entry is 6 long; "hello_" and "hello" are no entries, so "hell" (2)
  # wins over "he" (4) and "h" (11), then "o_" (3).
  assert hand.encode("hello") == [2, 3]
  # Tokens "hello", ", ", "world", "!" -> "hello_" [2, 3], ", _" [6], "world_" [5], "!_" [7].
  assert hand.encode("hello, world!") == [2, 3, 6, 5, 7]
  # Greedy, not fewest pieces: "abcd_" takes "abc" (9), then "d" (18) and "_" (15), although
  # "ab" (8) + "cd_" (10) would be two pieces.
  assert hand.encode("abcd") == [9, 18, 15]
  # "x" is outside the alphabet: "\120;_" -> "\" 25, "1" 29, "2" 30, "0" 28, ";" 27, "_" 15.
  assert hand.encode("x") == [25, 29, 30, 28, 27, 15]
  # "a_b" splits into "a", "_", "b": "a_" is no entry -> a 22, _ 15; "_" escapes to "\u_" ->
  # 25, 26, 15; "b_" -> 23, 15.
  assert hand.encode("a_b") == [22, 15, 25, 26, 15, 23, 15]
  assert hand.decode([2, 3, 6, 5, 7]) == "hello, world!"
  assert hand.decode([9, 18, 15]) == hand.decode([8, 10]) == "abcd"
  assert hand.decode([25, 29, 30, 28, 27, 15]) == "x"
  assert hand.decode([22, 15, 25, 26, 15, 23, 15]) == "a_b"
  assert hand.decode(np.array([2, 3], np.int32)) == "hello"


def test_decode_keeps_reserved_ids_and_drops_ids_past_the_vocab(hand):
  # The reference decodes every id: reserved ones as their text (glued to the next piece, as
  # they carry no "_"), ids >= vocab_size as nothing.
  assert hand.decode([2, 1, 3]) == "hell<EOS>o"
  assert hand.decode([2, 38, 1000, 3]) == "hello"
  assert hand.decode([]) == ""
  assert hand.decode_until_eos([2, 3, EOS_ID, 5, PAD_ID]) == "hello"
  assert hand.decode_until_eos(np.array([5, PAD_ID, 2, 3, EOS_ID])) == "world"
  assert hand.decode_until_eos([EOS_ID, 2, 3]) == ""
  with pytest.raises(ValueError):
    hand.decode([2, -1])


def test_alphabet_includes_reserved_token_characters(hand):
  # "p" occurs only in "<pad>", yet that puts it in the alphabet, so it is not escaped and,
  # having no entry of its own, cannot be encoded (the reference raises the same way). "x"
  # is outside the alphabet and escapes.
  with pytest.raises(ValueError, match="no vocabulary entry"):
    hand.encode("p")
  assert hand.encode("x") == [25, 29, 30, 28, 27, 15]


def test_from_file_puts_reserved_tokens_first_wherever_they_are(tmp_path, hand):
  moved = tmp_path / "moved"
  moved.write_text("".join(f"'{s}'\n" for s in HAND_VOCAB[2:5] + ["<EOS>"] + HAND_VOCAB[5:]
                           + ["<pad>"]), encoding="utf-8")
  missing = tmp_path / "missing"
  missing.write_text("".join(f"'{s}'\r\n" for s in HAND_VOCAB[2:]), encoding="utf-8")
  for path in (moved, missing):
    loaded = SubwordEncoder.from_file(str(path))
    assert loaded.subtokens == tuple(HAND_VOCAB)
    assert loaded.encode("hello, world!") == [2, 3, 6, 5, 7]


@pytest.mark.parametrize("text, tokens", [
    ("Hello, world!", ["Hello", ", ", "world", "!"]),
    ("test? testing 123.", ["test", "? ", "testing", "123", "."]),
    ("Straße über Öl", ["Straße", "über", "Öl"]),
    (" a b ", [" ", "a", "b", " "]),
    ("a  b", ["a", "  ", "b"]),
    ("5€ x²Ⅻ", ["5", "€ ", "x²Ⅻ"]),
    ("don't", ["don", "'", "t"]),
    ("snake_case", ["snake", "_", "case"]),
    ("", []),
])
def test_split_and_join_tokens(text, tokens):
  assert subwords.split_tokens(text) == tokens
  assert subwords.join_tokens(tokens) == text


def test_save_then_from_file_gives_identical_ids(tmp_path, words):
  path = tmp_path / "vocab.words"
  words.save(str(path))
  lines = path.read_text(encoding="utf-8").split("\n")
  assert lines[:3] == ["'<pad>'", "'<EOS>'", "'!_'"] and lines[-1] == ""
  assert len(lines) - 1 == words.vocab_size
  loaded = SubwordEncoder.from_file(str(path))
  assert loaded.subtokens == words.subtokens
  assert loaded.vocab_size == words.vocab_size
  assert loaded.subtokens[PAD_ID] == "<pad>" and loaded.subtokens[EOS_ID] == "<EOS>"
  for text in SENTENCES:
    assert loaded.encode(text) == words.encode(text)


def test_build_word_level(words):
  # The reserved tokens, then the 18 distinct words sorted by code point, then characters.
  assert words.subtokens[:4] == ("<pad>", "<EOS>", "!_", ",_")
  for word in ["the", "cat", "saß", "Äpfeln", "über", "42", ",", "!"]:
    ids = words.encode(word)
    assert len(ids) == 1 and words.subtokens[ids[0]] == word + "_"
  # "the cat" is two ids, the space being implied.
  assert len(words.encode("the cat")) == 2
  unknown = "Zaunkönig_9"
  ids = words.encode(unknown)
  assert len(ids) > 3 and words.decode(ids) == unknown
  # Ids depend on the set of words, not their order or repeats.
  again = subwords.build_word_level(["über", "the", "the"] + "cat sat on".split())
  assert again.subtokens == subwords.build_word_level("on cat über sat the".split()).subtokens
  with pytest.raises(ValueError, match="single token"):
    subwords.build_word_level(["don't"])


def test_build_word_level_extra_chars():
  plain = subwords.build_word_level(["a"])
  euro = subwords.build_word_level(["a"], extra_chars="€")
  assert len(plain.encode("€")) == 7  # "\8364;" one character a piece, then "_"
  assert len(euro.encode("€")) == 2   # "€", then "_"
  assert euro.decode(euro.encode("a €")) == plain.decode(plain.encode("a €")) == "a €"
