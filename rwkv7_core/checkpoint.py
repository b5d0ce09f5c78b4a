"""Reading, validating and writing RWKV-7 checkpoints in the official layout.

Tensors travel as numpy arrays (bfloat16 as ``ml_dtypes.bfloat16``), so this module serves the
torch and the JAX model alike. ``.safetensors`` files are read and written by the
``safetensors`` library and never need torch; ``.pth`` files import torch lazily
(``torch.load(weights_only=True, mmap=True)``) after ``code_global`` has checked that their
pickle loads no code; a directory is a Hugging Face model directory (``hf_checkpoint``).

Readers return ``LazyTensors``: every key's shape and dtype come from the headers, and a
tensor is read from its file when it is accessed and is not kept, so a model built from
them holds each weight once (a 7B checkpoint is never in host memory twice). A tensor with
NaN or infinite values is refused when it is read.
"""
from __future__ import annotations

import os
import pickletools
import re
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np

from .config import ModelConfig, expected_shapes
from .quantization import check_quantized, quantized_key, scale_key, stored_spec
from .tensor_files import (
    FLOATS,
    SUPPORTED_DTYPES,
    CheckpointError,
    LazyTensors,
    Tensors,
    mapped_entries,
    read_safetensors,
    safetensors_entries,
    write_safetensors,
)

__all__ = ["CheckpointError", "LazyTensors", "SUPPORTED_DTYPES", "Tensors", "code_global", "infer_config",
           "read_checkpoint", "read_safetensors", "read_tensors", "validate", "write_checkpoint",
           "write_safetensors"]


# ----------------------------------------------------------------------------- config
def infer_config(tensors: Tensors) -> ModelConfig:
    """Infer every size of the model from tensor shapes (nothing is hard-coded)."""
    lazy = LazyTensors.of(tensors)

    def shape(key: str, rank: int) -> tuple[int, ...]:
        if key not in lazy:
            raise CheckpointError(f"missing key {key!r}: cannot infer the model config")
        s = lazy.shape(key)
        if len(s) != rank:
            raise CheckpointError(f"key {key!r}: expected a rank-{rank} tensor, got shape {s}")
        return s

    vocab_size, n_embd = shape("emb.weight", 2)
    n_head, head_size = shape("blocks.0.att.r_k", 2)
    layers = {int(m.group(1)) for k in lazy if (m := re.match(r"blocks\.(\d+)\.", k))}
    return ModelConfig(
        n_layer=max(layers) + 1, n_embd=n_embd, n_head=n_head, head_size=head_size,
        vocab_size=vocab_size, dim_ffn=shape("blocks.0.ffn.key.weight", 2)[0],
        d_decay=shape("blocks.0.att.w1", 2)[1], d_aaa=shape("blocks.0.att.a1", 2)[1],
        d_mv=shape("blocks.0.att.v1", 2)[1], d_gate=shape("blocks.0.att.g1", 2)[1])


def validate(tensors: Tensors) -> ModelConfig:
    """Check keys, shapes and dtypes against the inferred config (from shapes; no tensor
    is read); return that config. A quantized checkpoint (its metadata names the scheme,
    ``rwkv7_core.quantization``) holds its projections as q plus scales.

    Raises CheckpointError naming the first missing/unexpected key or the key whose
    shape disagrees (with expected and actual shapes).
    """
    lazy = LazyTensors.of(tensors)
    spec = stored_spec(lazy.metadata, lazy.source)
    config = infer_config(lazy)
    if config.n_head * config.head_size != config.n_embd:
        raise CheckpointError(
            f"key 'blocks.0.att.r_k' has shape {(config.n_head, config.head_size)}: "
            f"n_head*head_size must equal n_embd={config.n_embd}")
    want = expected_shapes(config)
    missing = [k for k in want if k not in lazy]
    if missing:
        raise CheckpointError(f"missing key {missing[0]!r} (expected shape {want[missing[0]]})"
                              + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
    scales = {scale_key(k) for k in want if spec and quantized_key(k)}
    unexpected = sorted(k for k in lazy if k not in want and k not in scales)
    if unexpected:
        raise CheckpointError(f"unexpected key {unexpected[0]!r} with shape {lazy.shape(unexpected[0])}")
    for key, shape in want.items():
        if spec and quantized_key(key):  # checks the stored (int4: packed) shape too
            check_quantized(lazy, spec, key, (shape[0], shape[1]), lazy.source)  # a projection: 2-D
        elif lazy.shape(key) != shape:
            raise CheckpointError(f"key {key!r}: expected shape {shape}, got {lazy.shape(key)}")
        elif lazy.dtype(key) not in FLOATS:
            raise CheckpointError(f"key {key!r}: unsupported dtype {lazy.dtype(key)} "
                                  f"(expected one of {', '.join(SUPPORTED_DTYPES)})")
    return config


# ----------------------------------------------------------------------------- reading
def read_checkpoint(path: str | os.PathLike) -> tuple[LazyTensors, ModelConfig]:
    """Load and validate a ``.pth`` or ``.safetensors`` checkpoint, or a Hugging Face model
    directory. Returns (tensors, config); tensors keep the file's dtype and are read on access.
    """
    if Path(path).is_dir():
        from .hf_checkpoint import read_hf_dir  # the name mapping lives there

        tensors = read_hf_dir(path)
    else:
        tensors = read_tensors(path)
    return tensors, validate(tensors)


def read_tensors(path: str | os.PathLike, what: str = "checkpoint") -> LazyTensors:
    """The tensors of a ``.pth`` (code-carrying pickles refused) or ``.safetensors`` file,
    not validated as a model; ``what`` names the kind of file in error messages."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{what} {str(path)!r} does not exist or is not a file")
    if path.suffix == ".safetensors":
        entries, metadata = safetensors_entries(path)
        return LazyTensors(entries, str(path), metadata)
    if path.suffix in (".pth", ".pt"):
        return LazyTensors(mapped_entries(_read_pth(path)), str(path))
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


# ----------------------------------------------------------------------------- writing
def write_checkpoint(path: str | os.PathLike, tensors: Tensors, metadata: dict[str, str] | None = None) -> None:
    """Write tensors as ``.pth`` (needs torch) or ``.safetensors`` (numpy only; with the string
    ``metadata``, e.g. a quantized checkpoint's scheme, which a ``.pth`` cannot carry)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        write_safetensors(path, tensors, metadata)
    elif path.suffix in (".pth", ".pt"):
        if metadata:
            raise ValueError(f"cannot write {str(path)!r}: a .pth file cannot carry metadata (use .safetensors)")
        import torch

        def to_torch(a: np.ndarray) -> "torch.Tensor":
            if a.dtype == ml_dtypes.bfloat16:
                return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
            return torch.from_numpy(np.ascontiguousarray(a))

        torch.save({k: to_torch(v) for k, v in tensors.items()}, path)
    else:
        raise ValueError(f"cannot write {str(path)!r}: use a .pth or .safetensors extension")
