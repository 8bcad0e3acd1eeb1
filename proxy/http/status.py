"""What the status page shows, gathered in one place: ``snapshot(proxy) -> dict``.

Read from the backend view, the open sessions, the telemetry state and the metrics;
nothing is kept here except when each connection last pushed telemetry. The result is
bounded whatever the number of clients (the largest groups and clients are listed, the
rest counted) and holds no credentials and no telemetry payload: only what a client
says of itself in request headers and ApiVersions, cut to ``MAX_TEXT`` characters.
``kproxy.http.status_page`` renders it; ``routes`` serves it as ``/`` and ``/status.json``.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.parse
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio
from prometheus_client import Counter

from kproxy import __version__
from kproxy.codecs import api_keys
from kproxy.http.history import STEP, History, Sample
from kproxy.http.server import Handler, HttpRequest, HttpResponse
from kproxy.http.status_page import render
from kproxy.policies.connection import ConnectionState
from kproxy.policies.metadata_bridge import BRIDGED_VERSION
from kproxy.policies.telemetry.state import ClientInstance
from kproxy.session.latency_sketch import merge, quantile
from kproxy.session.session import Session

if TYPE_CHECKING:
    from kproxy.runtime.server import Proxy

log = logging.getLogger("kproxy.status")
MAX_GROUPS = 25  # software name/version groups listed
MAX_CLIENTS = 10  # clients (client id, source address) listed per group
MAX_VALUES = 10  # client ids / source addresses listed per group
MAX_TEXT = 120  # characters kept of any string a client sent
P99 = 0.99
SNAPSHOT_TTL = 1.0  # seconds a snapshot is served again before a new one is taken


class PushTimes:
    """When each open connection last had a push accepted; forgotten with the session."""

    def __init__(self) -> None:
        self.at: weakref.WeakKeyDictionary[ConnectionState, float] = (
            weakref.WeakKeyDictionary())
        self.count = 0  # pushes accepted since start, for the history

    def __call__(self, conn: ConnectionState, instance: ClientInstance, payload: bytes) -> None:
        self.at[conn] = time.time()
        self.count += 1


ClientKey = tuple[str, str, str, str]  # source address, client id, software name, version


def client_key(conn: ConnectionState) -> ClientKey:
    info = conn.info
    return (info.source_address, _text(info.client_id), _text(info.software_name),
            _text(info.software_version))


class MetadataVersions:
    """The Metadata version each client last used, kept past its connections.

    A client often sends Metadata on its bootstrap connection only, which it closes once
    it knows the brokers; its broker connections still belong to a v13 client. Bounded:
    the least recently updated client is forgotten first.
    """

    def __init__(self, max_clients: int = 10_000) -> None:
        self.max_clients = max_clients
        self.versions: OrderedDict[ClientKey, int] = OrderedDict()

    def connection_closed(self, conn: ConnectionState) -> None:
        version = conn.api_versions_used.get(api_keys.METADATA)
        if version is not None:
            key = client_key(conn)
            self.versions[key] = version
            self.versions.move_to_end(key)
            while len(self.versions) > self.max_clients:
                self.versions.popitem(last=False)

    def of(self, conn: ConnectionState) -> int | None:
        used = conn.api_versions_used.get(api_keys.METADATA)
        return used if used is not None else self.versions.get(client_key(conn))


@dataclass
class _Memory:
    pushes: PushTimes = field(default_factory=PushTimes)
    metadata: MetadataVersions = field(default_factory=MetadataVersions)
    history: History = field(default_factory=History)


_memory: weakref.WeakKeyDictionary[Proxy, _Memory] = weakref.WeakKeyDictionary()


def routes(proxy: Proxy) -> dict[str, Handler]:
    """``/`` (HTML) and ``/status.json``; from now on, also notes telemetry push times and
    the Metadata versions of connections that close."""
    if proxy not in _memory:
        memory = _memory[proxy] = _Memory()
        proxy.events.on_connection_closed.append(memory.metadata.connection_closed)
        if proxy.telemetry is not None:
            proxy.telemetry.push_notes.append(memory.pushes)  # plain Python: lane-safe

    cache: list[tuple[float, dict[str, Any]]] = []

    def recent() -> dict[str, Any]:
        # A snapshot walks every session: at most one a second, however often it is asked.
        now = time.monotonic()
        if not cache or now - cache[0][0] >= SNAPSHOT_TTL:
            cache[:] = [(now, snapshot(proxy))]
        return cache[0][1]

    async def page(req: HttpRequest) -> HttpResponse:
        if req.method not in ("GET", "HEAD"):
            return HttpResponse(405, b"use GET\n", headers=[("allow", "GET, HEAD")])
        return HttpResponse(200, render(recent()).encode(),
                            "text/html; charset=utf-8", [("cache-control", "no-store")])

    async def as_json(req: HttpRequest) -> HttpResponse:
        if req.method not in ("GET", "HEAD"):
            return HttpResponse(405, b"use GET\n", headers=[("allow", "GET, HEAD")])
        body = json.dumps(recent(), indent=1, sort_keys=True).encode() + b"\n"
        return HttpResponse(200, body, "application/json", [("cache-control", "no-store")])

    async def internal_sample(req: HttpRequest) -> HttpResponse:
        # A supervisor's history step: this worker's counters and its group facts.
        body: dict[str, Any] = {"sample": sample(proxy).to_json()}
        if proxy.groups is not None:
            body["groups"] = proxy.groups.facts(time.monotonic())
        return HttpResponse(200, json.dumps(body, separators=(",", ":")).encode(),
                            "application/json")

    return {"/": page, "/status.json": as_json, "/internal/sample": internal_sample}


def sample(proxy: Proxy) -> Sample:
    """This process's figures now, for a history step."""
    requests, bytes_in, bytes_out, latency = proxy.metrics.apis.totals()
    memory = _memory.get(proxy) or _Memory()
    return Sample(requests, bytes_in, bytes_out, memory.pushes.count, len(proxy.sessions),
                  latency)


