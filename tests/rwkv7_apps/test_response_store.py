"""The Responses API's store: bounded by count and by bytes, oldest evicted; and the
replica set's conversation affinity map (longest recorded prefix, per initial state, LRU)."""
from __future__ import annotations

import numpy as np

from rwkv7_apps.serve.response_store import ENTRY_OVERHEAD, ResponseStore
from scheduler.replicas.affinity import ConversationAffinity


def _put(store, rid, n_tokens, rng):
    store.put(rid, "m", None, rng.integers(0, 65536, n_tokens).tolist(), False, {"id": rid})


def test_the_store_evicts_the_oldest_beyond_its_count_and_bytes():
    rng = np.random.default_rng()
    store = ResponseStore(max_count=3, max_bytes=8100 + 2 * ENTRY_OVERHEAD)
    for i in range(4):
        _put(store, f"r{i}", 10, rng)
    assert store.get("r0") is None and [store.get(f"r{i}").body["id"] for i in (1, 2, 3)] == ["r1", "r2", "r3"]
    _put(store, "big", 2000, rng)  # 8,000 bytes of tokens (+ JSON): one small one (~50 bytes) fits beside it
    assert store.get("big") is not None and store.get("r3") is not None and store.get("r2") is None
    assert store.nbytes <= 8100 + 2 * ENTRY_OVERHEAD and store.evicted == 3
    _put(store, "huge", 5000, rng)  # larger than the whole store: not kept, nothing evicted for it
    assert store.get("huge") is None and len(store) == 2
    assert store.delete("big") and not store.delete("big") and list(store.get("r3").tokens) != []
    tokens = rng.integers(0, 65536, 7).tolist()
    store.put("t", "m", "s", tokens, True, {})
    assert list(store.get("t").tokens) == tokens and store.get("t").ends_at_user


def test_the_store_bound_is_the_memory_it_holds():
    """Bodies of many small keys (the issue's 20,000-key metadata: JSON bytes counted, dicts
    held, 1.5 GB against 256 MB): the memory held stays near the counted bytes."""
    import gc
    import tracemalloc

    rng = np.random.default_rng()
    gc.collect()
    tracemalloc.start()
    store = ResponseStore(max_count=10_000, max_bytes=4 << 20)
    for i in range(400):
        body = {"id": f"r{i}", "metadata": {f"k{j}": str(v) for j, v in enumerate(rng.integers(0, 9, 2000))}}
        store.put(f"r{i}", "m", None, rng.integers(0, 65536, 50).tolist(), False, body)
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert store.evicted > 0 and store.nbytes <= 4 << 20
    assert held < 1.3 * store.max_bytes, (held, store.nbytes)
    assert store.get("r399").body["metadata"]["k7"] in "012345678"


def test_affinity_finds_the_longest_recorded_prefix_per_state():
    rng = np.random.default_rng()
    prompt, output, more = (rng.integers(0, 65536, n).tolist() for n in (9, 4, 5))
    where = ConversationAffinity(max_entries=4)
    assert where.lookup(None, prompt + output) is None
    where.record(None, prompt, output, 1)
    where.record(None, prompt + output + more, [], 0)
    assert where.lookup(None, prompt + more) == 1                 # the first turn's prompt
    assert where.lookup(None, prompt + output + more[:2]) == 1    # its prompt + output
    assert where.lookup(None, prompt + output + more + [3]) == 0  # the longer, later turn
    assert where.lookup("a-state", prompt + output) is None       # another initial state
    assert where.lookup(None, prompt[:-1]) is None
    for i in range(3):
        where.record(None, [i + 1], [], 1)
    assert where.lookup(None, prompt + more) is None  # forgotten: least recently used of 4
    where.forget_replica(1)
    assert where.lookup(None, [1, 2]) is None
