"""What every session is handed: the services of the proxy it belongs to.

No logic lives here; each service is a module of its own. A session reads these,
never writes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from kproxy.backend_watch import BackendWatch
from kproxy.config import Config
from kproxy.memory import MemoryBudget
from kproxy.metrics import ProxyMetrics
from kproxy.parking import ParkingLot
from kproxy.policies.connection import Handlers
from kproxy.policies.proxy_state import ProxyState
from kproxy.session_events import SessionEvents
from kproxy.upstream import UpstreamConnector


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
    parking: ParkingLot
