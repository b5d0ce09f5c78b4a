"""Building the native kernels: cached by source and host, and a host that cannot build them
gets one line saying why (a missing or failing compiler), with nothing left in the cache."""
from __future__ import annotations

import os
import time

import pytest

from cpu_kernels import library


def test_a_build_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("RWKV7_CPU_KERNELS_DIR", str(tmp_path))
    first = library.build()
    assert first.parent == tmp_path and first.suffix == ".so"
    inode = first.stat().st_ino  # a rebuild renames a new file over it
    assert library.build() == first and first.stat().st_ino == inode
    assert [p.name for p in tmp_path.iterdir()] == [first.name]


def test_stale_builds_are_pruned_when_another_is_built(tmp_path, monkeypatch):
    monkeypatch.setenv("RWKV7_CPU_KERNELS_DIR", str(tmp_path))
    stale, recent = tmp_path / "linear-0000000000000000.so", tmp_path / "linear-1111111111111111.so"
    for path, days in ((stale, library.STALE_DAYS + 1), (recent, library.STALE_DAYS - 1)):
        path.write_bytes(b"")
        old = time.time() - days * 86400
        os.utime(path, (old, old))
    built = library.build()
    assert sorted(tmp_path.iterdir()) == sorted([built, recent])
    os.utime(built, (0, 0))
    assert library.build() == built and built.stat().st_mtime > time.time() - 60  # a use marks it


def test_a_missing_compiler_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("RWKV7_CPU_KERNELS_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    with pytest.raises(library.NativeKernelsUnavailable, match="no-such-c\\+\\+.*not found"):
        library.build()


def test_a_failing_compile_leaves_nothing(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "c++"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'fake 1.0'\n[ \"$1\" = --version ] && exit 0\necho 'linear.cc:1: error: no' >&2\nexit 1\n")
    fake.chmod(0o755)
    cache = tmp_path / "cache"
    monkeypatch.setenv("RWKV7_CPU_KERNELS_DIR", str(cache))
    monkeypatch.setenv("CXX", str(fake))
    with pytest.raises(library.NativeKernelsUnavailable, match="building the native CPU kernels failed.*error: no"):
        library.build()
    assert list(cache.iterdir()) == []


def test_the_declared_capabilities_follow_the_host_instruction_set():
    """The build declares what -march=native gave it (the host's flags), nothing probed at run time."""
    flags = set(library.host_cpu().split())
    capabilities = library.load().capabilities
    assert (library.MANY_ROWS in capabilities) == ("avx512f" in flags)
    assert (library.BF16_DOT in capabilities) == ("avx512_bf16" in flags)
