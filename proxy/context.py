"""What every session is handed: the services of the proxy it belongs to.

No logic lives here; each service is a module of its own. A session reads these,
never writes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from kproxy.backend_watch import BackendWatch
from kproxy.config import Config
from kproxy.memory import MemoryBudget
from kproxy.metrics import ProxyMetrics
from kproxy.policies.connection import Handlers
from kproxy.policies.proxy_state import ProxyState
from kproxy.session_events import SessionEvents
from kproxy.upstream import UpstreamConnector

# Local answers made off the event loop (telemetry decoding) share this many threads.
OFFLOAD_THREADS = 2


@dataclass
class SessionServices:
    config: Config
    metrics: ProxyMetrics
    state: ProxyState
    handlers: Handlers
    budget: MemoryBudget
    connector: UpstreamConnector
    events: SessionEvents
    backend: BackendWatch
    limiter: trio.CapacityLimiter = field(
        default_factory=lambda: trio.CapacityLimiter(OFFLOAD_THREADS))

    async def offload(self, work: Callable[[], bytes]) -> bytes:
        """Run CPU-heavy work for a local answer in a worker thread."""
        return await trio.to_thread.run_sync(work, limiter=self.limiter)
