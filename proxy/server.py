"""The proxy process: listeners, sessions, discovery, HTTP endpoint, signals, drain.

``ProxyContext`` is what sessions share: configuration, metrics, the backend view
and the hooks that decode and rewrite. ``Proxy.run`` wires it to sockets.
"""

from __future__ import annotations

import hashlib
import logging
import signal
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio
from prometheus_client import Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kproxy.admission import Admission
from kproxy.archive import KINDS, ArchiveSettings, ArchiveWriter
from kproxy.codecs import api_keys
from kproxy.codecs.errors import CodecError
from kproxy.codecs.framing import FrameTooLarge
from kproxy.codecs.messages import (
    decode_request,
    decode_response,
    encode_response,
    encode_response_parts,
)
from kproxy.codecs.peek import RequestPeek
from kproxy.config import Config, ConfigError
from kproxy.discovery import discover
from kproxy.exposition import Exposition
from kproxy.http_server import Handler, HttpRequest, HttpResponse, HttpServer
from kproxy.inflight import Slot
from kproxy.listeners import open_listeners
from kproxy.local_answers import api_versions_too_new
from kproxy.logs import RateLimitedLog
from kproxy.metrics import ProxyMetrics
from kproxy.policies.api_versions import (
    bridge_metadata_version,
    cap_api_versions,
    default_caps,
)
from kproxy.policies.metadata_bridge import (
    BACKEND_VERSION,
    BRIDGED_VERSION,
    downgrade_request,
    needs_bridge,
)
from kproxy.policies.rebootstrap import REBOOTSTRAP_REQUIRED, Action, RebootstrapPolicy
from kproxy.policies.rewrite import (
    METADATA_OPAQUE,
    Seen,
    rewrite_metadata,
    rewrite_response_frame,
)
from kproxy.policies.rewrite_cache import CachedRewrite, RewriteCache, RewriteKey
from kproxy.policies.topology import BackendView, Change
from kproxy.session import LocalHandler, Session, SessionClosed
from kproxy.telemetry import TelemetryService
from kproxy.tls import HandshakeFailed, accept_tls, server_context, upstream_context
from kproxy.upstream import BootstrapRotation, UpstreamUnavailable, connect

log = logging.getLogger("kproxy")


