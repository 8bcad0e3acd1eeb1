"""What every session is handed: the services of the proxy it belongs to.

No logic lives here; each service is a module of its own. A session reads these,
never writes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kproxy.config.settings import Config
from kproxy.memory import MemoryBudget
from kproxy.metrics.proxy_metrics import ProxyMetrics
from kproxy.policies.auth.quotas import Quotas
from kproxy.policies.connection import Handlers
from kproxy.policies.proxy_state import ProxyState
from kproxy.runtime.backend_watch import BackendWatch
from kproxy.runtime.upstream import UpstreamConnector
from kproxy.session.events import SessionEvents
from kproxy.session.parked.parking import ParkingLot


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
    quotas: Quotas = field(default_factory=Quotas)  # shared by the process's sessions
