"""Prefill policies: which prompt tokens run in the next prefill call (numpy only).

- SERIAL: one whole prompt per call (B=1, T=n) in the prefill worker, beside decode.
- VARLEN: in the prefill worker, beside decode, one call takes up to `chunk` prompt
  tokens from one or more waiting prompts, flattened without padding
  (`Engine.prefill_varlen`); a prompt cut at the budget continues from its carried
  state in the next call.
- MIXED: no worker; a decode step also carries up to `chunk` prompt tokens, picked the
  same way (`Engine.mixed_step`), so prefill never stalls decode for more than a chunk.

The planner sees only remaining prompt lengths; the scheduler keeps the requests.
`varlen_shape` buckets a flattened call's token rows so that engines compile few shapes.
"""
from __future__ import annotations

from typing import Sequence

MAX_PIECES = 8
"""Most prompts one flattened call carries (its sequence rows are padded to this)."""


def plan_pieces(remaining: Sequence[int], budget: int, max_pieces: int = MAX_PIECES) -> list[int]:
    """Tokens the next flattened call takes from each head-of-queue prompt: `budget`
    tokens filled first-come first-served over at most `max_pieces` prompts, the last
    one possibly cut. `remaining`: tokens left per waiting prompt, in queue order (each
    >= 1). Returns one count (>= 1) per prompt taken, in order."""
    if budget < 1 or max_pieces < 1:
        raise ValueError(f"plan_pieces needs budget >= 1 and max_pieces >= 1, got {budget}, {max_pieces}")
    counts: list[int] = []
    left = budget
    for n in remaining:
        if left == 0 or len(counts) == max_pieces:
            break
        if n < 1:
            raise ValueError(f"a waiting prompt has {n} tokens left; every piece needs >= 1")
        counts.append(min(n, left))
        left -= counts[-1]
    return counts


def varlen_shape(n_tokens: int, min_tokens: int = 16) -> int:
    """Token rows a flattened call of `n_tokens` compiles for: the next power of two, at
    least `min_tokens`. Calls filled to a power-of-two budget waste nothing."""
    if n_tokens < 1:
        raise ValueError(f"varlen_shape needs n_tokens >= 1, got {n_tokens}")
    return max(min_tokens, 1 << (n_tokens - 1).bit_length())