class ProxyContext:
    def __init__(self, config: Config, metrics: ProxyMetrics) -> None:
        self.config = config
        self.port_map = config.port_map
        self.metrics = metrics
        self.view = BackendView()
        self.upstream_tls = upstream_context(config)
        self.rotation = BootstrapRotation(config.upstream, self.upstream_tls)
        self.local_handlers: dict[int, LocalHandler] = {}
        # APIs the proxy serves itself, advertised in ApiVersions: key -> (min, max).
        self.served_apis: dict[int, tuple[int, int]] = {}
        self.api_caps = default_caps()
        self.sessions: set[Session] = set()
        self.ratelog = RateLimitedLog()
        self.hostname = socket.gethostname()
        self.on_view_change: list[Callable[[], Any]] = []
        self.last_discovery: float | None = None
        self.rebootstrap = RebootstrapPolicy(config.legacy_clients)
        self.archive: ArchiveWriter | None = None
        self.backend_metadata_max: int | None = None  # from the last ApiVersions relayed
        self.rewrites = RewriteCache()  # Metadata responses already rewritten

    # ------------------------------------------------------------------ upstream

    async def connect_upstream(self, session: Session) -> trio.abc.Stream | None:
        timeout = self.config.connect_timeout
        try:
            if session.node_id is None:
                stream, session.upstream_address = await self.rotation.connect(timeout)
                return stream
            addr = self.view.address_of(session.node_id)
            if addr is None:
                raise UpstreamUnavailable([(("?", 0), f"node {session.node_id} is not a "
                                            "known broker")])
            session.upstream_address = (addr.host, addr.port)
            try:
                return await connect(addr.host, addr.port, timeout, self.upstream_tls)
            except trio.TooSlowError:
                raise UpstreamUnavailable([((addr.host, addr.port),
                                            f"no answer within {timeout:g}s")]) from None
            except OSError as exc:
                raise UpstreamUnavailable([((addr.host, addr.port),
                                            exc.strerror or str(exc))]) from None
        except UpstreamUnavailable as exc:
            self.metrics.upstream_connect_failures.labels(session.listener).inc()
            self.ratelog(logging.WARNING, f"connect:{session.listener}",
                         "cannot reach the backend; closing the client connection",
                         listener=session.listener, tried=str(exc))
            return None

    def connection_closed(self, session: Session) -> None:
        """One inventory record per client connection, for the fleet pipeline."""
        if self.archive is None or not session.api_versions_used:
            return
        used = session.api_versions_used
        metadata = used.get(api_keys.METADATA)
        info = session.info
        self.archive.connection({
            "ts": round(time.time(), 3), "opened": round(session.opened_at, 3),
            "proxy": self.hostname, "listener": session.listener,
            "client_id": info.client_id, "client_software_name": info.software_name,
            "client_software_version": info.software_version,
            "source_address": info.source_address, "source_port": info.source_port,
            "apis": {api_keys.api_name(k): v for k, v in sorted(used.items())},
            "metadata_max_version": metadata,
            "supports_metadata_v13": None if metadata is None else metadata >= BRIDGED_VERSION,
            "telemetry": api_keys.PUSH_TELEMETRY in used
            or api_keys.GET_TELEMETRY_SUBSCRIPTIONS in used,
            "bytes_in": session.bytes_in, "bytes_out": session.bytes_out,
        })

    def upstream_lost(self, session: Session, reason: str) -> None:
        self.metrics.upstream_disconnects.labels(session.listener).inc()
        self.ratelog(logging.WARNING, f"lost:{session.listener}",
                     "backend connection lost; closing the client connection",
                     listener=session.listener, reason=reason)

    def limit_hit(self, limit: str, msg: str, session: Session) -> None:
        """Count a limit reached by a session; log it at most once per interval."""
        self.metrics.limits_hit.labels(limit).inc()
        self.ratelog(logging.INFO, f"limit:{limit}", msg, limit=limit, **session._fields())

    def decode_error(self, side: str, what: str, exc: CodecError, session: Session) -> None:
        if isinstance(exc, FrameTooLarge):
            self.limit_hit("max_frame_bytes", f"{side} frame over max_frame_bytes; "
                           "connection closed", session)
        self.metrics.decode_errors.labels(what, side).inc()
        self.ratelog(logging.WARNING, f"decode:{side}:{what}",
                     f"undecodable {side}; closing the connection", error=str(exc),
                     **session._fields())

    # ------------------------------------------------------------------ requests

    def answer_locally(self, session: Session, peek: RequestPeek,
                       frame: memoryview) -> bytes | None:
        if peek.api_key == api_keys.API_VERSIONS:
            too_new = api_versions_too_new(peek)
            if too_new is not None:
                return too_new
            if peek.api_version >= 3:
                try:
                    body = decode_request(frame).body
                    session.info.software_name = body.get("client_software_name")
                    session.info.software_version = body.get("client_software_version")
                except CodecError as exc:  # the broker will answer it with an error
                    log.debug("unreadable ApiVersions request: %s", exc)
        elif peek.api_key == api_keys.SASL_HANDSHAKE and peek.api_version == 0:
            # v0 is followed by raw SASL tokens that are not Kafka requests; a proxy
            # that reads request headers cannot follow them.
            self.ratelog(logging.WARNING, "sasl-v0", "SaslHandshake v0 (raw SASL tokens) "
                         "is not supported; the client must use SaslHandshake v1 and "
                         "SaslAuthenticate (Kafka 1.0+ clients do)", **session._fields())
            raise SessionClosed("SaslHandshake v0")
        handler = self.local_handlers.get(peek.api_key)
        if handler is None:
            return None
        if self.config.require_sasl and not session.authenticated:
            # A broker with SASL closes a connection whose first requests are not
            # ApiVersions or the SASL exchange; the proxy does the same for the
            # requests it answers itself, which never reach the broker.
            self.metrics.unauthenticated.labels(api_keys.api_name(peek.api_key)).inc()
            self.ratelog(logging.WARNING, "unauthenticated", "request before SASL "
                         "authentication; connection closed", api=api_keys.api_name(
                             peek.api_key), **session._fields())
            raise SessionClosed("request before SASL authentication")
        return handler(session, peek, frame)

    # ------------------------------------------------------------------ responses

    def bridge_metadata_request(self, session: Session, peek: RequestPeek,
                                frame: bytes) -> tuple[bytes, int]:
        """Send a v13 Metadata request as v12 when the backend stops at v12."""
        backend_max = session.backend_metadata_max or self.backend_metadata_max
        if peek.api_version == BRIDGED_VERSION and (backend_max is None
                                                    or needs_bridge(peek.api_version,
                                                                    backend_max)):
            return downgrade_request(frame), BACKEND_VERSION
        return frame, peek.api_version

    async def rewrite_response(self, session: Session, slot: Slot,
                               frame: memoryview) -> bytes | memoryview:
        if slot.api_key == api_keys.API_VERSIONS:
            return self._rewrite_api_versions(session, slot, frame)
        if slot.api_key == api_keys.METADATA:
            return await self._rewrite_metadata(session, slot, frame)
        result = rewrite_response_frame(slot.api_key, slot.api_version, frame, self.port_map)
        await self.observe(result.seen, session)
        return result.frame if result.frame is not None else frame

    async def _rewrite_metadata(self, session: Session, slot: Slot,
                                frame: memoryview) -> bytes:
        if session.topology_epoch is None:
            session.topology_epoch = self.rebootstrap.epoch_for_new_connection(
                session.client_key)
        action, _ = self.rebootstrap.metadata_response(session.client_key,
                                                       session.topology_epoch, slot.api_version)
        rewritten = self._rewritten_metadata(slot, frame, inject=action is Action.INJECT)
        await self.observe(rewritten.seen, session)
        # This response is the client's view from now on (even if it just moved the epoch).
        session.topology_epoch = self.view.epoch
        self.rebootstrap.remember(session.client_key, self.view.epoch)
        if action is not Action.NONE:
            self.metrics.rebootstrap.labels(
                {Action.INJECT: "injected", Action.CLOSE: "legacy_closed",
                 Action.IGNORE: "legacy_ignored"}[action]).inc()
            log.info("client told to bootstrap again" if action is Action.INJECT else
                     f"legacy client below Metadata v13: {action.value}",
                     extra={"fields": {**session._fields(), "epoch": self.view.epoch}})
        if action is Action.CLOSE:
            session.close_after_flush = True
        return bytes(frame[:4]) + rewritten.tail  # the client's correlation id, then the rest

    def _rewritten_metadata(self, slot: Slot, frame: memoryview, inject: bool) -> CachedRewrite:
        """The rewritten response after its correlation id; from the cache unless injecting."""
        key = None
        if not inject and len(frame) <= self.rewrites.max_entry_bytes:
            key = RewriteKey(bytes(frame[4:]), slot.upstream_version, slot.api_version,
                             self.port_map)
            if (hit := self.rewrites.get(key)) is not None:
                return hit
        resp = decode_response(frame, api_keys.METADATA, slot.upstream_version, METADATA_OPAQUE)
        seen = rewrite_metadata(resp.body, self.port_map)
        if slot.api_version >= BRIDGED_VERSION:
            resp.body["error_code"] = (REBOOTSTRAP_REQUIRED if inject
                                       else resp.body.get("error_code", 0))
        body = encode_response_parts(api_keys.METADATA, slot.api_version,
                                     resp.header.correlation_id, resp.body, resp.header.tagged)
        result = CachedRewrite(body[4:], seen)
        if key is not None:
            self.rewrites.put(key, result)
        return result

    def _rewrite_api_versions(self, session: Session, slot: Slot,
                              frame: memoryview) -> bytes | memoryview:
        try:
            resp = decode_response(frame, slot.api_key, slot.api_version)
        except CodecError:
            # A broker that does not know the requested version answers at v0 with
            # an error; relay that unchanged so the client retries lower.
            if decode_response(frame, slot.api_key, 0).body["error_code"] != 0:
                return frame
            raise
        backend_max = bridge_metadata_version(resp.body)
        if backend_max is not None:
            session.backend_metadata_max = self.backend_metadata_max = backend_max
        cap_api_versions(resp.body, self.api_caps, add=self.served_apis)
        return encode_response(resp)

    async def observe(self, seen: Seen, session: Session | None = None) -> None:
        if seen.out_of_range:
            self.metrics.node_out_of_range.inc(len(seen.out_of_range))
            first, last = self.config.node_id_range
            self.ratelog(logging.WARNING, "out-of-range",
                         "backend nodes outside --node-id-range left out of responses",
                         nodes=sorted(seen.out_of_range), node_id_range=f"{first}-{last}")
        if not seen.nodes and not seen.complete:
            return
        if session is not None and (
                session.connected_epoch < self.view.epoch
                or (seen.cluster_id and self.view.cluster_id
                    and seen.cluster_id != self.view.cluster_id)):
            # A connection opened before the last change may still reach the old
            # backend; discovery, not it, decides what the backend is now.
            return
        change = self.view.observe(seen.nodes, seen.cluster_id, seen.complete)
        if change is not None:
            await self.changed(change)
        self.metrics.brokers_known.set(len(self.view.nodes))
        for callback in self.on_view_change:
            await callback()

    async def changed(self, change: Change) -> None:
        """A new topology epoch: stale clients learn it, dead-end connections are closed."""
        reason = change.reason if change.reason != "backend" else (
            "cluster_id" if change.cluster_id else "brokers")
        log.info("backend changed: %s", change.describe(),
                 extra={"fields": {"epoch": change.epoch, "reason": reason}})
        self.metrics.topology_changes.labels(reason).inc()
        self.metrics.topology_epoch.set(change.epoch)
        self.rebootstrap.bump(change.epoch)
        servers = set(self.rotation.servers)
        for s in list(self.sessions):
            if s.connected_epoch >= change.epoch:
                continue
            gone = change.cluster_id is not None or (
                s.node_id in change.invalid_nodes if s.node_id is not None
                else s.upstream_address not in servers)
            if gone:
                # Its backend is not part of the cluster any more: let in-flight
                # requests finish, then close, so the client reconnects to the new one.
                self.metrics.rebootstrap.labels("upstream_gone").inc()
                s.stop_reading()
            elif (self.config.legacy_clients == "close" and s.metadata_version is not None
                  and s.metadata_version < BRIDGED_VERSION):
                self.metrics.rebootstrap.labels("legacy_closed").inc()
                s.stop_reading()


