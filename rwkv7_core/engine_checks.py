"""The argument checks of the engine contract (rwkv7_core/engine.py), shared by every engine;
each raises ValueError naming the problem."""
from __future__ import annotations

from typing import Sequence

import numpy as np


def check_prompt(tokens, call: str, min_tokens: int = 1) -> np.ndarray:
    """``tokens`` as a 1-D numpy array of at least ``min_tokens`` tokens (``call``: the engine
    call, named in the error)."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.size < min_tokens:
        raise ValueError(f"{call} needs a 1-D token array of >= {min_tokens} tokens, got shape {tokens.shape}")
    return tokens


def check_slot(slot: int, bucket: int) -> None:
    """``slot`` must lie in the current bucket."""
    if not 0 <= slot < bucket:
        raise ValueError(f"slot {slot} outside the current bucket of {bucket}")


def check_resize(keep_slots: Sequence[int], bucket: int, new_bucket: int) -> list[int]:
    """``keep_slots`` as a list: slots of the current bucket that fit in ``new_bucket``."""
    keep = list(keep_slots)
    if len(keep) > new_bucket or any(not 0 <= s < bucket for s in keep):
        raise ValueError(f"cannot keep slots {keep} of bucket {bucket} in bucket {new_bucket}")
    return keep
