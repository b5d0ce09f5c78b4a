"""Data-parallel replicas: several schedulers driven as one, behind
``scheduler.interface.SchedulerInterface``.

- ``replica_set``: ``ReplicaSet`` (routing, retries, taking a replica out, exactly-once delivery);
- ``replica``: one replica's record and a request's track in the set;
- ``build``: ``build_replica_set`` (one Scheduler per engine), ``--data-parallel``, per-replica reports;
- ``affinity``: which replica served a conversation's earlier turn;
- ``engine_guard``: an engine's exception counters and the test-only fault injection;
- ``ray_cluster``: ``RayReplicaSet``, the replicas as Ray actors (the one module that imports
  Ray), and ``ray_actor``, the actor (its engine loaded by a callable the command gives).
"""
