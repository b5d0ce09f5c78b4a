"""Per-replica metrics of a server on a replica set (``--data-parallel``), read at scrape
time: requests routed to and finished on each replica, and conversation-affinity routing
("kept" on the replica of the conversation's previous turn, "moved" off a much busier one)."""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily


class ReplicaCollector:
    """A prometheus collector over a ``scheduler.replicas.replica_set.ReplicaSet``."""

    def __init__(self, replica_set):
        self.replica_set = replica_set

    def collect(self):
        routed = CounterMetricFamily("rwkv7_replica_routed", "Requests (a shared-prompt group counts once) "
                                     "routed to each replica", labels=["replica"])
        finished = CounterMetricFamily("rwkv7_replica_requests", "Requests finished on each replica",
                                       labels=["replica"])
        for r in self.replica_set.replicas:
            routed.add_metric([str(r.index)], r.routed)
            finished.add_metric([str(r.index)], r.requests)
        yield routed
        yield finished
        affinity = CounterMetricFamily("rwkv7_affinity_routes", "Conversation turns routed by affinity: kept on "
                                       "their previous turn's replica, or moved off it (much busier)",
                                       labels=["result"])
        for result, n in self.replica_set.affinity_routes.items():
            affinity.add_metric([result], n)
        yield affinity
