"""What the telemetry handlers count, apart from how they answer.

Every label these counters take is the proxy's own (an API, an error name, a
compression, a bound), never a value a client chose, so each counter has a fixed,
small number of children.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter

from kproxy.logs import RateLimitedLog
from kproxy.policies.telemetry import state as policy
from kproxy.policies.telemetry import subscriptions as subs
from kproxy.policies.telemetry.store import IngestStats

_COMPRESSION = {v: k for k, v in subs.COMPRESSION_NAMES.items()}
WARNING_EVERY_S = 60.0  # each of the warnings below, at most this often


class TelemetryCounters:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.requests = Counter(
            "kproxy_telemetry_requests", "Telemetry requests answered by the proxy, by API "
            "and error", ["api", "error"], registry=r)
        self.dropped = Counter(
            "kproxy_telemetry_points_dropped", "Client metric points not exported because "
            "each would have added a series beyond the series cap", registry=r)
        self.by_compression = Counter(
            "kproxy_telemetry_pushes_decoded", "Accepted pushes, by compression type",
            ["compression"], registry=r)
        self.unsupported = Counter(
            "kproxy_telemetry_points_unsupported", "Client metric points of a kind not "
            "exported (summaries, exponential histograms) or of a conflicting type",
            registry=r)
        self.over_limit = Counter(
            "kproxy_telemetry_pushes_over_limit", "Pushes refused because decoding them "
            "would pass a bound, by bound: bytes (TELEMETRY_TOO_LARGE), decompressed_bytes, "
            "points, metrics, fields, attributes, point_bytes, buckets (INVALID_RECORD)",
            ["limit"], registry=r)
        self.dropped_other = Counter(
            "kproxy_telemetry_dropped", "Client metric data not kept because a bound was "
            "reached, by bound: series_bytes, families, point_labels", ["bound"], registry=r)
        self.vetted = Counter(
            "kproxy_telemetry_pushes_vetted", "Paced pushes checked in the vetting helper "
            "process before being decoded here, by verdict: passed, refused, none (the "
            "helper was not available, or no core had time to spare for it; the push "
            "was decoded here only)", ["verdict"],
            registry=r)
        # By (error, compression): the children an answered push increments, looked up
        # once; bounded by the error codes and compression types that exist.
        self._pushes: dict[tuple[int, int], tuple[Counter, Counter | None]] = {}
        self._ratelog = RateLimitedLog(WARNING_EVERY_S)
        self._evictions_seen = 0

    def get_answered(self, error: int) -> None:
        self.requests.labels("GetTelemetrySubscriptions", policy.ERROR_NAMES[error]).inc()

    def push_answered(self, result: policy.PushResult) -> None:
        error = result.error_code
        children = self._pushes.get((error, result.compression_type))
        if children is None:
            children = self._pushes[error, result.compression_type] = (
                self.requests.labels("PushTelemetry", policy.ERROR_NAMES[error]),
                None if error else self.by_compression.labels(
                    _COMPRESSION[result.compression_type]))
        children[0].inc()
        if children[1] is not None:
            children[1].inc()
        if result.limit:
            self.over_limit.labels(result.limit).inc()

    def ingested(self, stats: IngestStats, max_series: int) -> None:
        """What an ingest could not keep, by bound; the series cap also logged, at most
        once a minute."""
        if stats.dropped_by_cap:
            self.dropped.inc(stats.dropped_by_cap)
            self._ratelog(logging.WARNING, "series-cap",
                          "client metric series cap reached; dropping new series",
                          max_series=max_series, dropped=stats.dropped_by_cap)
        if stats.unsupported or stats.type_conflicts:
            self.unsupported.inc(stats.unsupported + stats.type_conflicts)
        for bound, n in (("series_bytes", stats.dropped_by_bytes),
                         ("families", stats.dropped_families),
                         ("point_labels", stats.labels_dropped)):
            if n:
                self.dropped_other.labels(bound).inc(n)

    def evictions(self, state: policy.TelemetryState) -> None:
        """Warn, at most once a minute, that instances were forgotten to make room: a
        fleet larger than the bounds churns (each client's series start again)."""
        evicted = state.evicted
        total = evicted["instances"] + evicted["bytes"]
        if total == self._evictions_seen:  # the common case: two reads, no clock
            return
        self._evictions_seen = total
        settings = state.settings
        self._ratelog(logging.WARNING, "instances-evicted",
                      "client instances forgotten to make room; raise "
                      "telemetry_max_instances or telemetry_max_instance_bytes if the "
                      "fleet is this large", evicted_by_count=evicted["instances"],
                      evicted_by_bytes=evicted["bytes"], max_instances=settings.max_instances,
                      max_instance_bytes=settings.max_instance_bytes,
                      instances=len(state.instances))
