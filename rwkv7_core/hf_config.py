"""``config.json`` of a Hugging Face RWKV-7 directory (fla's ``RWKV7Config`` keys), read and written.

Every size is bounded before anything is built from it: an integer (an integral float such
as ``64.0`` passes, ``1e300`` does not) inside ``SIZE_BOUNDS``, heads times head size equal to
the hidden size, and low-rank widths at most the hidden size. A field outside is a one-line
CheckpointError naming the key, so a hostile config can never size an allocation; the sizes
are then checked against the tensors present (``hf_checkpoint``).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import cast

from .config import ModelConfig
from .confined import confined_file
from .tensor_files import CheckpointError

MODEL_TYPES = ("rwkv7", "rwkv7_fla")

# config.json key -> the largest value read (the smallest is 1). The widths bounded by the
# hidden size are checked against it afterwards.
SIZE_BOUNDS = {"num_hidden_layers": 4096, "hidden_size": 1 << 16, "vocab_size": 1 << 24, "num_heads": 1 << 16,
               "head_dim": 1 << 16, "intermediate_size": 1 << 20, "decay_low_rank_dim": 1 << 16,
               "a_low_rank_dim": 1 << 16, "v_low_rank_dim": 1 << 16, "gate_low_rank_dim": 1 << 16}
_LOW_RANK_DEFAULTS = {"decay_low_rank_dim": 64, "a_low_rank_dim": 64, "v_low_rank_dim": 16,
                      "gate_low_rank_dim": 128}
_FIXED = (("hidden_act", "sqrelu"), ("norm_first", True), ("norm_bias", True), ("norm_eps", 1e-5),
          ("tie_word_embeddings", False))


def read_hf_config(directory: str | Path) -> ModelConfig:
    """Our ModelConfig of ``directory/config.json``; fla's defaults for absent low-rank widths,
    head size 64 and hidden ratio 4. CheckpointError (one line, naming the key) for a missing or
    unknown ``model_type``, settings our model does not implement, or a size out of bounds."""
    path = Path(directory) / "config.json"
    if confined_file(Path(directory), "config.json") is None:
        raise CheckpointError(f"{str(directory)!r} holds no model config (config.json is not a regular file in it)")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{str(path)!r}: cannot read the model config ({e})") from None
    if not isinstance(raw, dict) or raw.get("model_type") not in MODEL_TYPES:
        got = raw.get("model_type") if isinstance(raw, dict) else None
        raise CheckpointError(f"{str(path)!r}: model_type {_short(got)} is not an RWKV-7 model (expected one of "
                              f"{', '.join(MODEL_TYPES)})")
    for key, want in _FIXED:
        if raw.get(key, want) != want:
            raise CheckpointError(f"{str(path)!r}: {key}={_short(raw[key])} is not supported (only {want!r})")

    def size(key: str, value: object = None) -> int:
        return _bounded(path, key, raw.get(key) if value is None else value)

    for key in ("hidden_size", "num_hidden_layers", "vocab_size"):
        if key not in raw:
            raise CheckpointError(f"{str(path)!r}: malformed RWKV-7 config (no {key!r})")
    C = size("hidden_size")
    H = size("num_heads") if raw.get("num_heads") else None
    N = size("head_dim") if raw.get("head_dim") else (C // H if H else 64)
    H = H or C // N
    if H * N != C:
        raise CheckpointError(f"{str(path)!r}: config.json num_heads={H} times head_dim={N} is not "
                              f"hidden_size={C}")
    ratio = raw.get("hidden_ratio") or 4
    if not raw.get("intermediate_size") and not (isinstance(ratio, (int, float)) and 0 < ratio <= 64):
        raise CheckpointError(f"{str(path)!r}: config.json hidden_ratio={_short(ratio)} must be a number in (0, 64]")
    F = size("intermediate_size", raw.get("intermediate_size") or 32 * -(-int(C * ratio) // 32))
    ranks = {}
    for key, default in _LOW_RANK_DEFAULTS.items():
        ranks[key] = size(key, raw.get(key, default))
        if ranks[key] > C:
            raise CheckpointError(f"{str(path)!r}: config.json {key}={ranks[key]} exceeds hidden_size={C}")
    return ModelConfig(n_layer=size("num_hidden_layers"), n_embd=C, n_head=H, head_size=N,
                       vocab_size=size("vocab_size"), dim_ffn=F, d_decay=ranks["decay_low_rank_dim"],
                       d_aaa=ranks["a_low_rank_dim"], d_mv=ranks["v_low_rank_dim"],
                       d_gate=ranks["gate_low_rank_dim"])


def _bounded(path: Path, key: str, value: object) -> int:
    """``value`` as an int in [1, SIZE_BOUNDS[key]], else CheckpointError naming ``key``."""
    high = SIZE_BOUNDS[key]
    integral = (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and math.isfinite(value) and value.is_integer())
    number = cast(float, value) if integral else 0  # an int or an integral float, as just checked
    if not 1 <= number <= high:
        raise CheckpointError(f"{str(path)!r}: config.json {key}={_short(value)} must be an integer in [1, {high}]")
    return int(number)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def hf_config(config: ModelConfig, dtype: str) -> dict:
    """config.json of ``config`` as fla's ``RWKV7Config`` (and rwkv7-hf) write it."""
    c = config
    return {"architectures": ["RWKV7ForCausalLM"], "model_type": "rwkv7", "attn_mode": "chunk",
            "hidden_size": c.n_embd, "num_hidden_layers": c.n_layer, "head_dim": c.head_size,
            "num_heads": c.n_head, "intermediate_size": c.dim_ffn, "hidden_ratio": c.dim_ffn / c.n_embd,
            "decay_low_rank_dim": c.d_decay, "a_low_rank_dim": c.d_aaa, "v_low_rank_dim": c.d_mv,
            "gate_low_rank_dim": c.d_gate, "value_dim": [c.n_embd] * c.n_layer, "vocab_size": c.vocab_size,
            "hidden_act": "sqrelu", "norm_first": True, "norm_bias": True, "norm_eps": 1e-5,
            "fuse_norm": False, "tie_word_embeddings": False, "use_cache": True,
            "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0, "torch_dtype": dtype}
