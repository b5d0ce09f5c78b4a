"""Reading, validating and writing RWKV-7 checkpoints in the official layout.

Tensors travel as numpy arrays (bfloat16 as ``ml_dtypes.bfloat16``), so this
module serves the torch and the JAX model alike. ``.safetensors`` files are read
by a small memory-mapped parser and never need torch; ``.pth`` files import torch
lazily (``torch.load(weights_only=True, mmap=True)``) after ``code_global`` has
checked that their pickle loads no code.
"""
from __future__ import annotations

import json
import mmap
import os
import pickletools
import re
import struct
import zipfile
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
    tensors = read_tensors(path)
    return tensors, validate(tensors)


def read_tensors(path: str | os.PathLike, what: str = "checkpoint") -> Tensors:
    """The tensors of a ``.pth`` (code-carrying pickles refused) or ``.safetensors`` file,
    not validated as a model; ``what`` names the kind of file in error messages."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{what} {str(path)!r} does not exist or is not a file")
    if path.suffix == ".safetensors":
        return read_safetensors(path)[0]
    if path.suffix in (".pth", ".pt"):
        return _read_pth(path)
    raise CheckpointError(f"{what} {str(path)!r}: unknown extension {path.suffix!r} "
                          "(expected .pth or .safetensors)")


def _read_pth(path: Path) -> Tensors:
    import torch  # lazily: only .pth needs it

    code = code_global(path)
    if code is not None:
        raise CheckpointError(f"{str(path)!r} refused: its pickle would load the global {code!r} "
                              "(a checkpoint may hold tensors only)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # truncated zip, pickle garbage, wrong format ...
        first_line = (str(e).strip().splitlines() or [""])[0]
        raise CheckpointError(f"{str(path)!r} is not a readable torch checkpoint: "
                              f"{type(e).__name__}: {first_line}") from None
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


_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING",
               "BINSTRING", "STRING"}


def _allowed_global(module: str, name: str) -> bool:
    """Globals a tensor state dict needs: torch's rebuild helpers, storages and dtypes, and
    OrderedDict. (torch.load(weights_only=True) applies its own stricter list afterwards.)"""
    return module == "torch" or module.startswith("torch.") or (module, name) == ("collections", "OrderedDict")


def code_global(path: Path) -> str | None:
    """``module.name`` of the first global outside the tensor allow-list that the pickle in a
    zip-format ``.pth`` loads, or None (also None for files that are not zip checkpoints:
    torch.load reports those). Scans opcodes only; nothing is unpickled."""
    try:
        with zipfile.ZipFile(path) as z:
            member = next((n for n in z.namelist() if n.endswith("data.pkl")), None)
            if member is None:
                return None
            data = z.read(member)
    except (zipfile.BadZipFile, OSError):
        return None
    pushed: list = []  # recent stack pushes (strings, else None), enough for STACK_GLOBAL
    memo: dict = {}
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL":
                module, name = arg.split(" ", 1)
            elif op.name == "STACK_GLOBAL":
                module, name = (pushed[-2:] + [None, None])[:2] if len(pushed) >= 2 else (None, None)
                module, name = str(module), str(name)
            else:
                if op.name in _STRING_OPS:
                    pushed.append(arg if isinstance(arg, str) else arg.decode("latin-1"))
                elif op.name in ("BINPUT", "LONG_BINPUT", "PUT"):
                    memo[arg] = pushed[-1] if pushed else None
                elif op.name == "MEMOIZE":
                    memo[len(memo)] = pushed[-1] if pushed else None
                elif op.name in ("BINGET", "LONG_BINGET", "GET"):
                    pushed.append(memo.get(arg))
                elif op.stack_after:
                    pushed.append(None)
                continue
            if not _allowed_global(module, name):
                return f"{module}.{name}"
            pushed.append(None)
    except ValueError:  # a malformed pickle: torch.load reports it
        return None
    return None


_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
              "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32}
_ST_NAMES = {np.dtype(v): k for k, v in _ST_DTYPES.items()}


def read_safetensors(path: str | os.PathLike) -> tuple[Tensors, dict[str, str]]:
    """(tensors, the header's ``__metadata__`` {str: str}) of a ``.safetensors`` file; the
    tensors are read-only views of a memory map. CheckpointError names what is malformed
    (short file, bad header, a data range outside the file, unsupported dtype)."""
    path = Path(path)
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
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(f"{str(path)!r}: safetensors __metadata__ must map strings to strings")
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
    return out, metadata


# ----------------------------------------------------------------------------- writing
def write_checkpoint(path: str | os.PathLike, tensors: Tensors) -> None:
    """Write tensors as ``.pth`` (needs torch) or ``.safetensors`` (numpy only)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        write_safetensors(path, tensors)
    elif path.suffix in (".pth", ".pt"):
        import torch

        def to_torch(a: np.ndarray) -> "torch.Tensor":
            if a.dtype == ml_dtypes.bfloat16:
                return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
            return torch.from_numpy(np.ascontiguousarray(a))

        torch.save({k: to_torch(v) for k, v in tensors.items()}, path)
    else:
        raise ValueError(f"cannot write {str(path)!r}: use a .pth or .safetensors extension")


def write_safetensors(path: str | os.PathLike, tensors: Tensors,
                      metadata: dict[str, str] | None = None) -> None:
    """Write tensors (dtypes of ``_ST_DTYPES``) and optional string metadata as ``.safetensors``."""
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
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
