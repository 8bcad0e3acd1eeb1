"""Opening the one upstream connection a client connection maps to."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import trio

from kproxy.config import HostPort


class UpstreamUnavailable(Exception):
    def __init__(self, tried: list[tuple[HostPort, str]]) -> None:
        self.tried = tried
        super().__init__("; ".join(f"{h}:{p}: {why}" for (h, p), why in tried))


async def connect(host: str, port: int, timeout: float) -> trio.SocketStream:
    with trio.fail_after(timeout):
        return await trio.open_tcp_stream(host, port)


class BootstrapRotation:
    """Spreads new connections over the bootstrap servers and skips dead ones."""

    def __init__(self, servers: Sequence[HostPort]) -> None:
        self.servers = list(servers)
        self._start = itertools.count()

    async def connect(self, timeout: float) -> tuple[trio.SocketStream, HostPort]:
        servers = self.servers
        first = next(self._start) % len(servers)
        tried: list[tuple[HostPort, str]] = []
        for i in range(len(servers)):
            host, port = servers[(first + i) % len(servers)]
            try:
                return await connect(host, port, timeout), (host, port)
            except trio.TooSlowError:
                tried.append(((host, port), f"no answer within {timeout:g}s"))
            except OSError as exc:
                tried.append(((host, port), exc.strerror or str(exc)))
        raise UpstreamUnavailable(tried)
