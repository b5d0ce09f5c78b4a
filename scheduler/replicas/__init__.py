"""Data-parallel replicas: several schedulers driven as one, behind
``scheduler.interface.SchedulerInterface``.

- ``replica_set``: ``ReplicaSet`` (routing, retries, taking a replica out, exactly-once delivery);
- ``affinity``: which replica served a conversation's earlier turn;
- ``engine_guard``: an engine's exception counters and the test-only fault injection.
"""
