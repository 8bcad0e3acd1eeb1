"""One listener per backend broker in the node id range, following the broker set.

Opened when a broker is first seen (discovery or a relayed response, before the
client sees its port), closed when it leaves. With SNI routing there are none:
every broker is reached through the one TLS port, by name.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from kproxy.config.settings import Config
from kproxy.logs import RateLimitedLog
from kproxy.metrics.proxy_metrics import ProxyMetrics
from kproxy.policies.proxy_state import ProxyState
from kproxy.runtime.listeners import open_listeners

log = logging.getLogger("kproxy")

# serve(listeners, name, node_id, scope): run the listeners until the scope is cancelled.
Serve = Callable[[list[trio.SocketListener], str, int | None, trio.CancelScope],
                 Awaitable[None]]


class BrokerListeners:
    def __init__(self, config: Config, state: ProxyState, metrics: ProxyMetrics,
                 ratelog: RateLimitedLog, label: str = "", count_listeners: bool = True) -> None:
        self.config = config
        self.label = label  # a virtual cluster's listeners: "<name>/broker-N"
        self.count_listeners = count_listeners
        self.state = state
        self.metrics = metrics
        self.ratelog = ratelog
        self.scopes: dict[int, trio.CancelScope] = {}
        self.closed = False  # draining: open no more
        self._nursery: trio.Nursery | None = None
        self._serve: Serve | None = None
        # The broker set and port map the listeners last matched exactly.
        self._synced: tuple[object, object] = (None, None)

    def start(self, nursery: trio.Nursery, serve: Serve) -> None:
        self._nursery, self._serve = nursery, serve

    def in_step(self) -> bool:
        """Whether the listeners were last synced with this broker set and port map
        (``sync`` would return at once)."""
        pm = self.state.port_map
        return pm.sni is not None or (self.state.view.nodes is self._synced[0]
                                      and pm is self._synced[1])

    async def sync(self) -> None:
        """One listener per known in-range broker; closed when the broker leaves."""
        pm = self.state.port_map
        if pm.sni is not None:
            return
        nodes = self.state.view.nodes
        if nodes is self._synced[0] and pm is self._synced[1]:
            return  # every Metadata response lands here: the usual case is no change
        wanted = {n for n in nodes if pm.in_range(n)}
        if wanted == self.scopes.keys():
            # In step with this broker set and port map (the view replaces its set when
            # it changes): nothing to look at again until one of them does.
            self._synced = (nodes, pm)
            return
        for node_id in sorted(set(self.scopes) - wanted):
            self.scopes.pop(node_id).cancel()
            log.info("closed listener for departed broker", extra={"fields": {
                "node": node_id, "listener": f"{self.label}broker-{node_id}"}})
        if self.closed:
            return
        for node_id in sorted(wanted - set(self.scopes)):
            port = pm.bind_port(node_id)
            assert port is not None
            try:
                listeners = await open_listeners(self.config.broker_bind_host, port,
                                                 self.config.reuse_port)
            except OSError as exc:
                self.ratelog(logging.ERROR, f"bind:{node_id}", "cannot open broker listener",
                             node=node_id, port=port, error=exc.strerror or str(exc))
                continue
            scope = trio.CancelScope()
            self.scopes[node_id] = scope
            assert self._nursery is not None and self._serve is not None
            self._nursery.start_soon(self._serve, listeners, f"{self.label}broker-{node_id}",
                                     node_id, scope)
            log.info("opened listener for broker", extra={"fields": {
                "node": node_id, **({"virtual_cluster": self.label[:-1]} if self.label else {}),
                "bind": f"{self.config.broker_bind_host}:{port}",
                "advertised": ":".join(map(str, pm.advertised(node_id) or ()))}})
        if self.count_listeners:
            self.metrics.broker_listeners.set(len(self.scopes))

    def close_all(self) -> None:
        self.closed = True
        for scope in self.scopes.values():
            scope.cancel()
