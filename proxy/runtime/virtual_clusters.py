"""The running virtual clusters: each one's listeners, chain, state and counts.

A virtual cluster is served by the same process, sessions and upstream connections as
the main listeners; what differs is handed to its sessions in their own
``SessionServices``: a ``ProxyState`` with its own port map (its broker ports in every
address a response carries) sharing the one backend view and topology epoch, and a
filter chain of its configured filters followed by the translation
(``policies.tenancy.virtual_cluster``) in front of the built-in filters.

Listeners are opened at start, in every worker (SO_REUSEPORT, as the main ones), and
its per-broker listeners follow the backend's brokers like the main ones. A session
counts its bytes; they are added to its virtual cluster's totals when it ends.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kproxy.config.settings import Config
from kproxy.config.virtual_clusters import VirtualClusterSettings
from kproxy.context import SessionServices
from kproxy.policies.filters.chain import BuiltinFilter, DecisionCounts, FilterChain
from kproxy.policies.proxy_state import ProxyState
from kproxy.policies.tenancy.virtual_cluster import VirtualClusterFilter
from kproxy.runtime.broker_listeners import BrokerListeners

if TYPE_CHECKING:
    from kproxy.session.session import Session

log = logging.getLogger("kproxy")


class VirtualCluster:
    def __init__(self, settings: VirtualClusterSettings, config: Config, main: SessionServices,
                 builtins: list[BuiltinFilter], counts: DecisionCounts,
                 api_caps: dict[int, int]) -> None:
        self.settings = settings
        shared = main.state
        self.state = ProxyState(
            settings.port_map(config.node_id_range), config.legacy_clients,
            config.require_sasl, list(config.upstream), view=shared.view,
            served_apis=shared.served_apis,
            # Logging in at the proxy holds on every listener: a tenant's too.
            sasl_gate=shared.sasl_gate)
        self.translation = VirtualClusterFilter(settings.name, settings.prefix)
        self.builtins = builtins
        self.counts = counts
        self.chain = self._chain(config, api_caps)
        self.services = dataclasses.replace(main, state=self.state,
                                            handlers=self.chain.handlers)
        self.listeners = BrokerListeners(config, self.state, main.metrics, main.events.ratelog,
                                         label=f"{settings.name}/", count_listeners=False)
        self.bootstrap_scope = trio.CancelScope()
        self.bootstrap_port: int | None = None
        # Totals of the sessions that ended; open ones are read at scrape time.
        self.accepted = 0
        self.bytes_in = 0
        self.bytes_out = 0

    @property
    def name(self) -> str:
        return self.settings.name

    def _chain(self, config: Config, api_caps: dict[int, int]) -> FilterChain:
        filters = [*config.filters.chain_of(self.settings.filters), self.translation]
        chain = FilterChain(self.builtins, filters, self.counts)
        self.state.api_caps = chain.caps(api_caps)
        return chain

    def reconfigure(self, config: Config, settings: VirtualClusterSettings,
                    api_caps: dict[int, int]) -> None:
        """A reload: new settings (the same listeners and prefix) and a new chain."""
        self.settings = settings
        self.state.reconfigure(config.legacy_clients, config.require_sasl, config.upstream)
        self.chain = self._chain(config, api_caps)
        self.services.config = self.listeners.config = config
        self.services.handlers = self.chain.handlers

    def ended(self, session: Session) -> None:
        self.bytes_in += session.bytes_in
        self.bytes_out += session.bytes_out

    def row(self, sessions: Iterable[Session]) -> dict[str, Any]:
        """Its line on the status page: settings and the figures of this process."""
        mine = [s for s in sessions if s.services is self.services]
        s = self.settings
        return {"name": s.name, "prefix": s.prefix,
                "bootstrap": f"{s.listen[0]}:{self.bootstrap_port or s.listen[1]}",
                "broker_ports": f"{s.broker_bind_port_base}+(node_id-first)",
                "advertised": f"{s.advertised_host}:{s.advertised_port_base}",
                "filters": list(s.filters), "connections": len(mine),
                "accepted": self.accepted,
                "bytes_in": self.bytes_in + sum(x.bytes_in for x in mine),
                "bytes_out": self.bytes_out + sum(x.bytes_out for x in mine)}


class VirtualClusterCollector(Collector):
    """Connections and bytes per virtual cluster, read at scrape time. The ``vcluster``
    label takes the configured names only, so its series are bounded by the config."""

    def __init__(self, clusters: Callable[[], list[VirtualCluster]],
                 sessions: Callable[[], Iterable[Session]]) -> None:
        self.clusters = clusters
        self.sessions = sessions

    def collect(self) -> Iterator[Metric]:
        conns = GaugeMetricFamily("kproxy_virtual_cluster_connections", "Client connections "
                                  "open now, per virtual cluster", labels=["vcluster"])
        accepted = CounterMetricFamily("kproxy_virtual_cluster_connections_accepted",
                                       "Client connections accepted, per virtual cluster",
                                       labels=["vcluster"])
        moved = CounterMetricFamily("kproxy_virtual_cluster_bytes", "Bytes relayed for "
                                    "clients of a virtual cluster (in: from clients, out: to "
                                    "them)", labels=["vcluster", "direction"])
        sessions = list(self.sessions())
        for vc in self.clusters():
            row = vc.row(sessions)
            conns.add_metric([vc.name], float(row["connections"]))
            accepted.add_metric([vc.name], float(row["accepted"]))
            moved.add_metric([vc.name, "in"], float(row["bytes_in"]))
            moved.add_metric([vc.name, "out"], float(row["bytes_out"]))
        yield conns
        yield accepted
        yield moved
