"""The RWKV World tokenizer (vocabulary 65536) through ``pyrwkv-tokenizer``.

Token 0 is end-of-text. Encoding uses the package's Rust encoder, which holds the GIL for
the whole of a call. A long text is therefore encoded a piece at a time, with the same ids as
one call, so a server thread that encodes a large body leaves the GIL to the event loop between
pieces. Decoding maps ids to
bytes through the vocabulary file the package ships, because the package's own decoder
aborts on ids it lacks (65530..65535 exist in the model's vocabulary but not in the
file) and on byte sequences that are not complete UTF-8, both of which a sampler can
produce. Models with another vocabulary size have no tokenizer and take token ids.

A vocabulary file other than the package's own (a Hugging Face directory's) is parsed and
checked line by line before the Rust encoder sees it, so a malformed one is a one-line
``VocabularyError`` naming the file and line, never a panic.

numpy-free and framework-free; ``pyrwkv_tokenizer`` is imported on first use.
"""
from __future__ import annotations

import ast
import functools
import os
from pathlib import Path
from typing import Iterable

from .confined import confined_file
from .constants import END_OF_TEXT, WORLD_VOCAB_SIZE

__all__ = ["END_OF_TEXT", "WORLD_VOCAB_SIZE", "VocabularyError", "WorldTokenizer", "read_vocab", "tokenizer_for",
           "world_vocab_file"]
VOCAB_FILE = "rwkv_vocab_v20230424.txt"
PIECE_CHARS = 1 << 16  # characters per encoder call for long texts (well under a millisecond each)


class VocabularyError(ValueError):
    """A vocabulary file that cannot be used (one line naming the file and, where it applies, the line)."""


class WorldTokenizer:
    """encode(text) -> list[int]; decode(ids) -> str; decode_bytes(ids) -> bytes."""

    vocab_size = WORLD_VOCAB_SIZE
    end_of_text = END_OF_TEXT

    def __init__(self, vocab_file: str | Path | None = None) -> None:
        import pyrwkv_tokenizer  # lazily: only text-mode runs need it

        self._vocab_file = Path(vocab_file) if vocab_file else world_vocab_file()
        self._bytes: dict[int, bytes] | None = None if vocab_file is None else read_vocab(self._vocab_file)
        try:
            self._encoder = pyrwkv_tokenizer.WorldTokenizer(str(self._vocab_file))
        except BaseException as e:  # a Rust panic is a BaseException; interrupts pass through
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            first_line = (str(e).strip().splitlines() or [""])[0]
            raise VocabularyError(f"{str(self._vocab_file)!r}: the encoder refused the vocabulary "
                                  f"({type(e).__name__}: {first_line})") from None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (never contains END_OF_TEXT)."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        if len(text) <= 2 * PIECE_CHARS:
            return list(self._encoder.encode(text))
        return self._encode_in_pieces(text)

    def _encode_in_pieces(self, text: str) -> list[int]:
        """``encode(text)`` in calls of about PIECE_CHARS characters.

        The World encoder is greedy longest match. The token that starts at a byte depends only on
        the next ``longest`` bytes, where ``longest`` is the vocabulary's longest token. So a
        window encoded with that many characters past its cut gives the same tokens as one call,
        up to the last token that ends at or before the cut, on a character boundary. Encoding
        resumes from there. If no token ends on a character boundary before the cut, the rest of
        the text is encoded in one call."""
        table, margin = self._table(), self._longest_token
        ids: list[int] = []
        start = 0
        while len(text) - start > 2 * PIECE_CHARS:
            window = text[start:start + PIECE_CHARS + margin]
            piece = self._encoder.encode(window)
            data = window.encode("utf-8")
            cut = len(window[:PIECE_CHARS].encode("utf-8"))
            end, kept = len(data), len(piece)
            while kept and (end > cut or (end < len(data) and data[end] & 0xC0 == 0x80)):
                kept -= 1
                end -= len(table[piece[kept]])
            if not kept:
                break
            ids += piece[:kept]
            start += len(data[:end].decode("utf-8"))
        return ids + list(self._encoder.encode(text[start:]))

    @functools.cached_property
    def _longest_token(self) -> int:
        """Bytes of the vocabulary's longest token (128 in the World vocabulary), found once."""
        return max(map(len, self._table().values()))

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Raw bytes of ``ids``; end-of-text and ids without a vocabulary entry give none."""
        table = self._table()
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < WORLD_VOCAB_SIZE:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {WORLD_VOCAB_SIZE})")
            out.append(table.get(i, b""))
        return b"".join(out)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; bytes that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def _table(self) -> dict[int, bytes]:
        """id -> bytes, parsed once from the vocabulary file."""
        if self._bytes is None:
            self._bytes = read_vocab(self._vocab_file)
        return self._bytes


def read_vocab(path: Path) -> dict[int, bytes]:
    """id -> bytes of a World vocabulary file ('<id> <python str or bytes literal> <byte length>'
    lines, ids in [1, 65536) once each); VocabularyError naming the file and the first bad line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise VocabularyError(f"{str(path)!r}: cannot read the vocabulary ({type(e).__name__})") from None
    table: dict[int, bytes] = {}
    for number, line in enumerate(lines, 1):
        try:
            first, last = line.index(" "), line.rindex(" ")
            token, length = ast.literal_eval(line[first + 1:last]), int(line[last + 1:])
            index = int(line[:first])
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise VocabularyError(f"{str(path)!r} line {number}: not '<id> <python literal> <byte length>'") from None
        data = token.encode("utf-8") if isinstance(token, str) else token
        if not isinstance(data, bytes) or len(data) != length or not 0 < index < WORLD_VOCAB_SIZE or index in table:
            raise VocabularyError(f"{str(path)!r} line {number}: token {index} must be a str or bytes literal of "
                                  f"{length} bytes, with an id in [1, {WORLD_VOCAB_SIZE}) not seen before")
        table[index] = data
    return table


def world_vocab_file() -> Path:
    """The World vocabulary file ``pyrwkv-tokenizer`` ships ('<id> <python literal> <len>' lines)."""
    import pyrwkv_tokenizer

    return Path(pyrwkv_tokenizer.__file__).parent / VOCAB_FILE


_WORLD: WorldTokenizer | None = None


def tokenizer_for(vocab_size: int, model_path: str | Path | None = None) -> WorldTokenizer | None:
    """The World tokenizer for a model with ``vocab_size == 65536`` (with the vocabulary file
    of a Hugging Face model directory ``model_path`` when it holds one, confined to it); None
    otherwise (the caller then reads and writes token ids). VocabularyError for a malformed file."""
    global _WORLD
    if vocab_size != WORLD_VOCAB_SIZE:
        return None
    directory = Path(model_path) if model_path and Path(model_path).is_dir() else None
    if directory is not None and os.path.lexists(directory / VOCAB_FILE):
        local = confined_file(directory, VOCAB_FILE)
        if local is None:
            raise VocabularyError(f"{str(directory)!r}: {VOCAB_FILE} is not a regular file inside the directory")
        return WorldTokenizer(local)
    if _WORLD is None:
        _WORLD = WorldTokenizer()
    return _WORLD
