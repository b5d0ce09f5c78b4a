"""Tensor files, numpy only: ``.safetensors`` read and written by the ``safetensors`` library,
and ``LazyTensors``, the read-on-access mapping every checkpoint reader returns.

The library parses and bounds the header (a nested, cut or garbage header is one clear
error) and reads bfloat16 as ``ml_dtypes.bfloat16``; float8_e4m3fn tensors (quantized
checkpoints), which its numpy reader lacks, are read from the byte range its header gives.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import stat
import struct
import sys
from contextlib import contextmanager
from functools import partial
from typing import Callable, Iterator, Mapping, NamedTuple

import ml_dtypes
import numpy as np

Tensors = Mapping[str, np.ndarray]

SUPPORTED_DTYPES = {"float32": np.float32, "float16": np.float16,
                    "bfloat16": ml_dtypes.bfloat16, "float64": np.float64}
FLOATS = tuple(np.dtype(d) for d in SUPPORTED_DTYPES.values())


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: unreadable, or with a wrong key or shape."""


class Entry(NamedTuple):
    """One tensor of a file: its shape, dtype, and how to read it (a fresh array each call)."""
    shape: tuple[int, ...]
    dtype: np.dtype
    read: Callable[[], np.ndarray]


class LazyTensors(Mapping):
    """key -> np.ndarray, each read by its ``Entry`` on access and not kept; ``shape`` and
    ``dtype`` need no read. A float tensor holding NaN or inf raises CheckpointError naming
    the key and ``source``. ``metadata``: the file's string metadata (safetensors), else {}."""

    def __init__(self, entries: dict[str, Entry], source: str, metadata: Mapping[str, str] | None = None):
        self.entries, self.source, self.metadata = entries, source, dict(metadata or {})

    @classmethod
    def of(cls, arrays: Mapping[str, np.ndarray], source: str = "checkpoint") -> "LazyTensors":
        """Arrays already in memory (or memory-mapped) as LazyTensors."""
        if isinstance(arrays, LazyTensors):
            return arrays
        return cls({k: Entry(tuple(a.shape), a.dtype, partial(np.asarray, a)) for k, a in arrays.items()}, source)

    def shape(self, key: str) -> tuple[int, ...]:
        return self.entries[key].shape

    def dtype(self, key: str) -> np.dtype:
        return self.entries[key].dtype

    def __getitem__(self, key: str) -> np.ndarray:
        a = self.entries[key].read()
        if a.dtype in FLOATS and not np.isfinite(a).all():
            raise CheckpointError(f"{self.source!r}, key {key!r}: holds non-finite values (NaN or inf)")
        return a

    def __contains__(self, key: object) -> bool:  # without reading (Mapping's would read the tensor)
        return key in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


def mapped_entries(arrays: Mapping[str, np.ndarray]) -> dict[str, Entry]:
    """Entries over arrays that view a read-only private memory map of a file (torch's
    ``mmap=True`` storages): each read copies its tensor and hands the pages it touched back
    to the kernel, so a whole-file map never piles up in resident memory while a model is
    built from it (the pages are re-read from the file if the view is touched again)."""
    return {k: Entry(tuple(a.shape), a.dtype, partial(_copy_and_release, a)) for k, a in arrays.items()}


def _copy_and_release(view: np.ndarray) -> np.ndarray:
    out = np.array(view)
    release_pages(view)
    return out


_MADV_DONTNEED = 4


def release_pages(view: np.ndarray) -> None:
    """Drop the resident pages wholly inside ``view``'s bytes from this process (Linux
    ``madvise(MADV_DONTNEED)``; elsewhere nothing). Only for views of a clean private file
    map, whose dropped pages read back from the file unchanged."""
    if not sys.platform.startswith("linux") or view.nbytes == 0:
        return
    page = os.sysconf("SC_PAGE_SIZE")
    start = view.__array_interface__["data"][0]
    first, last = -(-start // page) * page, (start + view.nbytes) // page * page
    if last > first:
        ctypes.CDLL(None, use_errno=True).madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first),
                                                  _MADV_DONTNEED)


_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
              "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
              "BOOL": np.bool_, "F8_E4M3": ml_dtypes.float8_e4m3fn}
