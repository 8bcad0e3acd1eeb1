"""What every connection's decisions share: the backend view and the proxy's settings.

One object, owned by the proxy and handed to each ``ConnectionState``: the port map,
the backend view with its topology epoch, the APIs and versions advertised, the
rewrite cache, and what the last ApiVersions relayed said of the backend. Pure
state, no I/O: the proxy shell reacts to the changes ``learn`` returns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kproxy.policies.addressing import PortMap
from kproxy.policies.api_versions import ApiVersionsAnswers, default_caps
from kproxy.policies.rewrite import Seen
from kproxy.policies.rewrite_cache import RewriteCache
from kproxy.policies.topology import BackendView, Change

HostPort = tuple[str, int]


@dataclass
class ProxyState:
    port_map: PortMap
    legacy_clients: str = "close"  # below Metadata v13 on a change: "close" | "ignore"
    require_sasl: bool = False  # answer nothing locally before SASL authentication
    upstream_servers: list[HostPort] = field(default_factory=list)
    view: BackendView = field(default_factory=BackendView)
    rewrites: RewriteCache = field(default_factory=RewriteCache)
    api_caps: dict[int, int] = field(default_factory=default_caps)
    # APIs the proxy serves itself, advertised in ApiVersions: key -> (min, max).
    served_apis: dict[int, tuple[int, int]] = field(default_factory=dict)
    api_versions_answers: ApiVersionsAnswers = field(default_factory=ApiVersionsAnswers)
    # The backend's own Metadata maximum, from the last ApiVersions response relayed.
    backend_metadata_max: int | None = None
    # SASL terminated here: (connection, API key) -> a Close for a request that may not
    # pass yet (not logged in, session expired), else None (``policies.auth.handlers``).
    sasl_gate: Callable[[Any, int], Any] | None = None
    # The epoch at which the upstream list last changed (a reload): until the change that
    # follows it lands, a bootstrap connection reaching the new list already talks to
    # the backend that change describes.
    relisted_at: int | None = None
    # The port map as a cached rewrite's key names it: a number that changes with it
    # (hashing the map itself, a dataclass, took two Python calls a Metadata answer).
    port_map_generation: int = 0

    @property
    def epoch(self) -> int:
        return self.view.epoch

    def reconfigure(self, legacy_clients: str, require_sasl: bool,
                    upstream_servers: list[HostPort]) -> None:
        """A reloaded configuration; the view and its epoch carry on."""
        self.legacy_clients = legacy_clients
        self.require_sasl = require_sasl
        if list(upstream_servers) != self.upstream_servers:
            self.relisted_at = self.view.epoch
        self.upstream_servers = list(upstream_servers)

    def serve_sni_on(self, port: int) -> None:
        """SNI routing listens on a port the OS picked: advertise that one."""
        if self.port_map.sni is not None:
            self.port_map = replace(self.port_map, sni=replace(self.port_map.sni, port=port))
            self.port_map_generation += 1

    def learn(self, seen: Seen, connected_epoch: int | None = None) -> Change | None:
        """Merge what a response (or discovery, with no epoch) said about the backend.

        A connection opened before the last change may still reach the old backend;
        discovery, not it, decides what the backend is now, so its answers are ignored.
        """
        if not seen.nodes and not seen.complete:
            return None
        if connected_epoch is not None and (
                connected_epoch < self.view.epoch
                or (seen.cluster_id and self.view.cluster_id
                    and seen.cluster_id != self.view.cluster_id)):
            return None
        return self.view.observe(seen.nodes, seen.cluster_id, seen.complete)