async def record_history(proxy: Proxy) -> None:
    """One process on its own (not a worker: its supervisor keeps the whole proxy's):
    a history step every ``STEP`` seconds, for as long as the proxy runs."""
    memory = _memory.get(proxy)
    if memory is None:
        return
    while True:
        try:
            figures = [] if proxy.groups is None else proxy.groups.figures(time.monotonic())
            memory.history.record(time.time(), [sample(proxy)], figures)
        except Exception:  # a chart is never worth the proxy
            log.exception("status history step failed")
        await trio.sleep(STEP)


def snapshot(proxy: Proxy) -> dict[str, Any]:
    """Everything the status page shows, as plain JSON-ready data."""
    cfg = proxy.config
    ready, why = proxy.ready()
    memory = _memory.get(proxy) or _Memory()
    generation = int(_counter_values(proxy.metrics.config_reloads).get("applied", 0))
    clients = _clients(list(proxy.sessions), memory)
    now = time.time()
    # A worker's groups and history would be its share only: its supervisor shows the
    # whole proxy's from its own merge and ring, so a worker spends nothing on them.
    alone = proxy.admission.control is None
    groups = proxy.groups.status(time.monotonic(), now) if (
        proxy.groups is not None and alone) else None
    return {
        "generated_at": round(now, 3),
        "proxy": {
            "host": proxy.events.hostname, "version": __version__, "ready": ready,
            "ready_reason": why,
            "bootstrap": f"{cfg.listen[0]}:{proxy.bootstrap_port or cfg.listen[1]}",
            "advertised_host": cfg.advertised_host,
            # Reloads applied since start: equal on every worker once a SIGHUP reached all.
            "config_generation": generation,
        },
        "backend": _backend(proxy),
        "clients": clients,
        "telemetry": _telemetry(proxy),
        "filters": proxy.chain.describe(),
        "virtual_clusters": [vc.row(proxy.sessions) for vc in proxy.virtual_clusters],
        "limits": _limits(proxy),
        "groups": groups,
        "history": memory.history.as_json(
            [g["group_id"] for g in groups["listed"]] if groups else []) if alone else None,
        # One process: its own line (with --workers N the supervisor lists every worker).
        "workers": [{"index": 0, "pid": os.getpid(), "http_port": proxy.http_port,
                     "alive": True, "restarts": 0, "answered": True, "ready": ready,
                     "connections": clients["connections"], "config_generation": generation}],
    }


