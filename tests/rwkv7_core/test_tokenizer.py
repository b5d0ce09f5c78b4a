"""The World tokenizer wrapper: round trips, end-of-text, ids the vocabulary file lacks,
invalid UTF-8, which models get a tokenizer, and a numpy-only scheduler import."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from rwkv7_core import tokenizer as tokenizer_module
from rwkv7_core.tokenizer import END_OF_TEXT, WORLD_VOCAB_SIZE, tokenizer_for, world_vocab_file

ALPHABET = list("abcXYZ019 .,;!?\n\t'\"") + ["é", "ß", "Ж", "你", "好", "🙂", "𝄞", "  ", "\u00a0"]


@pytest.fixture(scope="module")
def tok():
    return tokenizer_for(WORLD_VOCAB_SIZE)


def test_tokenizer_only_for_world_vocabulary(tok):
    assert tok is not None and tokenizer_for(WORLD_VOCAB_SIZE) is tok
    assert tokenizer_for(512) is None and tokenizer_for(65530) is None


@pytest.mark.parametrize("text", ["", "Hello, world!", "  leading and trailing  \n",
                                  "Привет, 你好, مرحبا, 🙂🙃 𝄞", "User: 1+1=?\n\nAssistant: 2"])
def test_round_trip_fixed(tok, text):
    ids = tok.encode(text)
    assert all(0 < i < WORLD_VOCAB_SIZE for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode_bytes(ids) == text.encode("utf-8")


def test_round_trip_random(tok):
    rng = np.random.default_rng(0)
    for _ in range(50):
        text = "".join(rng.choice(ALPHABET, size=int(rng.integers(1, 40))))
        assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("piece_chars", [200, 1 << 16])
def test_a_long_text_encoded_in_pieces_has_the_ids_of_one_call(tok, monkeypatch, piece_chars):
    """Long texts go to the encoder a piece at a time (so the GIL is let go between pieces); the
    ids are those of one call of the package's encoder, with cuts inside words, runs of one
    character, multi-byte characters, characters the vocabulary has only as bytes (tokens that
    end inside a character) and long tokens (runs of spaces and dashes)."""
    import pyrwkv_tokenizer

    one_call = pyrwkv_tokenizer.WorldTokenizer(str(world_vocab_file())).encode
    monkeypatch.setattr(tokenizer_module, "PIECE_CHARS", piece_chars)
    rng = np.random.default_rng()
    words = ALPHABET + [" the", " tokenizer", "ing", "\n\n", " " * 40, "-" * 70, "你好", "🙂" * 5]
    size = 7 * piece_chars
    rare = "".join(map(chr, rng.integers(0x10000, 0x2FFFF, size)))  # mostly byte tokens: cuts inside characters
    texts = ["".join(rng.choice(words, size=size // 3)), "你" * size, "🙂" * size, " " * size,
             "".join(rng.choice(["a", "🙂", " ", "ß"], size=size)), rare]
    for text in texts:
        assert len(text) > 2 * piece_chars
        assert tok.encode(text) == list(one_call(text))


def test_pieces_cut_only_where_a_token_ends_on_a_character(tmp_path, monkeypatch):
    """A vocabulary with tokens that cross characters ('\\xac\\xe2\\x82' ends inside a euro
    sign and starts inside the one before): pieces resume only where a token ends on a character
    boundary, or the rest goes in one call when none does; the ids are one call's."""
    import pyrwkv_tokenizer

    from rwkv7_core.tokenizer import WorldTokenizer

    lines = world_vocab_file().read_text(encoding="utf-8").splitlines()[:256]  # the 256 single bytes
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join([*lines, "257 b'\\xe2\\x82' 2", "258 b'\\xac\\xe2\\x82' 3", "259 'aa' 2"]) + "\n",
                     encoding="utf-8")
    tok, one_call = WorldTokenizer(vocab), pyrwkv_tokenizer.WorldTokenizer(str(vocab)).encode
    monkeypatch.setattr(tokenizer_module, "PIECE_CHARS", 50)
    rng = np.random.default_rng()
    for text in ["".join(rng.choice(["€", "€", "€", "a", "aa"], size=2000)) for _ in range(5)] + ["€" * 2000]:
        assert tok.encode(text) == list(one_call(text))


def test_encoding_is_not_byte_level(tok):
    ids = tok.encode("Hello, world! " * 4)
    assert len(ids) < len("Hello, world! " * 4) / 2


def test_end_of_text_and_unassigned_ids_give_no_text(tok):
    hello = tok.encode("Hello")
    assert END_OF_TEXT == 0
    assert tok.decode([END_OF_TEXT]) == ""
    assert tok.decode(hello + [END_OF_TEXT, WORLD_VOCAB_SIZE - 1]) == "Hello"


def test_invalid_utf8_is_replaced_not_fatal(tok):
    ids = tok.encode("𝄞")  # a 4-byte character split over several tokens
    partial = tok.decode_bytes(ids[:-1])
    assert len(ids) > 1 and 0 < len(partial) < 4 and "𝄞".encode("utf-8").startswith(partial)
    assert tok.decode(ids[:-1]) == "\ufffd"


def test_bad_ids_and_inputs(tok):
    with pytest.raises(ValueError, match="token id 65536"):
        tok.decode([1, WORLD_VOCAB_SIZE])
    with pytest.raises(ValueError, match="token id -1"):
        tok.decode([-1])
    with pytest.raises(TypeError, match="str"):
        tok.encode(b"bytes")


def test_scheduler_tokenizer_imports_no_framework():
    code = ("import sys, rwkv7_core.tokenizer as t; t.tokenizer_for(65536).encode('hi'); "
            "bad = [m for m in ('torch', 'jax', 'flax') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("bad, needle", [
    ("1 'a' 3\n", "line 1: token 1 must be a str or bytes literal of 3 bytes"),
    ("1 'a' 1\nxx\n", "line 2: not '<id> <python literal> <byte length>'"),
    ("1 'a' 1\n1 'b' 1\n", "line 2: token 1 must be"),
    ("70000 'a' 1\n", "line 1: token 70000 must be"),
    ("1 [1, 2] 2\n", "line 1: token 1 must be"),
    ("1 'a\n", "line 1: not '<id>"),
    ("\xff", "cannot read the vocabulary"),
])
def test_malformed_vocabulary_of_a_model_directory_is_one_line(tmp_path, bad, needle):
    """A model directory's vocabulary is checked before the Rust encoder sees it (which used to
    panic); the shipped one still loads, and a symlink leading outside is refused."""
    from rwkv7_core.tokenizer import VocabularyError

    (tmp_path / "rwkv_vocab_v20230424.txt").write_bytes(bad.encode("latin-1"))
    with pytest.raises(VocabularyError) as err:
        tokenizer_for(WORLD_VOCAB_SIZE, tmp_path)
    assert needle in str(err.value) and "\n" not in str(err.value), err.value


def test_vocabulary_symlink_out_of_the_directory_is_refused(tmp_path):
    from rwkv7_core.tokenizer import VocabularyError, world_vocab_file

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "rwkv_vocab_v20230424.txt").symlink_to(world_vocab_file())
    with pytest.raises(VocabularyError, match="not a regular file inside the directory"):
        tokenizer_for(WORLD_VOCAB_SIZE, tmp_path / "model")
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "rwkv_vocab_v20230424.txt").write_bytes(world_vocab_file().read_bytes())
    text = "Hello, 世界 🙂"
    assert tokenizer_for(WORLD_VOCAB_SIZE, tmp_path / "ok").decode(tokenizer_for(WORLD_VOCAB_SIZE).encode(text)) == text