RAW_DTYPES = ("F8_E4M3",)  # read from the header's byte range (the library's numpy reader lacks them)


def safetensors_entries(path: str | os.PathLike) -> tuple[dict[str, Entry], dict[str, str]]:
    """(key -> Entry, the header's ``__metadata__``) of a ``.safetensors`` file, from its header
    only (the ``safetensors`` library bounds and checks it: a nested, cut or garbage header is a
    CheckpointError naming the file). Each entry's ``read`` reopens the file for that tensor."""
    with _opened(path) as f:
        entries = {}
        for key in f.keys():
            view = f.get_slice(key)
            dtype = _ST_DTYPES.get(view.get_dtype())
            if dtype is None:
                raise CheckpointError(f"{str(path)!r}, key {key!r}: unsupported safetensors dtype "
                                      f"{view.get_dtype()}")
            read = _read_raw if view.get_dtype() in RAW_DTYPES else _read_one
            entries[key] = Entry(tuple(view.get_shape()), np.dtype(dtype), partial(read, str(path), key))
        return entries, dict(f.metadata() or {})


def _read_one(path: str, key: str) -> np.ndarray:
    with _opened(path) as f:  # opened per tensor: pages of the map never pile up in memory
        return f.get_tensor(key)


def _read_raw(path: str, key: str) -> np.ndarray:
    """One tensor read from the byte range the (already validated) header gives for it."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        info = json.loads(f.read(size))[key]
        start, end = info["data_offsets"]
        f.seek(8 + size + start)
        data = f.read(end - start)
    return np.frombuffer(data, _ST_DTYPES[info["dtype"]]).reshape(info["shape"]).copy()


@contextmanager
def _opened(path: str | os.PathLike):
    from safetensors import SafetensorError, safe_open

    try:
        f = safe_open(str(path), framework="numpy")
    except SafetensorError as e:
        raise CheckpointError(f"{str(path)!r} is not a readable safetensors file: {e}") from None
    with f:
        yield f


def read_safetensors(path: str | os.PathLike) -> tuple[Tensors, dict[str, str]]:
    """(tensors, the header's ``__metadata__`` {str: str}) of a ``.safetensors`` file, read
    whole (writable copies); for small files (states, cache entries). CheckpointError in one
    line when it is malformed; OSError when it cannot be opened."""
    entries, metadata = safetensors_entries(path)
    return {key: entry.read() for key, entry in entries.items()}, metadata


def read_regular_safetensors(path: str | os.PathLike, max_bytes: int) -> tuple[Tensors, dict[str, str]]:
    """As ``read_safetensors``, for files in a directory others may write to (a shared cache):
    the file is opened without blocking and without following a symbolic link, and must be a
    regular file of at most ``max_bytes`` (else CheckpointError; a FIFO never blocks). It is read
    whole into memory and parsed there. FileNotFoundError when it is gone."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CheckpointError(f"{str(path)!r} is a symbolic link, not a regular file") from None
        raise
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{str(path)!r} is not a regular file")
        if st.st_size > max_bytes:
            raise CheckpointError(f"{str(path)!r} holds {st.st_size} bytes, over the {max_bytes} allowed")
        data = f.read(max_bytes + 1)
    from safetensors import SafetensorError, deserialize

    try:
        items = deserialize(data)
    except SafetensorError as e:
        raise CheckpointError(f"{str(path)!r} is not a readable safetensors file: {e}") from None
    tensors = {}
    for key, info in items:
        dtype = _ST_DTYPES.get(info["dtype"])
        if dtype is None:
            raise CheckpointError(f"{str(path)!r}, key {key!r}: unsupported safetensors dtype {info['dtype']}")
        tensors[key] = np.frombuffer(info["data"], dtype).reshape(info["shape"]).copy()
    (size,) = struct.unpack("<Q", data[:8])  # a header the library has just validated
    return tensors, dict(json.loads(data[8:8 + size]).get("__metadata__") or {})


def write_safetensors(path: str | os.PathLike, tensors: Mapping[str, np.ndarray],
                      metadata: dict[str, str] | None = None) -> None:
    """Write tensors (the dtypes of ``_ST_DTYPES``) and optional string metadata as ``.safetensors``
    through the ``safetensors`` library."""
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path), metadata=metadata)
