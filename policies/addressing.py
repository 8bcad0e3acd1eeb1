"""Deterministic mapping from backend node ids to the proxy's own ports.

port = base + (node_id - first). Every replica of the proxy computes the same
port for the same broker, so any replica behind a Service can serve any client.
The advertised side (host and port base written into responses) may differ from
the bind side (where this process listens) for NodePorts, port-forwards and load
balancers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BrokerAddress:
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True)
class SniNames:
    """Broker host names for SNI routing: one TLS port, the broker named by the host.

    ``pattern`` holds ``{node_id}`` once, e.g. ``broker-{node_id}.kafka.example.com``.
    Every replica derives the same name for the same broker, as with ports.
    """

    pattern: str
    port: int
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.pattern.count("{node_id}") != 1:
            raise ValueError(f"must contain {{node_id}} exactly once, got {self.pattern!r}")
        before, after = self.pattern.split("{node_id}")
        if not before and not after:
            raise ValueError("must contain more than {node_id}")
        regex = re.compile(re.escape(before.lower()) + r"(\d{1,10})" + re.escape(after.lower()))
        object.__setattr__(self, "_regex", regex)

    def host(self, node_id: int) -> str:
        return self.pattern.replace("{node_id}", str(node_id))

    def node_for(self, server_name: str | None) -> int | None:
        """The broker a TLS server name asks for; None for any other name (bootstrap)."""
        if not server_name:
            return None
        m = self._regex.fullmatch(server_name.lower().rstrip("."))
        return int(m.group(1)) if m else None


@dataclass(frozen=True)
class PortMap:
    advertised_host: str
    advertised_port_base: int
    bind_port_base: int
    first_node_id: int
    last_node_id: int
    sni: SniNames | None = None  # SNI routing: names on one port instead of a port each

    def __post_init__(self) -> None:
        if self.first_node_id > self.last_node_id:
            raise ValueError("node id range is empty")
        span = self.last_node_id - self.first_node_id
        for base in (self.advertised_port_base, self.bind_port_base):
            if base < 1 or base + span > 65535:
                raise ValueError(f"ports {base}..{base + span} do not fit in 1..65535")

    def in_range(self, node_id: int) -> bool:
        return self.first_node_id <= node_id <= self.last_node_id

    def advertised(self, node_id: int) -> tuple[str, int] | None:
        """The address written into responses for a backend node; None when out of range."""
        if not self.in_range(node_id):
            return None
        if self.sni is not None:
            return self.sni.host(node_id), self.sni.port
        return self.advertised_host, self.advertised_port_base + node_id - self.first_node_id

    def bind_port(self, node_id: int) -> int | None:
        if not self.in_range(node_id):
            return None
        return self.bind_port_base + node_id - self.first_node_id

    def node_for_bind_port(self, port: int) -> int | None:
        node = port - self.bind_port_base + self.first_node_id
        return node if self.in_range(node) else None
