"""Paper cost of one forward: bytes moved and floating-point operations (pure Python)."""
from __future__ import annotations

from .config import ModelConfig


def step_bytes_and_flops(config: ModelConfig, params_bytes: int, itemsize: int, B: int, T: int,
                         state_itemsize: int = 4) -> tuple[int, int]:
    """(bytes, flops) of one forward of B x T tokens: every weight once (the embedding only
    for the rows used), the state read and written (shifts of ``itemsize`` bytes, the wkv
    state of ``state_itemsize``), and 2 flops per weight per token."""
    c = config
    emb = c.vocab_size * c.n_embd
    state = c.n_layer * (2 * c.n_embd * itemsize + c.n_head * c.head_size ** 2 * state_itemsize)
    weights = params_bytes - emb * itemsize + B * T * c.n_embd * itemsize
    flops = 2 * B * T * (c.n_params - emb) + 6 * B * T * c.n_layer * c.n_head * c.head_size ** 2
    return weights + 2 * B * state, flops