class Proxy:
    """Owns the sockets. ``run`` returns after a drain (SIGTERM/SIGINT or ``shutdown``)."""

    def __init__(self, config: Config, metrics: ProxyMetrics | None = None,
                 reload_config: Callable[[], Config] | None = None) -> None:
        self.config = config
        self.reload_config = reload_config
        self.ctx = ProxyContext(config, metrics or ProxyMetrics())
        self.ctx.on_view_change.append(self._sync_broker_listeners)
        Gauge("kproxy_ready", "1 while /readyz answers 200: the backend answered discovery "
              "recently and the proxy is not draining", registry=self.ctx.metrics.registry,
              ).set_function(lambda: 1.0 if self.ready()[0] else 0.0)
        if config.archive:
            self.ctx.archive = ArchiveWriter(ArchiveSettings(
                Path(config.archive), config.archive_max_file_bytes,
                config.archive_max_file_seconds, config.archive_max_total_bytes,
                config.archive_queue_records))
            self.ctx.metrics.registry.register(ArchiveCollector(self.ctx.archive))
        self.telemetry: TelemetryService | None = None
        if config.telemetry.enabled:
            self.telemetry = TelemetryService(config.telemetry, self.ctx.metrics,
                                              archive=self.ctx.archive)
            self.ctx.local_handlers[api_keys.GET_TELEMETRY_SUBSCRIPTIONS] = (
                self.telemetry.handle_get)
            self.ctx.local_handlers[api_keys.PUSH_TELEMETRY] = self.telemetry.handle_push
            # Both keys, always together: a client only pushes when it sees both.
            self.ctx.served_apis = {api_keys.GET_TELEMETRY_SUBSCRIPTIONS: (0, 0),
                                    api_keys.PUSH_TELEMETRY: (0, 0)}
        self.server_tls = server_context(config)
        self.admission = Admission(self.ctx)  # connection limits, counted at accept
        self.exposition = Exposition(self.ctx.metrics.registry, self.ctx.metrics.piece_sources)
        self.bootstrap_port: int | None = None
        self.http_port: int | None = None
        self._broker_scopes: dict[int, trio.CancelScope] = {}
        self._stop = trio.Event()
        self._sessions_nursery: trio.Nursery | None = None
        self._services: trio.Nursery | None = None
        self._bootstrap_scope = trio.CancelScope()

    def shutdown(self) -> None:
        self._stop.set()

    async def run(self, *, handle_signals: bool = True,
                  task_status: trio.TaskStatus[Proxy] = trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.config
        await self.admission.plan(cfg)
        if self.ctx.archive is not None:
            self.ctx.archive.start()
        try:
            await self._run(cfg, handle_signals, task_status)
        finally:
            if self.ctx.archive is not None:
                await trio.to_thread.run_sync(self.ctx.archive.close)

    async def _run(self, cfg: Config, handle_signals: bool,
                   task_status: trio.TaskStatus[Proxy]) -> None:
        async with trio.open_nursery() as services:
            self._services = services
            async with trio.open_nursery() as sessions:
                self._sessions_nursery = sessions
                host, port = cfg.listen
                bootstrap = await open_listeners(host, port, cfg.reuse_port)
                self.bootstrap_port = bootstrap[0].socket.getsockname()[1]
                sni = self.ctx.port_map.sni
                if sni is not None and sni.port == 0:  # listening on a port picked by the OS
                    self.ctx.port_map = replace(self.ctx.port_map,
                                                sni=replace(sni, port=self.bootstrap_port))
                services.start_soon(self._serve, bootstrap, "bootstrap", None,
                                    self._bootstrap_scope)
                http = await trio.open_tcp_listeners(cfg.http[1], host=cfg.http[0])
                self.http_port = http[0].socket.getsockname()[1]
                services.start_soon(trio.serve_listeners, HttpServer(self._routes()).handle,
                                    http)
                await self._discover_once()
                services.start_soon(self._discovery_loop)
                if handle_signals:
                    services.start_soon(self._signals)
                if cfg.source and cfg.config_watch_interval > 0:
                    services.start_soon(self._watch_config, cfg.source)
                log.info("kproxy listening", extra={"fields": {
                    "bootstrap": f"{host}:{self.bootstrap_port}",
                    "advertised_host": cfg.advertised_host,
                    "broker_ports": f"{cfg.broker_port_base}+(node_id-{cfg.node_id_range[0]})",
                    "http": f"{cfg.http[0]}:{self.http_port}",
                    "upstream": ",".join(f"{h}:{p}" for h, p in cfg.upstream)}})
                task_status.started(self)
                await self._stop.wait()
                await self._drain()
                sessions.cancel_scope.cancel()
            services.cancel_scope.cancel()
        log.info("kproxy stopped")

    async def _drain(self) -> None:
        log.info("draining: no new connections; waiting for in-flight requests",
                 extra={"fields": {"sessions": len(self.ctx.sessions),
                                   "timeout_s": self.config.drain_timeout}})
        self._bootstrap_scope.cancel()
        for scope in self._broker_scopes.values():
            scope.cancel()
        for s in list(self.ctx.sessions):
            s.stop_reading()
        with trio.move_on_after(self.config.drain_timeout) as timeout:
            for s in list(self.ctx.sessions):
                await s.done.wait()
        if timeout.cancelled_caught:
            log.warning("drain timeout: closing connections with requests still in flight",
                        extra={"fields": {"sessions": len(self.ctx.sessions)}})

    async def _signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                log.info("received %s", signal.Signals(signum).name)
                if signum == signal.SIGHUP:
                    await self.reload()
                    continue
                self.shutdown()
                return

    async def _watch_config(self, path: str) -> None:
        """Reload when the file's content changes (a ConfigMap update swaps a symlink)."""
        last = _fingerprint(path)
        while True:
            await trio.sleep(self.config.config_watch_interval or 5.0)
            now = _fingerprint(path)
            if now != last:
                last = now
                log.info("config file changed; reloading", extra={"fields": {"path": path}})
                await self.reload()

    async def reload(self) -> bool:
        """Re-read the configuration; a bad one is rejected and the running one kept."""
        if self.reload_config is None:
            log.warning("reload requested but this proxy was not started from a config")
            return False
        try:
            new = self.reload_config()
            # Certificates are read again, so a rotated certificate serves new connections.
            server_tls, upstream_tls = server_context(new), upstream_context(new)
        except ConfigError as exc:
            self.ctx.metrics.config_reloads.labels("rejected").inc()
            log.error("config reload rejected; keeping the running config",
                      extra={"fields": {"error": str(exc)}})
            return False
        self.server_tls = server_tls
        self.ctx.upstream_tls = self.ctx.rotation.tls = upstream_tls
        await self.apply(new)
        self.ctx.metrics.config_reloads.labels("applied").inc()
        return True

    async def apply(self, new: Config) -> None:
        old = self.config
        restart_only = [name for name in ("listen", "http", "reuse_port", "advertised_host",
                                          "broker_port_base", "broker_bind_host",
                                          "broker_bind_port_base", "node_id_range",
                                          "sni_host_pattern", "sni_advertised_port")
                        if getattr(old, name) != getattr(new, name)]
        if old.telemetry.enabled != new.telemetry.enabled:
            restart_only.append("telemetry")
        if restart_only:
            log.warning("changed options that take effect only after a restart: %s",
                        ", ".join(restart_only))
        if self.telemetry is not None and old.telemetry != new.telemetry:
            self.telemetry.reconfigure(new.telemetry)
            log.info("telemetry subscriptions reloaded",
                     extra={"fields": {"subscriptions": len(new.telemetry.settings.subscriptions)}})
        if old.upstream != new.upstream:
            self.ctx.rotation.servers = list(new.upstream)
            log.info("upstream bootstrap servers changed", extra={"fields": {
                "upstream": ",".join(f"{h}:{p}" for h, p in new.upstream)}})
        self.config = self.ctx.config = new
        self.ctx.rebootstrap.legacy_clients = new.legacy_clients
        if old.upstream != new.upstream:
            # A new bootstrap list is a trigger of its own, even when it leads to the
            # same cluster: sessions on servers no longer listed are closed.
            await self.ctx.changed(self.ctx.view.force("upstream_reconfigured"))
            await self._discover_once()

    # ------------------------------------------------------------------ listeners

    async def _serve(self, listeners: list[trio.SocketListener], name: str, node_id: int | None,
                     scope: trio.CancelScope) -> None:
        async def handle(stream: trio.SocketStream, peer: tuple[str, int], name: str) -> None:
            await self._serve_one(stream, peer, name, node_id)

        assert self._sessions_nursery is not None
        with scope:
            try:
                await self.admission.serve(listeners, name, handle, self._sessions_nursery)
            finally:
                for listener in listeners:
                    await trio.aclose_forcefully(listener)

    async def _serve_one(self, stream: trio.SocketStream, peer: tuple[str, int], name: str,
                         node_id: int | None) -> None:
        client: trio.abc.Stream = stream
        if self.server_tls is not None:
            try:
                client, server_name = await accept_tls(stream, self.server_tls,
                                                       self.config.tls_handshake_timeout)
            except HandshakeFailed as exc:
                limit = "tls_handshake_timeout" if exc.timed_out else None
                self.admission.refuse(limit, "tls_handshake",
                                      "TLS handshake failed; connection closed",
                                      peer, listener=name, error=str(exc))
                self.ctx.metrics.tls_handshake_failures.labels(name).inc()
                await trio.aclose_forcefully(stream)
                return
            sni = self.ctx.port_map.sni
            if sni is not None:
                node_id = sni.node_for(server_name)
                if node_id is not None and node_id not in self.ctx.view.nodes:
                    self.admission.refuse(None, "sni", "TLS server name names no known "
                                          "broker; connection closed", peer, listener=name,
                                          server_name=server_name)
                    await trio.aclose_forcefully(client)
                    return
                name = f"broker-{node_id}" if node_id is not None else name
        session = Session(self.ctx, client, name, node_id, peer)
        self.ctx.sessions.add(session)
        try:
            await session.run()
        finally:
            self.ctx.sessions.discard(session)

    async def _sync_broker_listeners(self) -> None:
        """One listener per known in-range broker; closed when the broker leaves."""
        pm = self.ctx.port_map
        if pm.sni is not None:
            return  # every broker is reached through the one TLS port, by name
        wanted = {n for n in self.ctx.view.nodes if pm.in_range(n)}
        for node_id in sorted(set(self._broker_scopes) - wanted):
            self._broker_scopes.pop(node_id).cancel()
            log.info("closed listener for departed broker", extra={"fields": {"node": node_id}})
        if self._stop.is_set():
            return
        for node_id in sorted(wanted - set(self._broker_scopes)):
            port = pm.bind_port(node_id)
            assert port is not None
            try:
                listeners = await open_listeners(self.config.broker_bind_host, port,
                                                 self.config.reuse_port)
            except OSError as exc:
                self.ctx.ratelog(logging.ERROR, f"bind:{node_id}", "cannot open broker listener",
                                 node=node_id, port=port, error=exc.strerror or str(exc))
                continue
            scope = trio.CancelScope()
            self._broker_scopes[node_id] = scope
            assert self._services is not None
            self._services.start_soon(self._serve, listeners, f"broker-{node_id}", node_id,
                                      scope)
            log.info("opened listener for broker", extra={"fields": {
                "node": node_id, "bind": f"{self.config.broker_bind_host}:{port}",
                "advertised": ":".join(map(str, pm.advertised(node_id) or ()))}})
        self.ctx.metrics.broker_listeners.set(len(self._broker_scopes))

    # ------------------------------------------------------------------ discovery

    async def _discover_once(self) -> bool:
        try:
            seen = await discover(self.ctx.rotation, self.config.connect_timeout,
                                  self.config.max_frame_bytes)
        except (UpstreamUnavailable, OSError, trio.TooSlowError, trio.BrokenResourceError,
                trio.ClosedResourceError, CodecError, ConnectionError) as exc:
            self.ctx.ratelog(logging.WARNING, "discovery", "backend discovery failed",
                             error=str(exc) or type(exc).__name__)
            return False
        except Exception:  # a bug here must not take the proxy down; retried next interval
            self.ctx.metrics.internal_errors.inc()
            log.exception("backend discovery failed unexpectedly")
            return False
        self.ctx.last_discovery = time.monotonic()
        await self.ctx.observe(seen)
        return True

    async def _discovery_loop(self) -> None:
        while True:
            await trio.sleep(self.config.discovery_interval)
            await self._discover_once()

    # ------------------------------------------------------------------ http

    def ready(self) -> tuple[bool, str]:
        last = self.ctx.last_discovery
        if self._stop.is_set():
            return False, "draining"
        if last is None:
            return False, "backend not reached yet"
        stale_after = max(3 * self.config.discovery_interval, 30.0)
        if time.monotonic() - last > stale_after:
            return False, f"backend not reached for {time.monotonic() - last:.0f}s"
        return True, f"{len(self.ctx.view.nodes)} broker(s) known"

    def _routes(self) -> dict[str, Handler]:
        async def healthz(req: HttpRequest) -> HttpResponse:
            return HttpResponse(200, b"ok\n")

        async def readyz(req: HttpRequest) -> HttpResponse:
            ok, why = self.ready()
            return HttpResponse(200 if ok else 503, f"{'ready' if ok else 'not ready'}: "
                                f"{why}\n".encode())

        async def metrics(req: HttpRequest) -> HttpResponse:
            return await self.exposition.response(req.headers)

        async def rebootstrap(req: HttpRequest) -> HttpResponse:
            if not self.config.admin:
                return HttpResponse(403, b"admin actions are disabled (start with --admin on)\n")
            if req.method != "POST":
                return HttpResponse(405, b"use POST\n", headers=[("allow", "POST")])
            change = self.ctx.view.force("operator")
            await self.ctx.changed(change)
            return HttpResponse(200, f"topology epoch is now {change.epoch}; clients will be "
                                f"told to bootstrap again\n".encode())

        return {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics,
                "/admin/rebootstrap": rebootstrap}


class ArchiveCollector(Collector):
    def __init__(self, archive: ArchiveWriter) -> None:
        self.archive = archive

    def collect(self) -> Iterator[Metric]:
        stats = self.archive.stats
        records = CounterMetricFamily("kproxy_archive_records", "Archive records, by kind and "
                                      "outcome (dropped: the writer was behind or the disk "
                                      "failed)", labels=["kind", "outcome"])
        for kind in KINDS:
            records.add_metric([kind, "written"], stats.written[kind])
            records.add_metric([kind, "dropped"], stats.dropped[kind])
        yield records
        yield CounterMetricFamily("kproxy_archive_files_deleted", "Completed archive files "
                                  "removed to stay under the size bound", stats.files_deleted)
        yield GaugeMetricFamily("kproxy_archive_bytes", "Bytes of completed archive files",
                                stats.bytes_on_disk)


def _fingerprint(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).digest()
    except OSError:
        return None
