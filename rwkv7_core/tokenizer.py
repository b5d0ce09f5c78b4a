"""The RWKV World tokenizer (vocabulary 65536) through ``pyrwkv-tokenizer``.

Token 0 is end-of-text. Encoding uses the package's Rust encoder. Decoding maps ids to
bytes through the vocabulary file the package ships, because the package's own decoder
aborts on ids it lacks (65530..65535 exist in the model's vocabulary but not in the
file) and on byte sequences that are not complete UTF-8, both of which a sampler can
produce. Models with another vocabulary size have no tokenizer and take token ids.

numpy-free and framework-free; ``pyrwkv_tokenizer`` is imported on first use.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterable

from .constants import END_OF_TEXT, WORLD_VOCAB_SIZE

__all__ = ["END_OF_TEXT", "WORLD_VOCAB_SIZE", "WorldTokenizer", "tokenizer_for", "world_vocab_file"]


class WorldTokenizer:
    """encode(text) -> list[int]; decode(ids) -> str; decode_bytes(ids) -> bytes."""

    vocab_size = WORLD_VOCAB_SIZE
    end_of_text = END_OF_TEXT

    def __init__(self, vocab_file: str | Path | None = None) -> None:
        import pyrwkv_tokenizer  # lazily: only text-mode runs need it

        self._vocab_file = Path(vocab_file) if vocab_file else world_vocab_file()
        self._encoder = pyrwkv_tokenizer.WorldTokenizer(str(self._vocab_file))
        self._bytes: dict[int, bytes] | None = None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (never contains END_OF_TEXT)."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        return list(self._encoder.encode(text))

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
        """id -> bytes, parsed once from the vocabulary file ('<id> <python literal> <len>')."""
        if self._bytes is None:
            table = {}
            for line in self._vocab_file.read_text(encoding="utf-8").splitlines():
                first, last = line.index(" "), line.rindex(" ")
                token = ast.literal_eval(line[first + 1:last])
                table[int(line[:first])] = token.encode("utf-8") if isinstance(token, str) else token
            self._bytes = table
        return self._bytes


def world_vocab_file() -> Path:
    """The World vocabulary file ``pyrwkv-tokenizer`` ships ('<id> <python literal> <len>' lines)."""
    import pyrwkv_tokenizer

    return Path(pyrwkv_tokenizer.__file__).parent / "rwkv_vocab_v20230424.txt"


_WORLD: WorldTokenizer | None = None


def tokenizer_for(vocab_size: int, model_path: str | Path | None = None) -> WorldTokenizer | None:
    """The World tokenizer for a model with ``vocab_size == 65536`` (with the vocabulary file
    of a Hugging Face model directory ``model_path`` when it holds one); None otherwise (the
    caller then reads and writes token ids)."""
    global _WORLD
    if vocab_size != WORLD_VOCAB_SIZE:
        return None
    local = Path(model_path) / "rwkv_vocab_v20230424.txt" if model_path and Path(model_path).is_dir() else None
    if local is not None and local.is_file():
        return WorldTokenizer(local)
    if _WORLD is None:
        _WORLD = WorldTokenizer()
    return _WORLD
