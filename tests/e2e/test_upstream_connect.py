"""Opening an upstream connection: an IP address directly, a name as trio resolves it.

Real sockets on loopback (hence in tests/e2e). An address literal skips trio's
per-address race; what the session gets must be the same stream either way, and a
refused connection must name the broker and leave no socket behind.
"""

from __future__ import annotations

import errno
import functools
import os
import socket

import pytest
import trio

from kproxy.runtime.upstream import connect


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def echo_once(stream: trio.SocketStream) -> None:
    async with stream:
        await stream.send_all(await stream.receive_some(100))


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
async def test_a_broker_by_address_or_name_is_connected_to(host: str) -> None:
    family = socket.AF_INET6 if host == "::1" else socket.AF_INET
    bind = "::1" if host == "::1" else "127.0.0.1"
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, echo_once, 0,
                                                             host=bind))
        port = listeners[0].socket.getsockname()[1]
        assert listeners[0].socket.family == family
        stream = await connect(host, port, timeout=5)
        assert isinstance(stream, trio.SocketStream)
        assert stream.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        async with stream:
            await stream.send_all(b"ping")
            assert await stream.receive_some(100) == b"ping"
        nursery.cancel_scope.cancel()


async def test_a_refused_connection_names_the_broker_and_leaves_no_socket() -> None:
    with socket.socket() as probe:  # a port nothing listens on once it is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    before = open_fds()
    with pytest.raises(OSError) as caught:
        await connect("127.0.0.1", port, timeout=5)
    assert caught.value.errno == errno.ECONNREFUSED
    assert f"127.0.0.1:{port}" in str(caught.value)
    assert open_fds() == before

