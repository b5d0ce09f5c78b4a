"""What makes a request valid for an engine: its sampling parameters and its prompt."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from rwkv7_core.sampling import SamplingParams

from .request import Request


def validated(request: Request, vocab_size: int, tokenizer=None, logprobs_unsupported: str | None = None,
              max_tokens_limit: int | None = None) -> tuple[SamplingParams, list[int]]:
    """(params, prompt tokens) of ``request``; ValueError or TypeError saying what is wrong.
    ``params`` may be a SamplingParams or its dict; stop strings need ``tokenizer``;
    ``logprobs_unsupported``: why token logprobs cannot be served (None: they can);
    ``max_tokens_limit``: the most ``max_tokens`` allowed (``SamplingParams.validate``)."""
    params = request.params
    if isinstance(params, Mapping):
        params = SamplingParams.from_dict(params)
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be SamplingParams or a dict, got {type(params).__name__}")
    params.validate(vocab_size, max_tokens_limit)
    if params.stop and tokenizer is None:
        raise ValueError("stop strings need a tokenizer (Scheduler(tokenizer=...))")
    if params.logprobs is not None and logprobs_unsupported is not None:
        raise ValueError(logprobs_unsupported)
    prompt = np.asarray(request.prompt_tokens)
    if prompt.ndim != 1 or prompt.size == 0:
        raise ValueError("prompt_tokens is empty" if prompt.size == 0
                         else f"prompt_tokens must be a flat list, got shape {prompt.shape}")
    if prompt.dtype.kind not in "iu":
        raise ValueError(f"prompt_tokens must be integers, got {prompt.dtype}")
    bad = np.flatnonzero((prompt < 0) | (prompt >= vocab_size))
    if bad.size:
        raise ValueError(f"prompt token {int(prompt[bad[0]])} at position {int(bad[0])} is "
                         f"outside the vocabulary [0, {vocab_size})")
    return params, prompt.tolist()
