"""Deterministic mapping from backend node ids to the proxy's own ports.

port = base + (node_id - first). Every replica of the proxy computes the same
port for the same broker, so any replica behind a Service can serve any client.
The advertised side (host and port base written into responses) may differ from
the bind side (where this process listens) for NodePorts, port-forwards and load
balancers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BrokerAddress:
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True)
class PortMap:
    advertised_host: str
    advertised_port_base: int
    bind_port_base: int
    first_node_id: int
    last_node_id: int

    def __post_init__(self) -> None:
        if self.first_node_id > self.last_node_id:
            raise ValueError("node id range is empty")
        span = self.last_node_id - self.first_node_id
        for base in (self.advertised_port_base, self.bind_port_base):
            if base < 1 or base + span > 65535:
                raise ValueError(f"ports {base}..{base + span} do not fit in 1..65535")

    def in_range(self, node_id: int) -> bool:
        return self.first_node_id <= node_id <= self.last_node_id

    def advertised_port(self, node_id: int) -> int | None:
        if not self.in_range(node_id):
            return None
        return self.advertised_port_base + node_id - self.first_node_id

    def bind_port(self, node_id: int) -> int | None:
        if not self.in_range(node_id):
            return None
        return self.bind_port_base + node_id - self.first_node_id

    def node_for_bind_port(self, port: int) -> int | None:
        node = port - self.bind_port_base + self.first_node_id
        return node if self.in_range(node) else None
