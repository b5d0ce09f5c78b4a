"""Files named inside a model directory, confined to it.

A model directory comes from elsewhere (a download), and the names in it (an index's shard
names, a symlinked file) must not reach files outside it: a name that is absolute or has a
``..`` part, or whose symlinks resolve outside the directory, is treated exactly like a missing
file, so an error never tells whether some other file exists. The one escape allowed is the
Hugging Face hub cache's own: ``<repo>/snapshots/<revision>/<file>`` linking to
``<repo>/blobs/<hash>``.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath

__all__ = ["confined_file"]


def confined_file(directory: Path, name: object) -> Path | None:
    """``directory / name`` when ``name`` is a relative path without ``..`` that resolves to a
    regular file inside ``directory`` (or its hub-cache repository); None otherwise, whatever
    the reason, and without looking at anything outside."""
    if not isinstance(name, str) or not name or "\0" in name:
        return None
    parts = PurePosixPath(name).parts
    if PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute() or ".." in parts or "\\" in name:
        return None
    root = Path(os.path.realpath(directory))
    if root.parent.name == "snapshots" and (root.parent.parent / "blobs").is_dir():
        root = root.parent.parent
    real = Path(os.path.realpath(directory / name))
    if real != root and root not in real.parents:
        return None
    try:
        if not stat.S_ISREG(os.stat(real).st_mode):
            return None
    except OSError:
        return None
    return directory / name
