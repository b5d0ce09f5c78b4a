"""States and the prefix cache's disk tier under local data-parallel replicas (ReplicaSet on
the numpy FakeEngine): requests started from an initial state and asked for their final
state give what one scheduler gives, and the replicas share one disk tier."""
from __future__ import annotations

import numpy as np

from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig
from scheduler.prefix_disk import DiskPrefixStore
from scheduler.replicas.build import build_replica_set
from scheduler.request import InitialState
from tests.support.scheduler_engines import FakeEngine

CONFIG = SchedulerConfig(max_batch=2, prefix_block=8)


def _requests(engine) -> list[Request]:
    rng = np.random.default_rng()
    start = InitialState.of(engine.to_host(engine.prefill(rng.integers(1, 64, 5))))
    system = rng.integers(1, 64, 20).tolist()
    return [Request(f"q{i}", system + rng.integers(1, 64, 3).tolist(), SamplingParams(max_tokens=5, stop_tokens=()),
                    initial_state=start if i % 2 else None, return_state=True) for i in range(8)]


def _outputs(sched, requests) -> dict:
    out = {}
    for r in requests:
        sched.add(r)
    sched.run(on_finish=lambda o: out.__setitem__(o.id, o))
    return out


def test_replicas_carry_states_and_share_the_disk_tier(tmp_path):
    requests = _requests(FakeEngine(64, seed=5))
    single = _outputs(Scheduler(FakeEngine(64, seed=5), CONFIG), requests)
    hits = []
    for _ in range(2):  # the second run's replicas are fresh: only the disk remembers
        store = DiskPrefixStore(tmp_path, 1 << 20, "fake")
        rset = build_replica_set([FakeEngine(64, seed=5) for _ in range(2)], ["a", "b"], CONFIG, prefix_store=store)
        got = _outputs(rset, requests)
        for r in requests:
            assert got[r.id].tokens == single[r.id].tokens
            np.testing.assert_array_equal(got[r.id].final_state[0], single[r.id].final_state[0])
        hits.append(sum(rep.scheduler.stats.prefix_hits for rep in rset.replicas))
        assert all(rep.requests for rep in rset.replicas)
    assert hits[1] == 8  # every prompt whole from disk
    assert store.lengths() and store.lengths(requests[1].initial_state.key)