def _backend(proxy: Proxy) -> dict[str, Any]:
    state, backend = proxy.state, proxy.backend
    pm = state.port_map
    brokers = []
    for node_id, addr in sorted(state.view.nodes.items()):
        adv = pm.advertised(node_id) if pm.in_range(node_id) else None
        brokers.append({"node_id": node_id, "host": addr.host, "port": addr.port,
                        "advertised": f"{adv[0]}:{adv[1]}" if adv else None})
    last = backend.last_change
    return {
        "cluster_id": state.view.cluster_id, "topology_epoch": state.view.epoch,
        "brokers": brokers,
        "last_change": None if last is None else {
            "at": round(last[0], 3), "reason": last[1], "what": last[2][:1000]},
        "last_discovery_age_s": None if backend.last_discovery is None
        else round(time.monotonic() - backend.last_discovery, 1),
        "upstream": [f"{h}:{p}" for h, p in proxy.rotation.servers],
    }


def _text(value: str | None) -> str:
    return (value or "")[:MAX_TEXT]


@dataclass
class _Tally:
    """Connections that share a key (a software group, or one client within it)."""

    connections: int = 0
    v13: int = 0  # spoke Metadata v13 or newer: can be told to rebootstrap
    below_v13: int = 0
    telemetry: int = 0  # used GetTelemetrySubscriptions / PushTelemetry
    last_push: float | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    latency: list[list[int] | None] = field(default_factory=list)
    client_ids: dict[str, int] = field(default_factory=dict)
    sources: dict[str, int] = field(default_factory=dict)
    clients: dict[tuple[str, str], _Tally] = field(default_factory=dict)

    def add(self, s: Session, metadata: int | None, pushed: float | None,
            latency: list[int] | None) -> None:
        self.connections += 1
        if metadata is not None:
            if metadata >= BRIDGED_VERSION:
                self.v13 += 1
            else:
                self.below_v13 += 1
        used = s.conn.api_versions_used
        if api_keys.PUSH_TELEMETRY in used or api_keys.GET_TELEMETRY_SUBSCRIPTIONS in used:
            self.telemetry += 1
        if pushed is not None and (self.last_push is None or pushed > self.last_push):
            self.last_push = pushed
        self.bytes_in += s.bytes_in
        self.bytes_out += s.bytes_out
        self.latency.append(latency)

    def summary(self) -> dict[str, Any]:
        p99 = quantile(merge(self.latency), P99)
        known = self.v13 + self.below_v13
        return {
            "connections": self.connections,
            "metadata_v13": "unknown" if not known else "yes" if not self.below_v13
            else "no" if not self.v13 else "mixed",
            "v13_connections": self.v13, "below_v13_connections": self.below_v13,
            "telemetry": self.telemetry > 0, "telemetry_connections": self.telemetry,
            "last_push": None if self.last_push is None else round(self.last_push, 3),
            "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
            "p99_ms": None if p99 is None else round(p99 * 1000, 3),
        }


def _top(counts: dict[str, int], n: int) -> tuple[list[str], int]:
    ranked = sorted(counts, key=lambda k: (-counts[k], k))
    return ranked[:n], max(0, len(ranked) - n)


def _clients(sessions: Iterable[Session], memory: _Memory) -> dict[str, Any]:
    now = time.monotonic()
    groups: dict[tuple[str, str], _Tally] = {}
    total = 0
    for s in sessions:
        total += 1
        info = s.conn.info
        # No name: the client's ApiVersions request was below v3 (or not sent yet).
        key = (_text(info.software_name), _text(info.software_version))
        group = groups.setdefault(key, _Tally())
        pushed = memory.pushes.at.get(s.conn)
        metadata = memory.metadata.of(s.conn)
        latency = s.latency.counts(now)
        group.add(s, metadata, pushed, latency)
        cid, src = _text(info.client_id), info.source_address
        group.client_ids[cid] = group.client_ids.get(cid, 0) + 1
        group.sources[src] = group.sources.get(src, 0) + 1
        group.clients.setdefault((cid, src), _Tally()).add(s, metadata, pushed, latency)
    ranked = sorted(groups, key=lambda k: (-groups[k].connections, not k[0], k))
    listed = []
    for name, version in ranked[:MAX_GROUPS]:
        g = groups[(name, version)]
        ids, ids_more = _top(g.client_ids, MAX_VALUES)
        sources, sources_more = _top(g.sources, MAX_VALUES)
        by_traffic = sorted(g.clients, key=lambda k: (-(g.clients[k].bytes_in
                                                        + g.clients[k].bytes_out), k))
        listed.append({
            "software_name": name, "software_version": version, **g.summary(),
            "client_ids": ids, "client_ids_more": ids_more,
            "source_addresses": sources, "source_addresses_more": sources_more,
            "clients": [{"client_id": cid, "source_address": src, **g.clients[(cid, src)]
                         .summary()} for cid, src in by_traffic[:MAX_CLIENTS]],
            "clients_more": max(0, len(by_traffic) - MAX_CLIENTS),
        })
    return {"connections": total, "groups": listed,
            "groups_more": max(0, len(ranked) - MAX_GROUPS)}


