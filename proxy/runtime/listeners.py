"""Opening the client-facing TCP listeners, optionally shared between processes.

One kproxy process uses one core. With ``reuse_port`` every listener is opened with
SO_REUSEPORT, so several processes on one host can bind the same bootstrap and
broker ports and the kernel spreads new connections over them. That is safe here
because a client connection never needs another connection's state: its upstream
connection lives in the same process, subscription ids are derived from the
subscription and the instance id alone, and the port map is the same everywhere.
"""

from __future__ import annotations

import socket

import trio

BACKLOG = 0xFFFF  # the kernel caps it at net.core.somaxconn, as trio's own listeners do


async def open_listeners(host: str, port: int, reuse_port: bool) -> list[trio.SocketListener]:
    if not reuse_port:
        return await trio.open_tcp_listeners(port, host=host)
    if not hasattr(socket, "SO_REUSEPORT"):
        raise OSError("reuse_port: this platform has no SO_REUSEPORT")
    infos = await trio.socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                          flags=socket.AI_PASSIVE)
    listeners: list[trio.SocketListener] = []
    try:
        for family, kind, proto, _, address in infos:
            sock = trio.socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                await sock.bind(address)
                sock.listen(BACKLOG)
            except BaseException:
                sock.close()
                raise
            listeners.append(trio.SocketListener(sock))
    except BaseException:
        for listener in listeners:
            await trio.aclose_forcefully(listener)
        raise
    return listeners


def peer_of(stream: trio.SocketStream) -> tuple[str, int]:
    """The client's address and port, for limits, logs and the connection inventory."""
    try:
        addr = stream.socket.getpeername()
        return str(addr[0]), int(addr[1])
    except (OSError, AttributeError, IndexError):
        return "unknown", 0


def inherited_listener(fd: int) -> trio.SocketListener:
    """A listening socket this process was handed (a worker's HTTP listener, opened by
    its supervisor so that no other process can take the port in between)."""
    sock = socket.socket(fileno=fd)
    sock.setblocking(False)
    return trio.SocketListener(trio.socket.from_stdlib_socket(sock))
