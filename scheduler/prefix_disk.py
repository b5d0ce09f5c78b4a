"""The prefix cache's persistent tier: one ``.safetensors`` file per entry in a directory
shared by runs (numpy and rwkv7_core only).

An entry is the engine host row after some tokens, run from the zero state or from a named
initial state (the namespace). Its file name is
``<model 16 hex>-<namespace 12 hex>-<length>-<sha256 of fingerprint, namespace, tokens>.safetensors``;
the file holds the row's arrays (``row.{i}``), the tokens (int32) and metadata (format,
the full model fingerprint, the namespace, the row's length and which leaves are None).
A load checks all of it, so a file of another model, another state or other tokens is never
used; a file that fails to load for any reason (truncated, garbage, a hostile header, larger
than the budget, not a regular file: a FIFO or a link, opened without blocking) is skipped
with a warning and removed, and so is an entry whose use gave non-finite values
(``remove``, called by the prefix cache).

Concurrent runs on one directory are safe: files are written to a temporary name and
renamed into place (never edited), readers copy what they read, and a file removed under a
reader is a miss. The directory is bounded by ``max_bytes`` (entry files only): after each
write the least recently used files (by modification time, refreshed on every hit) go.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from rwkv7_core.engine import HostRow, host_row_bytes
from rwkv7_core.state_files import write_atomic
from rwkv7_core.tensor_files import read_regular_safetensors

log = logging.getLogger(__name__)

FORMAT = "rwkv7-prefix-cache/1"
_ENTRY = re.compile(r"([0-9a-f]{16})-([0-9a-f]{12})-(\d+)-([0-9a-f]{32})\.safetensors")
_STALE_TMP_SECONDS = 3600  # temporary files older than this are left-overs of killed runs


def _hex(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for p in parts:
        digest.update(len(p).to_bytes(8, "little") + p)
    return digest.hexdigest()


class DiskPrefixStore:
    """Entries of one model (``fingerprint``: any string naming the weights, dtype, kernels
    and device that made the rows) in ``directory``, at most ``max_bytes`` of entry files."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int, fingerprint: str):
        if not fingerprint:
            raise ValueError("DiskPrefixStore needs a non-empty model fingerprint")
        if max_bytes < 1:
            raise ValueError(f"DiskPrefixStore.max_bytes={max_bytes!r}: must be >= 1")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes, self.fingerprint = max_bytes, fingerprint
        self._model = _hex(fingerprint.encode())[:16]

    def path(self, tokens: Sequence[int], namespace: str = "") -> Path:
        """Where the entry of (namespace, tokens) lives."""
        body = _hex(self.fingerprint.encode(), namespace.encode(), np.asarray(tokens, np.int32).tobytes())
        return self.directory / f"{self._model}-{_hex(namespace.encode())[:12]}-{len(tokens)}-{body[:32]}.safetensors"

    def lengths(self, namespace: str = "") -> set[int]:
        """Token lengths of this model's entries in ``namespace`` on disk now."""
        head = (self._model, _hex(namespace.encode())[:12])
        out = set()
        for name in os.listdir(self.directory):
            m = _ENTRY.fullmatch(name)
            if m and m.group(1, 2) == head:
                out.add(int(m.group(3)))
        return out

    def longest_prefix(self, tokens: Sequence[int], namespace: str = "",
                       longer_than: int = 0) -> tuple[int, HostRow | None, int]:
        """(length, host row) of the longest stored prefix of tokens longer than
        ``longer_than`` ((0, None) when there is none), and how many unreadable entry files
        the lookup removed."""
        key, removed = tuple(tokens), 0
        for n in sorted((n for n in self.lengths(namespace) if longer_than < n <= len(key)), reverse=True):
            row, unreadable = self._load(self.path(key[:n], namespace), key[:n], namespace)
            if row is not None:
                return n, row, removed
            removed += unreadable
        return 0, None, removed

    def remove(self, tokens: Sequence[int], namespace: str = "") -> bool:
        """Delete the entry of (namespace, tokens); whether there was one."""
        path = self.path(tokens, namespace)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        log.warning("prefix cache: removed %s: its state gave non-finite values", path)
        return True

    def _load(self, path: Path, tokens: tuple[int, ...], namespace: str) -> tuple[HostRow | None, bool]:
        """(the entry's row or None, whether the file was unreadable and removed)."""
        try:
            tensors, meta = read_regular_safetensors(path, self.max_bytes)
            leaves, nones = int(meta["leaves"]), json.loads(meta["none"])
            if meta.get("format") != FORMAT:
                raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT!r}")
            stored = np.asarray(tensors["tokens"])
            row = tuple(None if i in nones else np.array(tensors[f"row.{i}"]) for i in range(leaves))
        except FileNotFoundError:  # removed by another run since the listing
            return None, False
        except Exception as e:  # any failure to parse a cache file (e.g. RecursionError) makes it unusable
            log.warning("prefix cache: skipped and removed %s: unreadable (%s: %s)", path, type(e).__name__, e)
            try:
                path.unlink(missing_ok=True)
            except OSError:  # e.g. a directory with an entry's name: skipped on every lookup
                return None, False
            return None, True
        if meta.get("fingerprint") != self.fingerprint or meta.get("namespace") != namespace:
            log.warning("prefix cache: skipped %s: made by another model or from another state", path)
            return None, False
        if stored.shape != (len(tokens),) or stored.tolist() != list(tokens):
            log.warning("prefix cache: skipped %s: its tokens are not the ones it is named for", path)
            return None, False
        try:
            os.utime(path)  # most recently used
        except OSError:
            pass
        return row, False

    def put(self, tokens: Sequence[int], row: HostRow, namespace: str = "") -> None:
        """Store an entry (a no-op when it is there, or larger than the whole budget). Write
        errors (a full disk, no permission) are warned about, never raised."""
        key = tuple(tokens)
        if not key or host_row_bytes(row) > self.max_bytes:
            return
        path = self.path(key, namespace)
        if path.exists():
            return
        tensors = {f"row.{i}": np.ascontiguousarray(a) for i, a in enumerate(row) if a is not None}
        tensors["tokens"] = np.asarray(key, np.int32)
        meta = {"format": FORMAT, "fingerprint": self.fingerprint, "namespace": namespace,
                "leaves": str(len(row)), "none": json.dumps([i for i, a in enumerate(row) if a is None])}
        try:
            write_atomic(path, tensors, meta, durable=False)  # a cache: a file cut by a power loss is skipped
        except (OSError, KeyError) as e:
            log.warning("prefix cache: could not write %s: %s", path, e)
            return
        self._evict()

    def _evict(self) -> None:
        """Remove least recently used entry files until they fit in max_bytes, and stale
        temporary files of killed runs."""
        entries, now = [], time.time()
        with os.scandir(self.directory) as it:
            for e in it:
                try:
                    st = e.stat()
                except FileNotFoundError:
                    continue
                if _ENTRY.fullmatch(e.name):
                    entries.append((st.st_mtime, st.st_size, e.path))
                elif e.name.startswith(".") and e.name.endswith(".tmp") and now - st.st_mtime > _STALE_TMP_SECONDS:
                    Path(e.path).unlink(missing_ok=True)
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            Path(path).unlink(missing_ok=True)
            total -= size