def _counter_values(counter: Counter) -> dict[str, float]:
    """A one-label counter's values by label value."""
    out: dict[str, float] = {}
    for metric in counter.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.labels:
                out[next(iter(sample.labels.values()))] = sample.value
    return out


def _telemetry(proxy: Proxy) -> dict[str, Any]:
    service, cfg = proxy.telemetry, proxy.config
    out: dict[str, Any] = {"enabled": service is not None,
                           "prometheus": service is not None and cfg.telemetry.prometheus}
    if service is not None:
        out["client_instances"] = len(service.state.instances)
        out["series"] = service.store.total
        out["client_instances_evicted"] = sum(service.state.evicted.values())
    exporter = proxy.otlp
    if exporter is not None:
        parts = urllib.parse.urlsplit(cfg.telemetry_otlp_endpoint or "")
        netloc = parts.netloc.rpartition("@")[2]  # never show user:password
        out["otlp"] = {
            "endpoint": urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", "")),
            "outcomes": {k: int(v) for k, v in _counter_values(exporter.outcomes).items()},
            "queued_bytes": exporter.queue.bytes, "queued_pushes": len(exporter.queue),
            "retrying": exporter.in_flight is not None and exporter.in_flight.attempts > 0,
        }
    return out


def _limits(proxy: Proxy) -> list[dict[str, Any]]:
    """Each limit: its value, what is in use now where that is known, and hits so far."""
    cfg = proxy.config
    hits = _counter_values(proxy.metrics.limits_hit)
    busiest_source = max(proxy.admission.by_source.values(), default=0)
    paused = sum(1 for s in proxy.sessions if len(s.ordered) >= cfg.max_inflight)
    rows: list[tuple[str, float, float | None]] = [
        ("max_connections", proxy.admission.max_connections, proxy.admission.open),
        ("max_connections_per_source", cfg.max_connections_per_source, busiest_source),
        ("max_inflight", cfg.max_inflight, paused),
        ("idle_timeout", cfg.idle_timeout, None),
        ("first_request_timeout", cfg.first_request_timeout, None),
        ("tls_handshake_timeout", cfg.tls_handshake_timeout, None),
        ("max_frame_bytes", cfg.max_frame_bytes, None),
    ]
    service = proxy.telemetry
    if service is not None:
        rows.append(("telemetry.max_series", cfg.telemetry.max_series, service.store.total))
        rows.append(("telemetry.max_instances", cfg.telemetry.settings.max_instances,
                     len(service.state.instances)))
    if proxy.otlp is not None:
        rows.append(("telemetry.otlp.max_queue_bytes", cfg.telemetry_otlp_max_queue_bytes,
                     proxy.otlp.queue.bytes))
    out = []
    for name, limit, in_use in rows:
        # max_inflight counts paused sessions; the others count what is held against limit.
        at_limit = (in_use is not None and in_use > 0) if name == "max_inflight" else (
            in_use is not None and in_use >= limit)
        out.append({"limit": name, "value": limit, "in_use": in_use,
                    "hits": int(hits.get(name, 0)), "hit_now": at_limit})
    for name, count in sorted(hits.items()):  # limits counted that have no row above
        if not any(r["limit"] == name for r in out):
            out.append({"limit": name, "value": None, "in_use": None, "hits": int(count),
                        "hit_now": False})
    return out
