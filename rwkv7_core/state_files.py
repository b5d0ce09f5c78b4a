"""Sequence states as files (numpy only): our state format, and tuned-state files.

**State file** (``save_state`` / ``load_state``): a ``.safetensors`` file holding one
sequence's whole recurrent state, in the layout of ``rwkv7_core.state`` without the batch
axis:

- ``att_shift`` [L, C] and ``ffn_shift`` [L, C]: the model's activation dtype (float32,
  bfloat16 or float16), the previous token's LN1 / LN2 outputs per layer;
- ``wkv`` [L, H, N, N] in the model's state dtype (float32, bfloat16 or float16:
  ``rwkv7_core.state``), rows = value dim, cols = key dim;
- metadata: ``format`` = ``rwkv7-state/1``, ``model_shape`` (the model's ``ModelConfig`` as
  JSON: a state loads only into a model of the same shape), ``dtype`` (of the shifts),
  ``state_dtype`` (of ``wkv``; files without it are float32, the only state dtype there was)
  and ``tokens`` (how many tokens the state has consumed since the zero state).

A state file loads only into a model holding its state in the file's state dtype
(``StateFileDtypeError`` names the file and both dtypes otherwise): a state is never
rounded to 16 bits, or widened from them, without being asked. ``convert_state`` is the
explicit conversion. Tuned-state files carry no state dtype of
ours: they are converted to the model's state dtype on load.

**Tuned-state file** (as published by RWKV state-tuning): ``.pth`` or ``.safetensors`` with
one key ``blocks.{i}.att.time_state`` [H, N, N] per layer and nothing else; the same
orientation as our ``wkv`` (rows = value dim), loaded without a transpose; the shifts start
at zero. ``.pth`` files go through the checkpoint module's refusal of code-carrying pickles.

``load_state`` reads either kind. The model engines' host rows (``Engine.to_host``) are
``(att_shift [1, L, C], wkv [1, L, H, N, N], ffn_shift [1, L, C], logits [V] | None)``;
``to_host_row`` / ``from_host_row`` convert.
"""
from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path
from typing import NamedTuple

import ml_dtypes
import numpy as np

from .checkpoint import SUPPORTED_DTYPES, CheckpointError, Tensors, read_safetensors, read_tensors, write_safetensors
from .config import ModelConfig
from .state import DEFAULT_STATE_DTYPE, STATE_DTYPES, STATE_LEAVES, StateDtypeError, check_wkv_dtype, state_shapes

FORMAT = "rwkv7-state/1"
SHIFT_DTYPES = ("float32", "bfloat16", "float16")
_TUNED_KEY = re.compile(r"blocks\.(\d+)\.att\.time_state")


class StateFileError(CheckpointError):
    """A state file that cannot be used: unreadable, another model's, or malformed."""


class StateFileDtypeError(StateFileError, StateDtypeError):
    """A state file whose wkv state is in another state dtype than the model's."""


class SequenceState(NamedTuple):
    """One sequence's state: att_shift [L, C], wkv [L, H, N, N] in a state dtype (rows = value
    dim), ffn_shift [L, C] (both shifts of one float dtype), and the tokens it has consumed."""
    att_shift: np.ndarray
    wkv: np.ndarray
    ffn_shift: np.ndarray
    tokens: int = 0


def describe_shape(config: ModelConfig) -> str:
    """A one-line name of a model shape, e.g. ``L2 C128 H2xN64 V512 F512 (Dw32 Da32 Dv16 Dg32)``."""
    c = config
    return (f"L{c.n_layer} C{c.n_embd} H{c.n_head}xN{c.head_size} V{c.vocab_size} F{c.dim_ffn} "
            f"(Dw{c.d_decay} Da{c.d_aaa} Dv{c.d_mv} Dg{c.d_gate})")


def zero_state(config: ModelConfig, dtype: str = "float32", state_dtype: str = DEFAULT_STATE_DTYPE) -> SequenceState:
    """The state of a fresh sequence (shifts in ``dtype``, wkv in ``state_dtype``)."""
    shapes = state_shapes(config, 1)
    shift = np.zeros(shapes["att_shift"][1:], SUPPORTED_DTYPES[dtype])
    return SequenceState(shift, np.zeros(shapes["wkv"][1:], SUPPORTED_DTYPES[state_dtype]), shift.copy(), 0)


