"""Connection admission: the limits on client connections open at once.

A connection is counted in at accept and out when its handler ends, whatever ends
it; refused ones are counted per limit and logged at most once per interval.
"""

from __future__ import annotations

import logging

from kproxy.logs import RateLimitedLog
from kproxy.metrics import ProxyMetrics


class Admission:
    def __init__(self, metrics: ProxyMetrics, ratelog: RateLimitedLog, max_connections: int,
                 max_per_source: int) -> None:
        self.metrics = metrics
        self.ratelog = ratelog
        self.max_connections = max_connections
        self.max_per_source = max_per_source
        # Connections admitted and not yet closed (TLS handshakes included), in all and
        # by source address.
        self.open_connections = 0
        self.by_source: dict[str, int] = {}

    def admit(self, source: str, listener: str) -> bool:
        """Count the connection in, or refuse it when a connection limit is reached."""
        if self.open_connections >= self.max_connections:
            self.refuse("max_connections", "max_connections", "connection limit reached; "
                        "new connection closed", (source, 0), listener=listener,
                        maximum=self.max_connections)
            return False
        held = self.by_source.get(source, 0)
        if held >= self.max_per_source:
            self.refuse("max_connections_per_source", "max_connections_per_source",
                        "per-source connection limit reached; new connection closed",
                        (source, 0), listener=listener, maximum=self.max_per_source)
            return False
        self.by_source[source] = held + 1
        self.open_connections += 1
        return True

    def release(self, source: str) -> None:
        self.open_connections -= 1
        left = self.by_source.get(source, 1) - 1
        if left > 0:
            self.by_source[source] = left
        else:
            self.by_source.pop(source, None)

    def refuse(self, limit_name: str | None, key: str, msg: str, peer: tuple[str, int],
               **fields: object) -> None:
        if limit_name is not None:
            self.metrics.limits_hit.labels(limit_name).inc()
        self.ratelog(logging.WARNING, key, msg, client=f"{peer[0]}:{peer[1]}", **fields)
