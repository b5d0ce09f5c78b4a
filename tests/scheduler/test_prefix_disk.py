"""The prefix cache's disk tier (scheduler/prefix_disk.py) on real files: entries outlive
the store that wrote them, never load for another model, state or token sequence, corrupt
files are skipped with a warning, the directory stays bounded, and concurrent writers do not
corrupt it."""
import logging
import multiprocessing
import os
import threading
import time

import numpy as np
import pytest

from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig
from scheduler.prefix_disk import DiskPrefixStore
from tests.support.scheduler_engines import FakeEngine

V = 64
FP = "model-a/float32/torch/cpu"


def _row(rng, n=256):
    return (rng.standard_normal(n), None, rng.standard_normal(V).astype(np.float32))


def _same(a, b):
    return len(a) == len(b) and all((x is None and y is None) or np.array_equal(x, y) for x, y in zip(a, b))


def _files(d):
    return sorted(p for p in d.iterdir() if p.suffix == ".safetensors")


def test_entries_outlive_their_store_and_stay_apart(tmp_path):
    rng = np.random.default_rng()
    tokens = rng.integers(0, V, 50).tolist()
    rows = {n: _row(rng) for n in (16, 32, 50)}
    writer = DiskPrefixStore(tmp_path, 1 << 20, FP)
    for n, row in rows.items():
        writer.put(tokens[:n], row)
    other_state = _row(rng)
    writer.put(tokens[:40], other_state, namespace="state-x")
    reader = DiskPrefixStore(tmp_path, 1 << 20, FP)  # a later process
    n, row, _ = reader.longest_prefix(tokens + [1, 2])
    assert n == 50 and _same(row, rows[50])
    n, row, _ = reader.longest_prefix(tokens[:45])
    assert n == 32 and _same(row, rows[32])
    assert reader.longest_prefix(tokens[:45], longer_than=32) == (0, None, 0)
    assert reader.longest_prefix(tokens[:15]) == (0, None, 0)
    n, row, _ = reader.longest_prefix(tokens, namespace="state-x")
    assert n == 40 and _same(row, other_state)
    assert reader.lengths() == {16, 32, 50} and reader.lengths("state-x") == {40}
    assert DiskPrefixStore(tmp_path, 1 << 20, "model-b").longest_prefix(tokens) == (0, None, 0)
    assert not [p for p in tmp_path.iterdir() if p.suffix != ".safetensors"]  # no temporary files left


def _corrupt(path, how):
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[:len(data) - 100])
    elif how == "garbage_header":
        path.write_bytes(data[:8] + b"{not json" + data[17:])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "oversized":
        path.write_bytes(data + bytes(2 << 20))
    elif how == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif how == "symlink":
        real = path.with_name("elsewhere")
        path.rename(real)
        path.symlink_to(real)


@pytest.mark.parametrize("how", ["truncated", "garbage_header", "empty", "oversized", "fifo", "symlink"])
def test_corrupt_file_is_skipped_with_a_warning_and_removed(tmp_path, caplog, how):
    """A FIFO with an entry's name is opened without blocking (it used to block the lookup in
    open() for ever), a link is not followed, and a file over the budget is not read."""
    rng = np.random.default_rng()
    tokens = rng.integers(0, V, 30).tolist()
    store = DiskPrefixStore(tmp_path, 1 << 20, FP)
    store.put(tokens[:10], _row(rng))
    store.put(tokens[:20], _row(rng))
    longest = [p for p in _files(tmp_path) if "-20-" in p.name][0]
    _corrupt(longest, how)
    found: list = []
    with caplog.at_level(logging.WARNING, logger="scheduler.prefix_disk"):
        lookup = threading.Thread(target=lambda: found.append(DiskPrefixStore(tmp_path, 1 << 20, FP)
                                                              .longest_prefix(tokens)), daemon=True)
        lookup.start()
        lookup.join(30)
    if lookup.is_alive():
        pytest.fail("the lookup blocked")
    n, _, removed = found[0]
    assert n == 10 and removed == 1  # fell back to the shorter, intact entry
    assert "skipped and removed" in caplog.text and longest.name in caplog.text
    assert not longest.exists()


def test_a_file_under_the_wrong_name_is_never_loaded(tmp_path, caplog):
    """Another model's entry, or another prefix's, renamed to look like ours: the full
    fingerprint and the tokens inside are checked."""
    rng = np.random.default_rng()
    tokens = rng.integers(0, V, 30).tolist()
    ours, theirs = DiskPrefixStore(tmp_path / "a", 1 << 20, FP), DiskPrefixStore(tmp_path / "b", 1 << 20, "model-b")
    theirs.put(tokens[:20], _row(rng))
    ours.put(tokens[:21], _row(rng))
    name_20 = ours.path(tokens[:20])
    os.replace(_files(tmp_path / "b")[0], name_20)
    with caplog.at_level(logging.WARNING, logger="scheduler.prefix_disk"):
        assert ours.longest_prefix(tokens[:20]) == (0, None, 0)
    assert "another model" in caplog.text
    os.replace(ours.path(tokens[:21]), name_20)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="scheduler.prefix_disk"):
        assert ours.longest_prefix(tokens[:20]) == (0, None, 0)
    assert "its tokens are not the ones" in caplog.text


