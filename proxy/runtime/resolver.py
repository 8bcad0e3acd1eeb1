"""Upstream names resolved now and then, not at every client connection.

Every client connection opens an upstream connection of its own. When the upstream is
a name (a Kubernetes Service, the host a broker advertises), resolving it each time
costs a thread hop and, on a real network, one DNS round trip or several (a pod's
resolver tries its search domains first). On the bench machine, with the name in
/etc/hosts, that was 0.26 ms of proxy CPU per connection, a third of all it costs.

So an answer is kept for ``upstream_dns_ttl`` seconds (by default 30, as long as the
JVM keeps one for Kafka's own clients; 0 resolves at every connection, as trio's
``open_tcp_stream`` does). getaddrinfo does not say how long an answer is valid, so a
kept answer that fails is dropped at once: a connect refused at every kept address is
tried again with a fresh answer, and one that timed out leaves the next connection
to resolve afresh. Connections that find a name unknown at once wait for one
resolution together. At most ``MAX_NAMES`` names are kept, the least recently used
dropped first: the names come from the configuration and from the backend's answers.
"""

from __future__ import annotations

import socket
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

MAX_NAMES = 1024

Address = tuple[int, Any]  # (address family, socket address)
Resolve = Callable[[str, int], Awaitable[list[Address]]]


async def getaddrinfo(host: str, port: int) -> list[Address]:
    """The addresses of ``host`` for a TCP connection, in the system's preferred order."""
    infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [(family, sockaddr) for family, _, _, _, sockaddr in infos]


@dataclass
class _Pending:
    """One resolution in flight; connections asking for the same name wait for it."""

    done: trio.Event = field(default_factory=trio.Event)
    addresses: list[Address] | None = None
    error: OSError | None = None


class AddressCache:
    def __init__(self, ttl: float, resolve: Resolve = getaddrinfo,
                 max_names: int = MAX_NAMES) -> None:
        self.ttl = ttl  # read at each lookup: a reload applies
        self._resolve = resolve
        self._max_names = max_names
        self._kept: OrderedDict[tuple[str, int], tuple[float, list[Address]]] = OrderedDict()
        self._pending: dict[tuple[str, int], _Pending] = {}

    def __len__(self) -> int:
        return len(self._kept)

    async def lookup(self, host: str, port: int) -> tuple[list[Address], bool]:
        """``host``'s addresses, and whether they were resolved for this call (else kept)."""
        key = (host, port)
        while True:
            kept = self._kept.get(key)
            if kept is not None and kept[0] > trio.current_time():
                self._kept.move_to_end(key)
                return kept[1], False
            pending = self._pending.get(key)
            if pending is None:
                return await self._resolve_now(key), True
            await pending.done.wait()
            if pending.error is not None:
                raise pending.error
            if pending.addresses is not None:
                return pending.addresses, True
            # The resolving connection was cancelled: the next one resolves.

    def forget(self, host: str, port: int) -> None:
        self._kept.pop((host, port), None)

    def reconfigure(self, ttl: float) -> None:
        """A reload: a changed time to keep applies to the answers kept so far too."""
        if ttl != self.ttl:
            self.ttl = ttl
            self._kept.clear()

    async def _resolve_now(self, key: tuple[str, int]) -> list[Address]:
        pending = self._pending[key] = _Pending()
        try:
            addresses = await self._resolve(*key)
            if not addresses:
                raise OSError(f"{key[0]} resolved to no address")
            pending.addresses = addresses
        except OSError as exc:
            pending.error = exc
            raise
        finally:
            del self._pending[key]
            pending.done.set()
        if self.ttl > 0:
            self._kept[key] = (trio.current_time() + self.ttl, addresses)
            self._kept.move_to_end(key)
            while len(self._kept) > self._max_names:
                self._kept.popitem(last=False)
        return addresses
