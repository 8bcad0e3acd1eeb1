"""What the proxy counts and logs when a session reports something.

Sessions and their states decide; this module turns their reports into metrics,
rate-limited log lines and archive records, so that one place says how each event
is seen by an operator.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable

from kproxy.archive import ArchiveWriter
from kproxy.codecs import api_keys
from kproxy.codecs.archive_records import ConnectionRecord
from kproxy.codecs.framing import FrameTooLarge
from kproxy.logs import RateLimitedLog
from kproxy.metrics.proxy_metrics import ProxyMetrics
from kproxy.policies.connection import Close, ConnectionState
from kproxy.policies.metadata_bridge import BRIDGED_VERSION


class SessionEvents:
    def __init__(self, metrics: ProxyMetrics, ratelog: RateLimitedLog,
                 archive: ArchiveWriter | None = None) -> None:
        self.metrics = metrics
        self.ratelog = ratelog
        self.archive = archive
        self.hostname = socket.gethostname()
        # Called with every connection's state as it closes (the status page notes it).
        self.on_connection_closed: list[Callable[[ConnectionState], None]] = []

    def limit_hit(self, limit: str, msg: str, conn: ConnectionState) -> None:
        """A limit reached by a session: counted always, logged at most once per interval."""
        self.metrics.limits_hit.labels(limit).inc()
        self.ratelog(logging.INFO, f"limit:{limit}", msg, limit=limit, **conn.log_fields())

    def decode_error(self, side: str, what: str, exc: Exception, conn: ConnectionState) -> None:
        if isinstance(exc, FrameTooLarge):
            self.limit_hit("max_frame_bytes", f"{side} frame over max_frame_bytes; "
                           "connection closed", conn)
        self.metrics.decode_errors.labels(what, side).inc()
        self.ratelog(logging.WARNING, f"decode:{side}:{what}",
                     f"undecodable {side}; closing the connection", error=str(exc),
                     **conn.log_fields())

    def refused(self, close: Close, conn: ConnectionState) -> None:
        """A request the connection's state refused by closing (as a broker would)."""
        if close.event == "unauthenticated":
            self.metrics.unauthenticated.labels(close.api or "").inc()
        self.ratelog(logging.WARNING, close.event, close.message,
                     **({"api": close.api} if close.api else {}), **conn.log_fields())

    def upstream_unreachable(self, conn: ConnectionState, tried: str) -> None:
        self.metrics.upstream_connect_failures.labels(conn.listener).inc()
        self.ratelog(logging.WARNING, f"connect:{conn.listener}",
                     "cannot reach the backend; closing the client connection",
                     listener=conn.listener, tried=tried)

    def upstream_dropped(self, conn: ConnectionState) -> None:
        """A connect that reached a server a reload had just dropped: counted as the
        connections open at the change are, and ended like them."""
        self.metrics.rebootstrap.labels("upstream_gone").inc()

    def upstream_lost(self, conn: ConnectionState, reason: str) -> None:
        self.metrics.upstream_disconnects.labels(conn.listener).inc()
        self.ratelog(logging.WARNING, f"lost:{conn.listener}",
                     "backend connection lost; closing the client connection",
                     listener=conn.listener, reason=reason)

    def connection_closed(self, conn: ConnectionState, opened_at: float, bytes_in: int,
                          bytes_out: int) -> None:
        """One inventory record per client connection, for the fleet pipeline."""
        for hook in self.on_connection_closed:
            hook(conn)
        if self.archive is None or not conn.api_versions_used:
            return
        used = conn.api_versions_used
        metadata = used.get(api_keys.METADATA)
        info = conn.info
        record: ConnectionRecord = {
            "ts": round(time.time(), 3), "opened": round(opened_at, 3),
            "proxy": self.hostname, "listener": conn.listener,
            "client_id": info.client_id, "client_software_name": info.software_name,
            "client_software_version": info.software_version,
            "source_address": info.source_address, "source_port": info.source_port,
            "apis": {api_keys.api_name(k): v for k, v in sorted(used.items())},
            "metadata_max_version": metadata,
            "supports_metadata_v13": None if metadata is None else metadata >= BRIDGED_VERSION,
            "telemetry": api_keys.PUSH_TELEMETRY in used
            or api_keys.GET_TELEMETRY_SUBSCRIPTIONS in used,
            "bytes_in": bytes_in, "bytes_out": bytes_out,
        }
        self.archive.connection(dict(record))
