"""The proxy's own Prometheus metrics. Labels are bounded: API name, listener, outcome.

No label value comes straight from a client: an API key outside the known table is
one ``unknown`` value (a client choosing keys would otherwise mint up to 65,536
series), listeners are per broker in the node id range, the rest are fixed sets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kproxy.metrics.api_metrics import ApiFigures, ApiStats
from kproxy.metrics.exposition import PieceSource


class ProxyMetrics:
    def watch_budget(self, budget: BudgetFigures) -> None:
        self.registry.register(BudgetCollector(budget))

    def watch_filters(self, counts: Callable[[], dict[tuple[str, str], int]]) -> None:
        """Configured filters' decisions, read at scrape time (plain numbers the chain keeps)."""
        self.registry.register(FilterDecisions(counts))

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        # Per-API counts, bytes and latency: plain numbers, touched by every request.
        self.apis = ApiFigures()
        # One API's figures; a key a client made up gets no label of its own.
        self.api: Callable[[int], ApiStats] = self.apis.api
        # Sources too large to render in one go (the per-API families, client
        # telemetry): kproxy.metrics.exposition renders them in pieces, between which the
        # relay runs.
        self.piece_sources: list[PieceSource] = [self.apis.pieces]
        r = self.registry
        self.connections_active = Gauge(
            "kproxy_client_connections", "Client connections open now", ["listener"],
            registry=r)
        self.connections_total = Counter(
            "kproxy_client_connections_accepted", "Client connections accepted", ["listener"],
            registry=r)
        self.upstream_connect_failures = Counter(
            "kproxy_upstream_connect_failures", "Failed connects to a backend broker",
            ["listener"], registry=r)
        self.upstream_disconnects = Counter(
            "kproxy_upstream_disconnects", "Backend connections lost while a client was "
            "connected", ["listener"], registry=r)
        self.decode_errors = Counter(
            "kproxy_decode_errors", "Frames the proxy could not decode, by API and side",
            ["api", "side"], registry=r)
        self.node_out_of_range = Counter(
            "kproxy_node_out_of_range", "Backend nodes left out of responses because their id "
            "is outside the configured range", registry=r)
        self.brokers_known = Gauge(
            "kproxy_backend_brokers", "Backend brokers currently known", registry=r)
        self.broker_listeners = Gauge(
            "kproxy_broker_listeners", "Per-broker listeners open", registry=r)
        self.internal_errors = Counter(
            "kproxy_internal_errors", "Sessions closed by an unexpected error in the proxy",
            registry=r)
        self.stray_responses = Counter(
            "kproxy_stray_responses", "Broker answers to acks=0 requests, dropped because "
            "the client expects none", registry=r)
        # The express lane's counts: plain numbers, touched by every request it relays.
        self.lane = LaneCounts()
        r.register(LaneCollector(self.lane))
        self.config_reloads = Counter(
            "kproxy_config_reloads", "Configuration reloads, by outcome", ["outcome"],
            registry=r)
        self.topology_changes = Counter(
            "kproxy_topology_changes", "Backend changes that bumped the topology epoch, by "
            "reason", ["reason"], registry=r)
        self.topology_epoch = Gauge(
            "kproxy_topology_epoch", "Current topology epoch of the backend view", registry=r)
        self.rebootstrap = Counter(
            "kproxy_rebootstrap", "Clients told or made to bootstrap again, by outcome: "
            "injected (REBOOTSTRAP_REQUIRED in Metadata v13+), legacy_closed, legacy_ignored, "
            "upstream_gone (connection to a backend that left, closed)", ["outcome"],
            registry=r)
        self.tls_handshake_failures = Counter(
            "kproxy_tls_handshake_failures", "Client TLS handshakes that failed or timed out",
            ["listener"], registry=r)
        self.unauthenticated = Counter(
            "kproxy_unauthenticated_requests", "Connections closed for a request the proxy "
            "answers itself (telemetry) arriving before SASL authentication, by API",
            ["api"], registry=r)
        self.sasl_logins = Counter(
            "kproxy_sasl_logins", "Logins at the proxy (SASL terminated here), by mechanism "
            "and outcome (ok, failed)", ["mechanism", "outcome"], registry=r)
        self.limits_hit = Counter(
            "kproxy_limit_hits", "Configured limits reached: connections refused, sessions "
            "closed by a timeout or an oversized frame, clients paused by max_inflight",
            ["limit"], registry=r)
        # By kind only (produce, fetch, request): principals are not a bounded label.
        self.quota_throttle_seconds = Counter(
            "kproxy_quota_throttle_seconds", "Seconds clients were throttled by [[quotas]] "
            "(their channel muted), by kind", ["kind"], registry=r)
        self.quota_throttled = Counter(
            "kproxy_quota_throttled", "Requests or responses that throttled a client "
            "([[quotas]]), by kind", ["kind"], registry=r)


class LaneCounts:
    """The express lane's counts since start. A prometheus_client counter takes a lock
    and four calls an increment; these are additions, read at scrape time."""

    __slots__ = ("handbacks", "requests")

    def __init__(self) -> None:
        self.requests = 0
        self.handbacks = 0


class LaneCollector(Collector):
    def __init__(self, counts: LaneCounts) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("kproxy_express_lane_requests", "Requests the express "
                                  "lane relayed (small frames of busy connections, relayed "
                                  "off the event loop's scheduling)", self.counts.requests)
        yield CounterMetricFamily("kproxy_express_lane_handbacks", "Times the express lane "
                                  "handed a connection back to its own tasks (a frame it "
                                  "does not relay)", self.counts.handbacks)


class BudgetFigures(Protocol):
    limit: int
    used: int
    peak: int
    waits: int
    overdrafts: int


class BudgetCollector(Collector):
    """The memory budget's figures, read at scrape time."""

    def __init__(self, budget: BudgetFigures) -> None:
        self.budget = budget

    def collect(self) -> Iterator[Metric]:
        b = self.budget
        yield GaugeMetricFamily("kproxy_buffered_bytes", "Bytes held for connections now "
                                "(received, not yet written; both directions)", b.used)
        yield GaugeMetricFamily("kproxy_buffered_bytes_peak", "Most bytes held at once "
                                "since start", b.peak)
        yield GaugeMetricFamily("kproxy_buffered_bytes_limit", "max_buffered_bytes", b.limit)
        yield CounterMetricFamily("kproxy_buffer_waits", "Reads that waited for room in the "
                                  "memory budget (backpressure)", b.waits)
        yield CounterMetricFamily("kproxy_buffer_overdrafts", "Reservations let through over "
                                  "the budget because only waiting connections held bytes",
                                  b.overdrafts)


class FilterDecisions(Collector):
    """``kproxy_filter_decisions_total{filter,decision}``: one per frame a configured
    filter saw (forward, changed, answer, close, error). Filter names come from the
    config, so the series are bounded by it."""

    def __init__(self, counts: Callable[[], dict[tuple[str, str], int]]) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("kproxy_filter_decisions", "Decisions of the configured "
                                     "filters, per filter and decision",
                                     labels=["filter", "decision"])
        for (name, decision), n in sorted(self.counts().items()):
            family.add_metric([name, decision], n)
        yield family
