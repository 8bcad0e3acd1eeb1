"""The proxy's own Prometheus metrics. Labels are bounded: API name, listener, outcome.

No label value comes straight from a client: an API key outside the known table is
one ``unknown`` value (a client choosing keys would otherwise mint up to 65,536
series), listeners are per broker in the node id range, the rest are fixed sets.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kproxy.codecs.api_keys import API_KEYS, api_name
from kproxy.exposition import PieceSource

UNKNOWN_API = -1  # every api key the proxy does not know shares one label, "unknown"


@dataclass(frozen=True, slots=True)
class ApiMetrics:
    """The per-API children, looked up once: `labels()` on every frame is costly."""

    requests: Any
    request_bytes: Any
    response_bytes: Any
    latency: Any


class ProxyMetrics:
    def api(self, api_key: int) -> ApiMetrics:
        """The children for one API; a key a client made up gets no label of its own."""
        if api_key not in API_KEYS:
            api_key = UNKNOWN_API
        found = self._per_api.get(api_key)
        if found is None:
            name = api_name(api_key) if api_key != UNKNOWN_API else "unknown"
            found = self._per_api[api_key] = ApiMetrics(
                self.requests.labels(name), self.request_bytes.labels(name),
                self.response_bytes.labels(name), self.latency.labels(name))
        return found

    def watch_budget(self, budget: BudgetFigures) -> None:
        self.registry.register(BudgetCollector(budget))

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._per_api: dict[int, ApiMetrics] = {}
        self.registry = registry or CollectorRegistry()
        # Sources too large to render in one go (client telemetry): kproxy.exposition
        # renders them in pieces, between which the relay runs.
        self.piece_sources: list[PieceSource] = []
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
        self.requests = Counter(
            "kproxy_requests", "Requests relayed or answered, by API", ["api"], registry=r)
        self.request_bytes = Counter(
            "kproxy_request_bytes", "Request bytes from clients, by API", ["api"], registry=r)
        self.response_bytes = Counter(
            "kproxy_response_bytes", "Response bytes to clients, by API", ["api"], registry=r)
        self.latency = Histogram(
            "kproxy_request_latency_seconds", "Time from a request's arrival to its response "
            "leaving the proxy", ["api"], registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
                     5, 10, 30))
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
        self.limits_hit = Counter(
            "kproxy_limit_hits", "Configured limits reached: connections refused, sessions "
            "closed by a timeout or an oversized frame, clients paused by max_inflight",
            ["limit"], registry=r)


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
