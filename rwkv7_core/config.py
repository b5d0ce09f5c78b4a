"""RWKV-7 model configuration and the official checkpoint layout (framework-free).

Everything here is plain Python: both the torch reference and the JAX model read
it, and neither framework is imported.
"""
from __future__ import annotations

from typing import NamedTuple


class ModelConfig(NamedTuple):
    """Sizes of an RWKV-7 ("x070") model, all inferred from checkpoint shapes.

    n_embd = n_head * head_size (C = H * N); dim_ffn is the channel-mix width F
    (4C in released models); d_decay/d_aaa/d_mv/d_gate are the low-rank widths
    Dw/Da/Dv/Dg of the w, a, v and g projections.
    """

    n_layer: int
    n_embd: int
    n_head: int
    head_size: int
    vocab_size: int
    dim_ffn: int
    d_decay: int
    d_aaa: int
    d_mv: int
    d_gate: int

    @property
    def n_params(self) -> int:
        return sum(_prod(s) for s in expected_shapes(self).values())


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


# Released shapes (see docs/MODEL.md) plus a tiny one for tests. Vocabulary 65536
# is the World tokenizer's.
NAMED_CONFIGS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(2, 128, 2, 64, 512, 512, 32, 32, 16, 32),
    "0.1b": ModelConfig(12, 768, 12, 64, 65536, 3072, 64, 64, 32, 128),
    "0.4b": ModelConfig(24, 1024, 16, 64, 65536, 4096, 64, 64, 32, 128),
    "1.5b": ModelConfig(24, 2048, 32, 64, 65536, 8192, 96, 96, 64, 256),
    "2.9b": ModelConfig(32, 2560, 40, 64, 65536, 10240, 96, 96, 64, 320),
}


def named_config(name: str) -> ModelConfig:
    try:
        return NAMED_CONFIGS[name]
    except KeyError:
        raise ValueError(
            f"unknown model shape {name!r}; choose one of {sorted(NAMED_CONFIGS)}") from None


# Per-block tensors: key suffix -> shape as a function of the config.
_BLOCK_SHAPES = {
    "ln1.weight": lambda c: (c.n_embd,),
    "ln1.bias": lambda c: (c.n_embd,),
    "ln2.weight": lambda c: (c.n_embd,),
    "ln2.bias": lambda c: (c.n_embd,),
    **{f"att.x_{n}": (lambda c: (1, 1, c.n_embd)) for n in "rwkvag"},
    "att.w0": lambda c: (1, 1, c.n_embd),
    "att.w1": lambda c: (c.n_embd, c.d_decay),
    "att.w2": lambda c: (c.d_decay, c.n_embd),
    "att.a0": lambda c: (1, 1, c.n_embd),
    "att.a1": lambda c: (c.n_embd, c.d_aaa),
    "att.a2": lambda c: (c.d_aaa, c.n_embd),
    "att.v0": lambda c: (1, 1, c.n_embd),
    "att.v1": lambda c: (c.n_embd, c.d_mv),
    "att.v2": lambda c: (c.d_mv, c.n_embd),
    "att.g1": lambda c: (c.n_embd, c.d_gate),
    "att.g2": lambda c: (c.d_gate, c.n_embd),
    "att.k_k": lambda c: (1, 1, c.n_embd),
    "att.k_a": lambda c: (1, 1, c.n_embd),
    "att.r_k": lambda c: (c.n_head, c.head_size),
    "att.receptance.weight": lambda c: (c.n_embd, c.n_embd),
    "att.key.weight": lambda c: (c.n_embd, c.n_embd),
    "att.value.weight": lambda c: (c.n_embd, c.n_embd),
    "att.output.weight": lambda c: (c.n_embd, c.n_embd),
    "att.ln_x.weight": lambda c: (c.n_embd,),
    "att.ln_x.bias": lambda c: (c.n_embd,),
    "ffn.x_k": lambda c: (1, 1, c.n_embd),
    "ffn.key.weight": lambda c: (c.dim_ffn, c.n_embd),
    "ffn.value.weight": lambda c: (c.n_embd, c.dim_ffn),
}

BLOCK_KEYS: tuple[str, ...] = tuple(_BLOCK_SHAPES)


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every key of an official checkpoint with its shape, in a stable order."""
    c = config
    shapes: dict[str, tuple[int, ...]] = {"emb.weight": (c.vocab_size, c.n_embd)}
    shapes["blocks.0.ln0.weight"] = (c.n_embd,)
    shapes["blocks.0.ln0.bias"] = (c.n_embd,)
    for layer in range(c.n_layer):
        for suffix, shape_of in _BLOCK_SHAPES.items():
            shapes[f"blocks.{layer}.{suffix}"] = tuple(shape_of(c))
    shapes["ln_out.weight"] = (c.n_embd,)
    shapes["ln_out.bias"] = (c.n_embd,)
    shapes["head.weight"] = (c.vocab_size, c.n_embd)
    return shapes
