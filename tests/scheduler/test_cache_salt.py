"""Request.cache_salt: the prefix cache (memory and disk) shares prefixes only between
requests with the same salt, so one client cannot learn another's prompts from cached_tokens;
tokens never depend on the salt, and the salt itself is never written to disk."""
from __future__ import annotations

import numpy as np

from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig
from scheduler.prefix_disk import DiskPrefixStore
from tests.support.scheduler_engines import FakeEngine

V = 64


def test_cache_salt_separates_prefix_cache_namespaces(tmp_path):
    rng = np.random.default_rng()
    prompt = rng.integers(1, V, 40).tolist()
    salt = f"secret-{rng.integers(1 << 30)}"
    sched = Scheduler(FakeEngine(V, seed=1), SchedulerConfig(max_batch=2, prefix_cache_bytes=1 << 20, prefix_block=8),
                      prefix_store=DiskPrefixStore(tmp_path, 1 << 20, "fake"))
    order = [("a", salt), ("b", ""), ("c", "other"), ("d", salt), ("e", "")]
    for rid, s in order:  # one at a time: each sees what the earlier ones cached
        sched.add(Request(rid, prompt, SamplingParams(max_tokens=4, stop_tokens=()), cache_salt=s))
        sched.run()
    out = {rid: sched.results[rid] for rid, _ in order}
    assert len({tuple(o.tokens) for o in out.values()}) == 1
    assert [out[r].cached_tokens > 0 for r in "abcde"] == [False, False, False, True, True]
    assert not any(salt.encode() in p.read_bytes() for p in tmp_path.iterdir())