def check_state(state: SequenceState, config: ModelConfig, source: str = "state") -> SequenceState:
    """Validate leaf shapes, dtypes and finiteness against ``config``; StateFileError names
    the leaf (and ``source``) on a mismatch."""
    shapes = state_shapes(config, 1)
    for name in STATE_LEAVES:
        leaf = getattr(state, name)
        if tuple(leaf.shape) != shapes[name][1:]:
            raise StateFileError(f"{source}: {name} has shape {tuple(leaf.shape)}, expected "
                                 f"{shapes[name][1:]} for model shape {describe_shape(config)}")
    if _dtype_name(state.wkv.dtype) is None:
        raise StateFileError(f"{source}: wkv has dtype {state.wkv.dtype}, expected one of {STATE_DTYPES}")
    if state.att_shift.dtype != state.ffn_shift.dtype or _dtype_name(state.att_shift.dtype) is None:
        raise StateFileError(f"{source}: att_shift / ffn_shift have dtypes {state.att_shift.dtype} / "
                             f"{state.ffn_shift.dtype}; expected one of {SHIFT_DTYPES} for both")
    for name in STATE_LEAVES:
        if not np.isfinite(np.asarray(getattr(state, name), np.float32)).all():
            raise StateFileError(f"{source}: {name} holds non-finite values")
    if not isinstance(state.tokens, int) or state.tokens < 0:
        raise StateFileError(f"{source}: tokens must be an integer >= 0, got {state.tokens!r}")
    return state


def _dtype_name(dtype) -> str | None:
    return next((n for n in SHIFT_DTYPES if np.dtype(SUPPORTED_DTYPES[n]) == dtype), None)


