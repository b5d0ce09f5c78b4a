"""Packed allowed-token masks: what a grammar constraint lets a row draw next.

A mask of a vocabulary of V tokens is int32 [..., W] with W = ``mask_words(V)``: bit
``v % 32`` of word ``v // 32`` is set when token v is allowed (llguidance's layout). A row
without a constraint is ``ALL_ALLOWED`` in every word. Engines with
``Capability.TOKEN_MASK`` take a batch's masks [B, W] and set the logits of disallowed tokens
to -inf before sampling, exactly as a banned token (rwkv7_core/sampling.py); this module is
the numpy definition of the unpacking. A step's masks may also come as a mask function
(``Masks``): the engine calls it once, after it has started the step's model forward and
before sampling, so the host computes the masks while the device runs the forward.
"""
from __future__ import annotations

from typing import Callable, Union

import numpy as np

ALL_ALLOWED = -1
"""A mask word with every bit set (int32)."""


Masks = Union[np.ndarray, Callable[[], np.ndarray], None]
"""A step's packed masks int32 [B, W], a function returning them, or None (no row constrained)."""


def masks_now(allowed: Masks) -> np.ndarray | None:
    """The masks of ``allowed``: a mask function is called now; an array or None is returned as is."""
    return allowed() if callable(allowed) else allowed


def mask_words(vocab_size: int) -> int:
    """W: int32 words of one row's mask."""
    return (vocab_size + 31) // 32


def all_allowed(rows: int, vocab_size: int) -> np.ndarray:
    """int32 [rows, W] masks that allow every token."""
    return np.full((rows, mask_words(vocab_size)), ALL_ALLOWED, np.int32)


def unpack_allowed(allowed: np.ndarray, vocab_size: int) -> np.ndarray:
    """bool [..., V] from packed masks int32 [..., W]."""
    v = np.arange(vocab_size)
    return ((allowed[..., v >> 5] >> (v & 31)) & 1).astype(bool)


def pack_allowed(allowed: np.ndarray) -> np.ndarray:
    """int32 [..., W] packed masks of bool [..., V] (the inverse of ``unpack_allowed``)."""
    V = allowed.shape[-1]
    padded = np.zeros((*allowed.shape[:-1], mask_words(V) * 32), bool)
    padded[..., :V] = allowed
    bits = padded.reshape(*allowed.shape[:-1], -1, 32).astype(np.uint64) << np.arange(32, dtype=np.uint64)
    return bits.sum(axis=-1).astype(np.uint32).view(np.int32)
