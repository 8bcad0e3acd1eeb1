"""A real tansu broker for the matrix, started on a port that binds, retried on AddrInUse.

tansu binds without SO_REUSEADDR, so a port in TIME-WAIT from an earlier run makes it
panic at start; a fresh port and another try get past that.
"""

from __future__ import annotations

from pathlib import Path

from kproxy.embedded_broker import BrokerStartError, TansuBroker, free_port

ATTEMPTS = 4


def start_tansu(log_path: Path, timeout: float = 20.0) -> TansuBroker:
    for attempt in range(1, ATTEMPTS + 1):
        broker = TansuBroker(port=free_port(), log_path=log_path)
        try:
            return broker.start(timeout=timeout)
        except BrokerStartError:
            if attempt == ATTEMPTS:
                raise
    raise AssertionError("unreachable")
