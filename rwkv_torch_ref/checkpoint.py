"""Reading, validating and writing RWKV-7 checkpoints in the official layout.

Tensors travel as numpy arrays (bfloat16 as ``ml_dtypes.bfloat16``), so this
module serves the torch and the JAX model alike. ``.safetensors`` files are read
by a small memory-mapped parser and never need torch; ``.pth`` files import torch
lazily (``torch.load(weights_only=True, mmap=True)``).
"""
from __future__ import annotations

import json
import mmap
import os
import re
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

from .config import ModelConfig, expected_shapes

Tensors = dict[str, np.ndarray]

SUPPORTED_DTYPES = {"float32": np.float32, "float16": np.float16,
                    "bfloat16": ml_dtypes.bfloat16, "float64": np.float64}


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: unreadable, or with a wrong key or shape."""


# ----------------------------------------------------------------------------- config
def infer_config(tensors: Tensors) -> ModelConfig:
    """Infer every size of the model from tensor shapes (nothing is hard-coded)."""

    def shape(key: str, rank: int) -> tuple[int, ...]:
        if key not in tensors:
            raise CheckpointError(f"missing key {key!r}: cannot infer the model config")
        s = tuple(tensors[key].shape)
        if len(s) != rank:
            raise CheckpointError(f"key {key!r}: expected a rank-{rank} tensor, got shape {s}")
        return s

    vocab_size, n_embd = shape("emb.weight", 2)
    n_head, head_size = shape("blocks.0.att.r_k", 2)
    layers = {int(m.group(1)) for k in tensors if (m := re.match(r"blocks\.(\d+)\.", k))}
    return ModelConfig(
        n_layer=max(layers) + 1, n_embd=n_embd, n_head=n_head, head_size=head_size,
        vocab_size=vocab_size, dim_ffn=shape("blocks.0.ffn.key.weight", 2)[0],
        d_decay=shape("blocks.0.att.w1", 2)[1], d_aaa=shape("blocks.0.att.a1", 2)[1],
        d_mv=shape("blocks.0.att.v1", 2)[1], d_gate=shape("blocks.0.att.g1", 2)[1])


def validate(tensors: Tensors) -> ModelConfig:
    """Check keys and shapes against the inferred config; return that config.

    Raises CheckpointError naming the first missing/unexpected key or the key whose
    shape disagrees (with expected and actual shapes).
    """
    config = infer_config(tensors)
    if config.n_head * config.head_size != config.n_embd:
        raise CheckpointError(
            f"key 'blocks.0.att.r_k' has shape {(config.n_head, config.head_size)}: "
            f"n_head*head_size must equal n_embd={config.n_embd}")
    want = expected_shapes(config)
    missing = [k for k in want if k not in tensors]
    if missing:
        raise CheckpointError(f"missing key {missing[0]!r} (expected shape {want[missing[0]]})"
                              + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
    unexpected = sorted(k for k in tensors if k not in want)
    if unexpected:
        raise CheckpointError(f"unexpected key {unexpected[0]!r} with shape "
                              f"{tuple(tensors[unexpected[0]].shape)}")
    for key, shape in want.items():
        actual = tuple(tensors[key].shape)
        if actual != shape:
            raise CheckpointError(f"key {key!r}: expected shape {shape}, got {actual}")
        if tensors[key].dtype not in [np.dtype(d) for d in SUPPORTED_DTYPES.values()]:
            raise CheckpointError(f"key {key!r}: unsupported dtype {tensors[key].dtype}")
    return config


# ----------------------------------------------------------------------------- reading
def read_checkpoint(path: str | os.PathLike) -> tuple[Tensors, ModelConfig]:
    """Load and validate a ``.pth`` or ``.safetensors`` checkpoint.

    Returns (tensors, config); tensors keep the file's dtype (memory-mapped where
    the format allows).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist or is not a file")
    if path.suffix == ".safetensors":
        tensors = _read_safetensors(path)
    elif path.suffix in (".pth", ".pt"):
        tensors = _read_pth(path)
    else:
        raise CheckpointError(f"checkpoint {str(path)!r}: unknown extension {path.suffix!r} "
                              "(expected .pth or .safetensors)")
    return tensors, validate(tensors)


def _read_pth(path: Path) -> Tensors:
    import torch  # lazily: only .pth needs it

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # truncated zip, pickle garbage, wrong format ...
        raise CheckpointError(f"{str(path)!r} is not a readable torch checkpoint: "
                              f"{type(e).__name__}: {e}") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{str(path)!r} does not hold a flat state dict of tensors")
    out = {}
    for key, t in state.items():
        t = t.detach()
        if t.dtype == torch.bfloat16:
            out[key] = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        else:
            out[key] = t.numpy()
    return out


_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
              "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32}
_ST_NAMES = {np.dtype(v): k for k, v in _ST_DTYPES.items()}


