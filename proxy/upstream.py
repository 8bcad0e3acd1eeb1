"""Opening the one upstream connection a client connection maps to."""

from __future__ import annotations

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
    """Connects to the first reachable bootstrap server, in the configured order.

    Always starting from the first keeps one answer authoritative: were new
    connections spread over servers that disagree (a broker being replaced),
    the proxy's view of the backend would flip between their answers.
    """

    def __init__(self, servers: Sequence[HostPort]) -> None:
        self.servers = list(servers)

    async def connect(self, timeout: float) -> tuple[trio.SocketStream, HostPort]:
        tried: list[tuple[HostPort, str]] = []
        for host, port in list(self.servers):
            try:
                return await connect(host, port, timeout), (host, port)
            except trio.TooSlowError:
                tried.append(((host, port), f"no answer within {timeout:g}s"))
            except OSError as exc:
                tried.append(((host, port), exc.strerror or str(exc)))
        raise UpstreamUnavailable(tried)
