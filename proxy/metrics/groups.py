"""Consumer-group observability in the proxy: the shared tracker, its /metrics collector,
and what each completed rebalance becomes (a log line, a histogram observation, an
archive record under ``groups/``).

The decisions are ``policies.groups``'; the handlers that feed it are
``policies.group_handlers``'. Series are read from the tracker at scrape time, so a
group that expires or is evicted simply stops being exported.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kproxy.archive import ArchiveWriter
from kproxy.metrics import group_status
from kproxy.metrics.group_merge import GroupMerge, MergedGroup, group_facts
from kproxy.metrics.proxy_metrics import ProxyMetrics
from kproxy.policies.fetch_watermarks import TopicNames
from kproxy.policies.group_handlers import GroupWatch
from kproxy.policies.groups import GroupLimits, GroupTracker, Rebalance

log = logging.getLogger("kproxy.groups")

# Rebalances last from well under a second (a static group) to minutes (a slow member
# holding the round up to its rebalance timeout).
REBALANCE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class GroupService:
    def __init__(self, limits: GroupLimits, metrics: ProxyMetrics,
                 archive: ArchiveWriter | None = None) -> None:
        self.archive = archive
        self.hostname = socket.gethostname()
        self.tracker = GroupTracker(limits, on_rebalance=self.rebalanced)
        self.watch = GroupWatch(self.tracker, time.monotonic,
                                TopicNames(limits.max_partitions))
        r = metrics.registry
        self.seconds = Histogram(
            "kproxy_group_rebalance_seconds", "Duration of completed consumer-group "
            "rebalances, from the first JoinGroup of a round to the last SyncGroup response "
            "of the new generation (KIP-848: until every member reached the new epoch)",
            buckets=REBALANCE_BUCKETS, registry=r)
        r.register(GroupCollector(self))
        # One process's groups in the merged shape the status page reads (as a
        # supervisor's are), counted by this process's own tracker.
        self._merge = GroupMerge(limits)

    def facts(self, now: float) -> dict[str, Any]:
        """What a supervisor merges (``/internal/facts``, ``/internal/sample``)."""
        return group_facts(self.tracker, now)

    def merged(self, now: float) -> list[MergedGroup]:
        groups = self._merge.merge([self.facts(now)], now)
        for g in groups:
            own = self.tracker.groups.get(g.group_id)
            if own is not None:
                g.rebalances = own.rebalances
        return groups

    def figures(self, now: float) -> list[tuple[str, int | None, int]]:
        """Per group what the status page's history keeps: total lag, rebalances."""
        return group_status.history_figures(self.merged(now))

    def status(self, now: float, wall: float) -> dict[str, Any]:
        """The ``groups`` part of this process's status snapshot."""
        return group_status.rows(self.merged(now), now, wall)

    def rebalanced(self, event: Rebalance) -> None:
        """One completed rebalance: counted by the tracker, logged, observed, archived."""
        self.seconds.observe(event.seconds)
        fields = {"group": event.group, "generation": event.generation,
                  "members_before": event.members_before,
                  "members_after": event.members_after,
                  "duration_s": round(event.seconds, 3), "reason": event.reason,
                  "protocol": event.protocol, "assignor": event.assignor}
        log.info("consumer group rebalanced", extra={"fields": fields})
        if self.archive is not None:
            self.archive.group_rebalance({"ts": round(time.time(), 3),
                                          "proxy": self.hostname, **fields})


class GroupCollector(Collector):
    """Reads the tracker at scrape time; expired groups are dropped first."""

    def __init__(self, service: GroupService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        tracker = self.service.tracker
        tracker.expire(time.monotonic())
        rebalances = CounterMetricFamily(
            "kproxy_group_rebalances", "Completed rebalances seen, per group", labels=["group"])
        abandoned = CounterMetricFamily(
            "kproxy_group_rebalances_abandoned", "Rebalance rounds the proxy never saw "
            "complete (members synced through another proxy, or the round was lost) and "
            "stopped timing", labels=["group"])
        generation = GaugeMetricFamily(
            "kproxy_group_generation", "Generation (KIP-848: group epoch as members "
            "reached it) of the group's last completed rebalance", labels=["group"])
        members = GaugeMetricFamily(
            "kproxy_group_members", "Members of the group, as the proxy last saw them",
            labels=["group"])
        info = GaugeMetricFamily(
            "kproxy_group_info", "1 per group: its protocol (classic, consumer, share, "
            "streams), protocol type and chosen assignor",
            labels=["group", "protocol", "protocol_type", "assignor"])
        errors = CounterMetricFamily(
            "kproxy_group_member_errors", "Errors the coordinator answered group members "
            "with, by name", labels=["group", "error"])
        assigned = GaugeMetricFamily(
            "kproxy_group_assigned_partitions", "Partitions assigned to each member, from "
            "its SyncGroup response or KIP-848 heartbeat", labels=["group", "member"])
        lag = GaugeMetricFamily(
            "kproxy_group_lag", "Last high watermark seen in a Fetch response minus the "
            "last offset the group committed, per partition where both were seen",
            labels=["group", "topic", "partition"])
        for g in tracker.groups.values():
            rebalances.add_metric([g.group_id], g.rebalances)
            if g.abandoned_rounds:
                abandoned.add_metric([g.group_id], g.abandoned_rounds)
            if g.generation >= 0:
                generation.add_metric([g.group_id], g.generation)
            members.add_metric([g.group_id], len(g.members))
            info.add_metric([g.group_id, g.protocol, g.protocol_type, g.assignor], 1)
            for name, n in g.errors.items():
                errors.add_metric([g.group_id, name], n)
            for m in g.members.values():
                if m.assigned is not None:
                    assigned.add_metric([g.group_id, m.member_id], m.assigned)
            for topic, partition, value in tracker.lag(g):
                lag.add_metric([g.group_id, topic, str(partition)], value)
        yield from (rebalances, abandoned, generation, members, info, errors, assigned, lag)
        yield GaugeMetricFamily("kproxy_group_tracked", "Consumer groups currently tracked",
                                value=len(tracker.groups))
        yield CounterMetricFamily(
            "kproxy_group_evicted", "Groups forgotten because --group-max-groups was reached",
            value=tracker.evicted_groups)
        yield CounterMetricFamily(
            "kproxy_group_decode_failures", "Group-protocol frames the proxy could not read "
            "(relayed unchanged all the same)", value=tracker.decode_failures)