def _read_safetensors(path: Path) -> Tensors:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{str(path)!r} is too short to be a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise CheckpointError(f"{str(path)!r}: safetensors header length {n} exceeds the file")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise CheckpointError(f"{str(path)!r}: safetensors header is not JSON ({e})") from None
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    if not isinstance(header, dict):
        raise CheckpointError(f"{str(path)!r}: safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    out = {}
    for key, info in header.items():
        try:
            dtype = _ST_DTYPES.get(info["dtype"])
            start, end = (int(x) for x in info["data_offsets"])
            shape = tuple(int(x) for x in info["shape"])
        except (TypeError, KeyError, ValueError):
            raise CheckpointError(f"{str(path)!r}: malformed safetensors entry for key {key!r}: "
                                  f"{info!r}") from None
        if dtype is None:
            raise CheckpointError(f"{str(path)!r}, key {key!r}: unsupported safetensors dtype "
                                  f"{info['dtype']}")
        if 8 + n + end > size or end - start != np.dtype(dtype).itemsize * int(np.prod(shape)):
            raise CheckpointError(f"{str(path)!r}, key {key!r}: data range {start}..{end} does not "
                                  f"fit the file (truncated?) or shape {shape}")
        out[key] = np.frombuffer(buf, dtype=dtype, count=int(np.prod(shape)),
                                 offset=8 + n + start).reshape(shape)
    return out


# ----------------------------------------------------------------------------- writing
def write_checkpoint(path: str | os.PathLike, tensors: Tensors) -> None:
    """Write tensors as ``.pth`` (needs torch) or ``.safetensors`` (numpy only)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        _write_safetensors(path, tensors)
    elif path.suffix in (".pth", ".pt"):
        import torch

        def to_torch(a: np.ndarray) -> "torch.Tensor":
            if a.dtype == ml_dtypes.bfloat16:
                return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
            return torch.from_numpy(np.ascontiguousarray(a))

        torch.save({k: to_torch(v) for k, v in tensors.items()}, path)
    else:
        raise ValueError(f"cannot write {str(path)!r}: use a .pth or .safetensors extension")


def _write_safetensors(path: Path, tensors: Tensors) -> None:
    header, offset = {}, 0
    for key, a in tensors.items():
        nbytes = a.size * a.dtype.itemsize
        header[key] = {"dtype": _ST_NAMES[a.dtype], "shape": list(a.shape),
                       "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for a in tensors.values():
            f.write(np.ascontiguousarray(a).tobytes())


# ----------------------------------------------------------------------------- random
def random_tensors(config: ModelConfig, seed: int = 0, dtype: str = "float32") -> Tensors:
    """A seeded random model in the official layout with well-scaled activations.

    Projections are N(0, 1/fan_in) so hidden states stay O(1); the residual writes
    (att.output, ffn.value) are shrunk by 1/sqrt(2L); decays spread over the whole
    allowed range; the head gives logits with a standard deviation of about 2.
    """
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype {dtype!r} not in {sorted(SUPPORTED_DTYPES)}")
    rng = np.random.default_rng(seed)
    c = config
    resid = 1.0 / np.sqrt(2 * c.n_layer)

    def normal(shape, std):
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    def uniform(shape, lo, hi):
        return rng.uniform(lo, hi, size=shape).astype(np.float32)

    out: Tensors = {}
    for key, shape in expected_shapes(c).items():
        suffix = key.split(".", 2)[-1] if key.startswith("blocks.") else key
        fan_in = shape[-1]
        if suffix.endswith(("ln0.weight", "ln1.weight", "ln2.weight", "ln_x.weight")) or key == "ln_out.weight":
            t = 1.0 + normal(shape, 0.1)
        elif suffix.endswith(".bias") or key == "ln_out.bias":
            t = normal(shape, 0.05)
        elif suffix.startswith(("att.x_", "ffn.x_")):
            t = uniform(shape, 0.0, 1.0)
        elif suffix == "att.w0":
            t = uniform(shape, -4.0, 2.0)
        elif suffix in ("att.a0", "att.v0"):
            t = normal(shape, 0.5)
        elif suffix in ("att.w1", "att.a1", "att.v1", "att.g1"):
            t = normal(shape, 1.0 / np.sqrt(shape[0]))
        elif suffix in ("att.w2", "att.a2", "att.v2"):
            t = normal(shape, 0.5 / np.sqrt(shape[0]))
        elif suffix == "att.g2":
            t = normal(shape, 1.0 / np.sqrt(shape[0]))
        elif suffix == "att.k_k":
            t = uniform(shape, 0.5, 1.0)
        elif suffix == "att.k_a":
            t = uniform(shape, 0.5, 1.5)
        elif suffix == "att.r_k":
            t = normal(shape, 0.3)
        elif suffix in ("att.output.weight", "ffn.value.weight"):
            t = normal(shape, resid / np.sqrt(fan_in))
        elif key == "emb.weight":
            t = normal(shape, 1.0)
        elif key == "head.weight":
            t = normal(shape, 2.0 / np.sqrt(fan_in))
        else:  # receptance/key/value and ffn.key projections
            t = normal(shape, 1.0 / np.sqrt(fan_in))
        out[key] = t.astype(SUPPORTED_DTYPES[dtype])
    return out


def write_random_checkpoint(path: str | os.PathLike, config: ModelConfig, seed: int = 0,
                            dtype: str = "float32") -> ModelConfig:
    """Write a seeded random checkpoint (see ``random_tensors``); returns its config."""
    write_checkpoint(path, random_tensors(config, seed, dtype))
    return config
