"""The proxy process: wires the services together and serves the listeners.

``Proxy`` builds what sessions share (``SessionServices``: the policy state, the
handler table, the memory budget, the upstream connector, event reporting, the
backend watch), opens the bootstrap listener and the HTTP endpoint, runs discovery,
and accepts connections: admission, TLS (and SNI routing), then one ``Session`` per
connection (``kproxy.runtime.accepting``). Signals, reload and drain are
``kproxy.runtime.lifecycle``'s; per-broker listeners ``kproxy.runtime.broker_listeners``';
HTTP routes ``kproxy.http.routes``'.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import trio
from prometheus_client import Gauge

from kproxy.archive import ArchiveCollector, ArchiveSettings, ArchiveWriter
from kproxy.auth.admin_token import AdminToken
from kproxy.auth.audit import DenialReporter, open_audit
from kproxy.auth.jwks import JwksCache
from kproxy.auth.logins import derive_password_keys, sasl_settings
from kproxy.codecs import api_keys
from kproxy.config.settings import Config
from kproxy.context import SessionServices
from kproxy.http import status
from kproxy.http.auth import guard
from kproxy.http.routes import routes
from kproxy.http.server import Handler, HttpServer
from kproxy.logs import RateLimitedLog
from kproxy.memory import MemoryBudget
from kproxy.metrics.exposition import Exposition
from kproxy.metrics.group_merge import group_facts
from kproxy.metrics.groups import GroupService
from kproxy.metrics.proxy_metrics import ProxyMetrics
from kproxy.metrics.telemetry_merge import telemetry_facts
from kproxy.metrics.worker_merge import facts_route
from kproxy.policies.api_versions import default_caps
from kproxy.policies.auth.handlers import make_gate, sasl_handlers
from kproxy.policies.auth.quotas import Quotas
from kproxy.policies.filters.chain import BuiltinFilter, DecisionCounts, FilterChain
from kproxy.policies.groups import GroupLimits
from kproxy.policies.handlers import LocalHandler, builtin_filters
from kproxy.policies.proxy_state import ProxyState
from kproxy.runtime import accepting, lifecycle
from kproxy.runtime.admission import Admission
from kproxy.runtime.backend_watch import BackendWatch
from kproxy.runtime.broker_listeners import BrokerListeners
from kproxy.runtime.listeners import inherited_listener, open_listeners
from kproxy.runtime.tls import server_context, upstream_context
from kproxy.runtime.upstream import AddressCache, BootstrapRotation, UpstreamConnector
from kproxy.runtime.virtual_clusters import VirtualCluster, VirtualClusterCollector
from kproxy.session.events import SessionEvents
from kproxy.session.parked.express import call_in_trio
from kproxy.session.parked.parking import ParkingLot
from kproxy.session.session import Session
from kproxy.supervisor import worker_link
from kproxy.telemetry import otlp_export
from kproxy.telemetry.service import TelemetryService

log = logging.getLogger("kproxy")


class Proxy:
    """Owns the sockets. ``run`` returns after a drain (SIGTERM/SIGINT or ``shutdown``)."""

    def __init__(self, config: Config, metrics: ProxyMetrics | None = None,
                 reload_config: Callable[[], Config] | None = None,
                 local_handlers: dict[int, LocalHandler] | None = None) -> None:
        self.config = config
        self.reload_config = reload_config
        self.config_file = lifecycle.ConfigFile(config.source) if config.source else None
        self.metrics = metrics = metrics or ProxyMetrics()
        self.ratelog = RateLimitedLog()
        self.state = ProxyState(config.port_map, config.legacy_clients, config.require_sasl,
                                list(config.upstream), served_apis=served_apis(config),
                                api_caps=api_caps(config))
        self.audit = open_audit(config.audit_log, config.audit_log_max_bytes,
                                config.audit_log_backups, "proxy")
        self.jwks: JwksCache | None = None
        if config.sasl_terminate and config.sasl_oauthbearer_jwks_url:
            self.jwks = JwksCache(config.sasl_oauthbearer_jwks_url,
                                  config.sasl_oauthbearer_jwks_refresh)
        self.sasl_settings = sasl_settings(config, self.jwks)
        if config.sasl_terminate:
            self.state.sasl_gate = make_gate(time.monotonic)
        self.archive: ArchiveWriter | None = None
        if config.archive:
            self.archive = ArchiveWriter(ArchiveSettings(
                Path(config.archive), config.archive_max_file_bytes,
                config.archive_max_file_seconds, config.archive_max_total_bytes,
                config.archive_queue_records))
            metrics.registry.register(ArchiveCollector(self.archive))
        local: dict[int, LocalHandler] = {}
        self.telemetry: TelemetryService | None = None
        if config.telemetry.enabled:
            self.telemetry = TelemetryService(config.telemetry, metrics, archive=self.archive,
                                              in_trio=call_in_trio)
            local[api_keys.GET_TELEMETRY_SUBSCRIPTIONS] = self.telemetry.handle_get
            local[api_keys.PUSH_TELEMETRY] = self.telemetry.handle_push
        local.update(local_handlers or {})  # tests stand in their own answers
        self.rotation = BootstrapRotation(config.upstream, upstream_context(config),
                                          config.identity.upstream_login,
                                          AddressCache(config.upstream_dns_ttl))
        self.events = events = SessionEvents(metrics, self.ratelog, self.archive)
        self.backend = BackendWatch(self.state, metrics, self.ratelog, self.rotation,
                                    config.node_id_range)
        self.budget = MemoryBudget(config.max_buffered_bytes)
        self.groups: GroupService | None = None
        if config.group_tracking:
            self.groups = GroupService(GroupLimits(config.group_max_groups,
                                                   config.group_max_members), metrics,
                                       self.archive)
        # Idle sessions wait here without a task (kproxy.session.parked.parking); a reload's
        # idle timeout applies to them too.
        self.parking = ParkingLot(lambda: self.config.idle_timeout, config.express_lane)
        # The filter chain: the built-in filters, then default_filters (rebuilt at a reload).
        self.builtins = builtin_filters(local, self.groups.watch if self.groups else None)
        if config.sasl_terminate:
            self.builtins.append(BuiltinFilter(
                "sasl-terminate", sasl_handlers(lambda: self.sasl_settings, self.audit_record),
                "clients log in at the proxy: SaslHandshake and SaslAuthenticate answered "
                "here, nothing else before a login"))
        self.filter_counts = DecisionCounts()
        # Denied operations: counted as the acl filter's "denied" decisions, audited
        # within a rate bound.
        self.acl_denials = DenialReporter(self.audit_record,
                                          lambda: self.filter_counts.add("acl", "denied"))
        metrics.watch_filters(lambda: self.filter_counts.counts)
        self.chain = self._chain(config)
        self.services = SessionServices(
            config, metrics, self.state, self.chain.handlers, self.budget,
            UpstreamConnector(self.state, self.rotation, config.connect_timeout, events),
            events, self.backend, self.parking,
            Quotas(config.quotas, config.quota_window_samples, config.quota_window_seconds))
        self.sessions: set[Session] = set()  # open ones, parked ones included
        self.backend.sessions_of = lambda: [(s.conn, s.end_at_next_request)
                                            for s in self.sessions]
        self.listeners = BrokerListeners(config, self.state, metrics, self.ratelog)
        self.backend.watchers.append(self.listeners)
        # Virtual clusters: their own listeners, port maps and chains over this backend.
        self.virtual_clusters = [
            VirtualCluster(vc, config, self.services, self.builtins, self.filter_counts,
                           api_caps(config)) for vc in config.virtual_clusters]
        for vcluster in self.virtual_clusters:
            self.backend.watchers.append(vcluster.listeners)
        if self.virtual_clusters:
            metrics.registry.register(VirtualClusterCollector(
                lambda: self.virtual_clusters, lambda: self.sessions))
        self.admission = Admission(config, metrics, self.ratelog)  # counted at accept
        self.exposition = Exposition(metrics.registry, metrics.piece_sources)
        metrics.watch_budget(self.budget)
        Gauge("kproxy_ready", "1 while /readyz answers 200: the backend answered discovery "
              "recently and the proxy is not draining", registry=metrics.registry,
              ).set_function(lambda: 1.0 if self.ready()[0] else 0.0)
        Gauge("kproxy_connections_parked", "Client connections parked: sockets and state "
              "kept, no task of their own; idle ones, and busy ones the express lane relays",
              registry=metrics.registry).set_function(lambda: float(len(self.parking)))
        self.server_tls = server_context(config)
        self.otlp = otlp_export.install(self)
        self.bootstrap_port: int | None = None
        self.http_port: int | None = None
        self.http_fd: int | None = None  # a worker's HTTP listener, opened by its supervisor
        self._stop = trio.Event()
        self.started = trio.Event()  # listening, the backend discovered once
        self.reload_lock = trio.Lock()  # reloads one at a time (lifecycle.reload)
        self.sessions_nursery: trio.Nursery | None = None
        self._bootstrap_scope = trio.CancelScope()

    def set_config(self, new: Config) -> None:
        """A reloaded configuration: new connections and the services use it from now on."""
        self.config = self.services.config = self.listeners.config = new
        self.state.reconfigure(new.legacy_clients, new.require_sasl, new.upstream)
        self.sasl_settings = sasl_settings(new, self.jwks)
        self.rotation.servers = list(new.upstream)
        self.rotation.login = new.identity.upstream_login
        if self.rotation.names is not None:
            self.rotation.names.reconfigure(new.upstream_dns_ttl)
        self.services.connector.timeout = new.connect_timeout
        self.admission.config = new
        self.budget.limit = new.max_buffered_bytes
        self.parking.reconfigured()
        self.services.quotas.reconfigure(new.quotas, new.quota_window_samples,
                                         new.quota_window_seconds)
        # Filters apply to open connections too: their next frame goes through the new
        # chain (a response already awaited keeps its follow-up, held by the connection).
        self.chain = self._chain(new)
        self.services.handlers = self.chain.handlers
        # Listeners and prefixes are start-only (a reload changing them is rejected).
        for vcluster, settings in zip(self.virtual_clusters, new.virtual_clusters,
                                      strict=True):
            vcluster.reconfigure(new, settings, api_caps(new))
        for session in self.sessions:
            session.conn.set_handlers(session.services.handlers)

    def _chain(self, config: Config) -> FilterChain:
        if config.filters.acl is not None:
            config.filters.acl.on_deny = self.acl_denials
        chain = FilterChain(self.builtins, config.filters.main_chain(), self.filter_counts)
        self.state.api_caps = chain.caps(api_caps(config))
        return chain

    def shutdown(self) -> None:
        self._stop.set()

    async def reload(self) -> bool:
        """Re-read the configuration (as SIGHUP does); False when it was rejected."""
        return await lifecycle.reload(self)

    async def run(self, *, handle_signals: bool = True,
                  task_status: trio.TaskStatus[Proxy] = trio.TASK_STATUS_IGNORED) -> None:
        await self.admission.plan(self.config)
        await derive_password_keys(self.config)  # before any login can need them
        if self.telemetry is not None:  # small pushes are charged in the lane's thread too
            self.telemetry.pacer.clock = trio.lowlevel.current_clock().current_time
        if self.archive is not None:
            self.archive.start()
        try:
            await self._run(handle_signals, task_status)
        finally:
            if self.telemetry is not None:
                await self.telemetry.vetting.aclose()
            if self.archive is not None:
                await trio.to_thread.run_sync(self.archive.close)

    async def _run(self, handle_signals: bool, task_status: trio.TaskStatus[Proxy]) -> None:
        cfg = self.config
        async with trio.open_nursery() as services:
            if handle_signals:
                # Before the first listener opens: a SIGTERM while start-up is still
                # discovering the backend drains, where it used to kill the process.
                services.start_soon(lifecycle.handle_signals, self)
            if self.admission.control is not None and self.admission.budget is not None:
                services.start_soon(self.admission.control.run,
                                    self.admission.budget.connections)
            async with trio.open_nursery() as sessions:
                self.sessions_nursery = sessions
                sessions.start_soon(self.parking.run, sessions)
                self.listeners.start(services, self._serve)
                host, port = cfg.listen
                bootstrap = await open_listeners(host, port, cfg.reuse_port)
                self.bootstrap_port = bootstrap[0].socket.getsockname()[1]
                sni = self.state.port_map.sni
                if sni is not None and sni.port == 0:  # listening on a port picked by the OS
                    self.state.serve_sni_on(self.bootstrap_port)
                services.start_soon(self._serve, bootstrap, "bootstrap", None,
                                    self._bootstrap_scope)
                for vcluster in self.virtual_clusters:
                    await self._open_virtual_cluster(vcluster, services)
                http = (await trio.open_tcp_listeners(cfg.http[1], host=cfg.http[0])
                        if self.http_fd is None else [inherited_listener(self.http_fd)])
                self.http_port = http[0].socket.getsockname()[1]
                secret = worker_link.worker_secret()  # a worker's: its supervisor's calls
                token = AdminToken(cfg.admin_token_file, cfg.identity.admin_token,
                                   None if secret else self.audit_record)  # audited once
                services.start_soon(trio.serve_listeners, HttpServer(guard(
                    {**routes(self), "/internal/facts": self._facts()}, token.current,
                    cfg.status_auth, self.audit_record, secret)).handle, http)
                services.start_soon(token.watch)
                await self.discover_once()
                services.start_soon(self._discovery_loop)
                if self.otlp is not None:
                    services.start_soon(self.otlp.run)
                if self.jwks is not None:
                    services.start_soon(self.jwks.run)
                if self.admission.control is None:  # a worker's supervisor keeps its own
                    services.start_soon(status.record_history, self)
                if self.config_file is not None and cfg.config_watch_interval > 0:
                    services.start_soon(lifecycle.watch_config, self, self.config_file)
                log.info("kproxy listening", extra={"fields": {
                    "bootstrap": f"{host}:{self.bootstrap_port}",
                    "advertised_host": cfg.advertised_host,
                    "broker_ports": f"{cfg.broker_port_base}+(node_id-{cfg.node_id_range[0]})",
                    "http": f"{cfg.http[0]}:{self.http_port}",
                    "max_buffered_bytes": cfg.max_buffered_bytes,
                    "upstream": ",".join(f"{h}:{p}" for h, p in cfg.upstream)}})
                self.started.set()
                task_status.started(self)
                await self._stop.wait()
                await lifecycle.drain(self)
                sessions.cancel_scope.cancel()
            services.cancel_scope.cancel()
        log.info("kproxy stopped")

    def close_listeners(self) -> None:
        self._bootstrap_scope.cancel()
        self.listeners.close_all()
        for vcluster in self.virtual_clusters:
            vcluster.bootstrap_scope.cancel()
            vcluster.listeners.close_all()

    async def _open_virtual_cluster(self, vcluster: VirtualCluster,
                                    nursery: trio.Nursery) -> None:
        """Its bootstrap listener now (a port in use stops start-up, as the main one
        does); its broker listeners follow the backend view."""
        serve = partial(self._serve, services=vcluster.services, vcluster=vcluster)
        vcluster.listeners.start(nursery, serve)
        host, port = vcluster.settings.listen
        bootstrap = await open_listeners(host, port, self.config.reuse_port)
        vcluster.bootstrap_port = bootstrap[0].socket.getsockname()[1]
        nursery.start_soon(serve, bootstrap, vcluster.name, None, vcluster.bootstrap_scope)
        log.info("virtual cluster listening", extra={"fields": {
            "virtual_cluster": vcluster.name, "prefix": vcluster.settings.prefix,
            "bootstrap": f"{host}:{vcluster.bootstrap_port}",
            "broker_ports": f"{vcluster.settings.broker_bind_port_base}"
                            f"+(node_id-{self.config.node_id_range[0]})"}})

    # ------------------------------------------------------------------ accepting

    async def _serve(self, listeners: list[trio.SocketListener], name: str, node_id: int | None,
                     scope: trio.CancelScope, services: SessionServices | None = None,
                     vcluster: VirtualCluster | None = None) -> None:
        await accepting.serve(self, listeners, name, node_id, scope, services, vcluster)

    def session_ended(self, session: Session) -> None:
        self.sessions.discard(session)
        if session.services is not self.services:
            for vcluster in self.virtual_clusters:
                if session.services is vcluster.services:
                    vcluster.ended(session)
        self.admission.release(session.conn.info.source_address)

    # ------------------------------------------------------------------ discovery

    async def discover_once(self) -> bool:
        return await self.backend.discover_once(self.config.connect_timeout,
                                                self.config.max_frame_bytes)

    async def _discovery_loop(self) -> None:
        try:
            while True:
                await trio.sleep(self.config.discovery_interval)
                await self.discover_once()
        finally:
            await self.backend.discovery.aclose()

    def audit_record(self, fields: dict[str, object]) -> None:
        """A security event: counted, and appended to the audit log when there is one."""
        if fields.get("event") in ("login", "reauthentication"):
            self.metrics.sasl_logins.labels(str(fields.get("mechanism") or ""),
                                            str(fields.get("outcome"))).inc()
        if self.audit is not None:
            self.audit.record(fields)

    def _facts(self) -> Handler:
        """``/internal/facts``: what a supervisor merges over workers (``worker_merge``)."""
        groups, tele = self.groups, self.telemetry
        return facts_route(
            (lambda: group_facts(groups.tracker, time.monotonic())) if groups else None,
            (lambda: telemetry_facts(tele.state)) if tele else None)

    def ready(self) -> tuple[bool, str]:
        last = self.backend.last_discovery
        if self._stop.is_set():
            return False, "draining"
        if last is None:
            return False, "backend not reached yet"
        now = time.monotonic()
        stale_after = max(3 * self.config.discovery_interval, 30.0)
        if now - last > stale_after:
            return False, f"backend not reached for {now - last:.0f}s"
        return True, f"{len(self.state.view.nodes)} broker(s) known"


def served_apis(config: Config) -> dict[int, tuple[int, int]]:
    """APIs the proxy answers itself, as advertised in ApiVersions: key -> (min, max)."""
    served: dict[int, tuple[int, int]] = {}
    if config.sasl_terminate:  # v0 handshakes are refused with a clear reason
        served[api_keys.SASL_HANDSHAKE] = (0, 1)
        served[api_keys.SASL_AUTHENTICATE] = (0, 2)
    if config.telemetry.enabled:
        # Both keys, always together: a client only pushes when it sees both.
        served[api_keys.GET_TELEMETRY_SUBSCRIPTIONS] = (0, 0)
        served[api_keys.PUSH_TELEMETRY] = (0, 0)
    return served


def api_caps(config: Config) -> dict[int, int]:
    """The highest version advertised per API the proxy decodes (and Fetch's, if capped)."""
    caps = default_caps()
    if config.max_fetch_version is not None:
        caps[api_keys.FETCH] = min(caps[api_keys.FETCH], config.max_fetch_version)
    return caps
