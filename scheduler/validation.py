"""What makes a request valid for an engine: its sampling parameters and its prompt.

The one definition of request validity: the scheduler checks every request it is given
(``validated``); the batch job and the server check a request where it enters with the
same functions (``sampling_params``, ``prompt_tokens``) to answer with their own wording.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from rwkv7_core.sampling import SamplingParams

from .request import Request


def sampling_params(params, vocab_size: int, tokenizer=None, logprobs_unsupported: str | None = None,
                    max_tokens_limit: int | None = None) -> SamplingParams:
    """``params`` (a SamplingParams or its dict) validated for ``vocab_size``; ValueError or
    TypeError saying what is wrong. Stop strings need ``tokenizer``; ``logprobs_unsupported``:
    why token logprobs cannot be served (None: they can); ``max_tokens_limit``: the most
    ``max_tokens`` allowed (``SamplingParams.validate``)."""
    if isinstance(params, Mapping):
        params = SamplingParams.from_dict(params)
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be SamplingParams or a dict, got {type(params).__name__}")
    params.validate(vocab_size, max_tokens_limit)
    if params.stop and tokenizer is None:
        raise ValueError("stop strings need a tokenizer (Scheduler(tokenizer=...))")
    if params.logprobs is not None and logprobs_unsupported is not None:
        raise ValueError(logprobs_unsupported)
    return params


def prompt_tokens(tokens, vocab_size: int) -> list[int]:
    """``tokens`` (a flat sequence of ints, each in [0, vocab_size)) as a list; ValueError
    saying what is wrong."""
    prompt = np.asarray(tokens)
    if prompt.ndim != 1 or prompt.size == 0:
        raise ValueError("prompt_tokens is empty" if prompt.size == 0
                         else f"prompt_tokens must be a flat list, got shape {prompt.shape}")
    listed = prompt.tolist()
    bad: np.ndarray | list[int]
    if prompt.dtype.kind in "iu":
        bad = np.flatnonzero((prompt < 0) | (prompt >= vocab_size))
    elif prompt.dtype == object and all(type(t) is int for t in listed):  # ints past int64
        bad = [i for i, t in enumerate(listed) if not 0 <= t < vocab_size]
    else:
        raise ValueError(f"prompt_tokens must be integers, got {prompt.dtype}")
    if len(bad):
        raise ValueError(f"token id {listed[bad[0]]} at position {int(bad[0])} is "
                         f"outside the vocabulary [0, {vocab_size})")
    return listed


def validated(request: Request, vocab_size: int, tokenizer=None, logprobs_unsupported: str | None = None,
              max_tokens_limit: int | None = None) -> tuple[SamplingParams, list[int]]:
    """(params, prompt tokens) of ``request`` (``sampling_params``, ``prompt_tokens``)."""
    return (sampling_params(request.params, vocab_size, tokenizer, logprobs_unsupported, max_tokens_limit),
            prompt_tokens(request.prompt_tokens, vocab_size))


def check_group(requests: Sequence[Request]) -> None:
    """ValueError unless ``requests`` (an ``add_group`` group) share one prompt and initial state."""
    if (len({tuple(np.asarray(r.prompt_tokens).ravel().tolist()) for r in requests}) > 1
            or any(r.initial_state is not requests[0].initial_state for r in requests)
            or any(r.cache_salt != requests[0].cache_salt for r in requests)):
        raise ValueError("add_group needs requests with the same prompt_tokens, initial_state and cache_salt")