def test_directory_is_bounded_least_recently_used_first(tmp_path):
    rng = np.random.default_rng()
    size = None
    store = DiskPrefixStore(tmp_path, 1 << 30, FP)
    keys = [[i] * 3 for i in range(6)]
    for k in keys[:4]:
        store.put(k, _row(rng))
        size = size or _files(tmp_path)[0].stat().st_size
    old = time.time() - 100
    for i, p in enumerate(sorted(_files(tmp_path), key=lambda p: p.stat().st_mtime)):
        os.utime(p, (old + i, old + i))
    assert store.longest_prefix(keys[0])[0] == 3  # a hit refreshes keys[0]
    bounded = DiskPrefixStore(tmp_path, int(size * 4.5), FP)
    bounded.put(keys[4], _row(rng))  # 5 files > 4.5 sizes: the least recently used (keys[1]) goes
    assert bounded.longest_prefix(keys[1]) == (0, None, 0)
    assert all(bounded.longest_prefix(k)[0] == 3 for k in (keys[0], keys[2], keys[3], keys[4]))
    assert sum(p.stat().st_size for p in _files(tmp_path)) <= size * 4.5


def _writer(directory, seed, budget):
    rng = np.random.default_rng(seed)
    store = DiskPrefixStore(directory, budget, FP)
    for i in range(60):
        key = [int(i % 20)] * 4  # both writers write (and evict) the same names
        store.put(key, (np.full(512, float(i % 20)), np.zeros(V, np.float32)))
        store.longest_prefix(key + [int(rng.integers(V))])


def test_concurrent_writers_do_not_corrupt_the_directory(tmp_path, caplog):
    budget = 12 * (512 * 8 + V * 4 + 1024)
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may run JAX threads
    procs = [ctx.Process(target=_writer, args=(tmp_path, s, budget)) for s in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    store = DiskPrefixStore(tmp_path, budget, FP)
    with caplog.at_level(logging.WARNING, logger="scheduler.prefix_disk"):
        found = [i for i in range(20) if store.longest_prefix([i] * 4)[0] == 4]
    assert found and not caplog.text  # every file left is whole and right
    for i in found:
        assert np.array_equal(store.longest_prefix([i] * 4)[1][0], np.full(512, float(i)))
    assert sum(p.stat().st_size for p in _files(tmp_path)) <= budget


def test_scheduler_disk_tier_hits_in_a_new_scheduler_and_gives_the_same_tokens(tmp_path):
    rng = np.random.default_rng()
    system = rng.integers(1, V, 40).tolist()
    requests = [Request(f"r{i}", system + rng.integers(1, V, 5).tolist(), SamplingParams(max_tokens=6, stop_tokens=()))
                for i in range(4)]
    runs = []
    for memory in (0, 1 << 20, 0):  # disk only, memory + disk, disk only again
        sched = Scheduler(FakeEngine(V, seed=1), SchedulerConfig(max_batch=2, prefix_cache_bytes=memory, prefix_block=8),
                          prefix_store=DiskPrefixStore(tmp_path, 1 << 20, FP))
        for r in requests:
            sched.add(r)
        sched.run()
        runs.append(([sched.results[r.id].tokens for r in requests], sched.stats))
    plain = Scheduler(FakeEngine(V, seed=1), SchedulerConfig(max_batch=2))
    for r in requests:
        plain.add(r)
    plain.run()
    assert all(tokens == [plain.results[r.id].tokens for r in requests] for tokens, _ in runs)
    first, later = runs[0][1], runs[2][1]
    assert later.prefix_hits == 4 and sum(p.tokens for p in later.prefills) == 0  # whole prompts from disk
    assert sum(p.tokens for p in first.prefills) > 0


@pytest.mark.parametrize("how", ["truncated", "nested_header", "nan"])
def test_a_bad_entry_is_removed_and_the_request_recomputed_without_it(tmp_path, how):
    """An entry that does not load (cut, or a header nested past Python's recursion limit)
    or whose state is NaN: the request still gets exactly its uncached result, the bad entry
    is removed (counted in ``Stats.prefix_removed``) and a good one takes its place."""
    rng = np.random.default_rng()
    system = rng.integers(1, V, 40).tolist()
    params = SamplingParams(max_tokens=6, stop_tokens=())
    config = SchedulerConfig(max_batch=2, prefix_block=8)
    first = Scheduler(FakeEngine(V, seed=1), config, prefix_store=DiskPrefixStore(tmp_path, 1 << 20, FP))
    first.add(Request("warm", system + rng.integers(1, V, 5).tolist(), params))
    first.run()
    store = DiskPrefixStore(tmp_path, 1 << 20, FP)
    path = store.path(system)  # the 40-token boundary entry a new prompt on this system prompt hits
    if how == "truncated":
        _corrupt(path, "truncated")
    elif how == "nested_header":
        header = b"[" * 100_000 + b"]" * 100_000
        path.write_bytes(len(header).to_bytes(8, "little") + header)
    else:
        _, row, _ = store.longest_prefix(system)
        store.remove(system)
        store.put(system, tuple(None if a is None else np.full_like(a, np.nan) for a in row))
    request = Request("again", system + rng.integers(1, V, 5).tolist(), params)
    sched = Scheduler(FakeEngine(V, seed=1), config, prefix_store=store)
    sched.add(request)
    sched.run()
    plain = Scheduler(FakeEngine(V, seed=1), SchedulerConfig(max_batch=2))
    plain.add(request)
    plain.run()
    assert sched.results["again"].tokens == plain.results["again"].tokens
    assert sched.results["again"].finish_reason == "length" and sched.stats.prefix_removed == 1
    n, row, removed = store.longest_prefix(system)
    assert n == 40 and removed == 0 and all(np.isfinite(a).all() for a in row if a is not None)