# ----------------------------------------------------------------------------- writing
def write_atomic(path: str | os.PathLike, tensors: Tensors, metadata: dict[str, str] | None = None,
                 durable: bool = True) -> None:
    """Write a ``.safetensors`` file so that readers see the old file or the whole new one:
    a temporary file in the same directory (fsynced when ``durable``), renamed over ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write_safetensors(tmp, tensors, metadata)
        if durable:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save_state(path: str | os.PathLike, state: SequenceState, config: ModelConfig) -> None:
    """Write ``state`` (validated against ``config``) as a state file, atomically."""
    check_state(state, config, str(path))
    metadata = {"format": FORMAT, "model_shape": json.dumps(config._asdict()),
                "dtype": _dtype_name(state.att_shift.dtype), "state_dtype": _dtype_name(state.wkv.dtype),
                "tokens": str(state.tokens)}
    write_atomic(path, {name: np.ascontiguousarray(getattr(state, name)) for name in STATE_LEAVES}, metadata)


# ----------------------------------------------------------------------------- reading
def load_state(path: str | os.PathLike, config: ModelConfig, state_dtype: str = DEFAULT_STATE_DTYPE) -> SequenceState:
    """Read a state file or a tuned-state file for a model of shape ``config`` holding its state
    in ``state_dtype``.

    StateFileError (one line, naming the file) when the file is unreadable, truncated,
    carries code, is neither kind, or was made for another model shape (both shapes named);
    StateFileDtypeError when a state file's state dtype is not ``state_dtype`` (a tuned-state
    file is converted to it). Arrays are copies (writable, independent of the file)."""
    source = str(path)
    if source.endswith(".safetensors"):
        if not Path(path).is_file():
            raise StateFileError(f"state file {source!r} does not exist or is not a file")
        tensors, metadata = _reading(source, read_safetensors, path)
    else:
        tensors, metadata = _reading(source, read_tensors, path, "state file"), {}
    if metadata.get("format") == FORMAT:
        state = _our_state(tensors, metadata, config, source)
        try:
            check_wkv_dtype(state.wkv.dtype, state_dtype, f"state file {source!r}")
        except StateDtypeError as e:
            raise StateFileDtypeError(f"{e}, or convert the file: rwkv7_core.state_files.convert_state") from None
        return state
    if tensors and all(_TUNED_KEY.fullmatch(k) for k in tensors):
        return _tuned_state(tensors, config, source, state_dtype)
    keys = sorted(tensors)[:4]
    raise StateFileError(f"{source!r} is neither a state file (format {FORMAT!r} metadata with keys "
                         f"{', '.join(STATE_LEAVES)}) nor a tuned-state file (keys blocks.{{i}}.att.time_state); "
                         f"its keys: {keys}{' ...' if len(tensors) > 4 else ''}")


def _reading(source: str, read, *args):
    try:
        return read(*args)
    except CheckpointError as e:
        raise StateFileError(str(e)) from None
    except OSError as e:
        raise StateFileError(f"state file {source!r}: cannot read it ({e.strerror})") from None


def _our_state(tensors: Tensors, metadata: dict, config: ModelConfig, source: str) -> SequenceState:
    try:
        theirs = ModelConfig(**json.loads(metadata["model_shape"]))
        tokens = int(metadata["tokens"])
    except (KeyError, TypeError, ValueError) as e:
        raise StateFileError(f"{source!r}: malformed state metadata ({type(e).__name__}: {e})") from None
    if theirs != config:
        raise StateFileError(f"{source!r} was made for model shape {describe_shape(theirs)}, but this "
                             f"model's shape is {describe_shape(config)}")
    if sorted(tensors) != sorted(STATE_LEAVES):
        raise StateFileError(f"{source!r}: expected the keys {list(STATE_LEAVES)}, got {sorted(tensors)}")
    att_shift, wkv, ffn_shift = (np.array(tensors[name]) for name in STATE_LEAVES)
    state = SequenceState(att_shift, wkv, ffn_shift, tokens)
    check_state(state, config, repr(source))
    recorded = metadata.get("state_dtype", DEFAULT_STATE_DTYPE)
    if recorded != _dtype_name(state.wkv.dtype):
        raise StateFileError(f"{source!r}: metadata says state_dtype {recorded} but its wkv is {state.wkv.dtype}")
    return state


def _tuned_state(tensors: Tensors, config: ModelConfig, source: str, state_dtype: str) -> SequenceState:
    c = config
    want = (c.n_head, c.head_size, c.head_size)
    layers = sorted(int(_TUNED_KEY.fullmatch(k).group(1)) for k in tensors)
    if layers != list(range(c.n_layer)):
        extra = [i for i in layers if i >= c.n_layer]
        what = (f"unexpected key 'blocks.{extra[0]}.att.time_state'" if extra else
                f"missing key 'blocks.{min(set(range(c.n_layer)) - set(layers))}.att.time_state'")
        raise StateFileError(f"{source!r}: tuned state for {len(layers)} layers ({what}), but this model "
                             f"has {c.n_layer} layers of time_state {want} (shape {describe_shape(c)})")
    wkv = np.empty((c.n_layer,) + want, np.float32)
    for i in range(c.n_layer):
        key = f"blocks.{i}.att.time_state"
        t = tensors[key]
        if tuple(t.shape) != want:
            raise StateFileError(f"{source!r}, key {key!r}: expected shape {want} (H, N, N) for model shape "
                                 f"{describe_shape(c)}, got {tuple(t.shape)}")
        if t.dtype not in [np.dtype(d) for d in SUPPORTED_DTYPES.values()]:
            raise StateFileError(f"{source!r}, key {key!r}: unsupported dtype {t.dtype}")
        wkv[i] = t  # rows = value dim, as ours: no transpose
    zero = zero_state(c, state_dtype=state_dtype)
    return check_state(zero._replace(wkv=wkv.astype(zero.wkv.dtype)), c, repr(source))


# ----------------------------------------------------------------------------- host rows
def to_host_row(state: SequenceState) -> tuple:
    """The model engines' host row of a state (B = 1, no logits). bfloat16 shifts widen to
    float32 (numpy-portable, exact); ``Engine.from_host`` casts them to the model's dtype. The
    wkv keeps its state dtype (``Engine.from_host`` refuses another than the model's)."""
    def shift(a):
        return (a.astype(np.float32) if a.dtype == ml_dtypes.bfloat16 else a)[None]
    return shift(state.att_shift), state.wkv[None], shift(state.ffn_shift), None


def from_host_row(host_row: tuple, tokens: int, dtype: str) -> SequenceState:
    """A model engine's host row (B = 1) as a state whose shifts have ``dtype`` (exact for
    the model's own dtype); the wkv keeps the row's state dtype."""
    att, wkv, ffn = (np.asarray(a)[0] for a in host_row[:3])
    shift = SUPPORTED_DTYPES[dtype]
    return SequenceState(att.astype(shift), wkv.copy(), ffn.astype(shift), int(tokens))


def convert_state(state: SequenceState, state_dtype: str) -> SequenceState:
    """``state`` with its wkv rounded (or widened) to ``state_dtype``: the explicit conversion
    between state dtypes that ``load_state`` never does on its own."""
    return state._replace(wkv=state.wkv.astype(SUPPORTED_DTYPES[state_dtype]))
