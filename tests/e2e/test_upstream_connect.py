"""Opening an upstream connection: an IP address directly, a name through the kept
answers (kproxy.runtime.upstream.AddressCache) or, when none are kept, as trio resolves it.

Real sockets on loopback (hence in tests/e2e). An address literal skips trio's
per-address race; what the session gets must be the same stream either way, and a
refused connection must name the broker and leave no socket behind. Where a name's
answer must change (a broker that moved), a stand-in resolver gives the answers:
DNS itself cannot be changed here.
"""

from __future__ import annotations

import errno
import functools
import os
import socket

import pytest
import trio

from kproxy.codecs import api_keys
from kproxy.embedded_broker import TansuBroker
from kproxy.runtime.upstream import Address, AddressCache, Resolve, connect, getaddrinfo

from ..support import RawClient
from .test_proxy_inprocess import METADATA_V12, start_proxy


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def echo_once(stream: trio.SocketStream) -> None:
    async with stream:
        await stream.send_all(await stream.receive_some(100))


@pytest.mark.parametrize("kept", [0.0, 30.0])
@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
async def test_a_broker_by_address_or_name_is_connected_to(host: str, kept: float) -> None:
    family = socket.AF_INET6 if host == "::1" else socket.AF_INET
    bind = "::1" if host == "::1" else "127.0.0.1"
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, echo_once, 0,
                                                             host=bind))
        port = listeners[0].socket.getsockname()[1]
        assert listeners[0].socket.family == family
        stream = await connect(host, port, timeout=5, names=AddressCache(kept))
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



class StandInDns:
    """Answers as told, or as ``real`` does, counting the questions."""

    def __init__(self, *answers: list[Address], real: Resolve | None = None) -> None:
        self.answers = list(answers)
        self.real = real
        self.asked = 0

    async def __call__(self, host: str, port: int) -> list[Address]:
        self.asked += 1
        if self.real is not None:
            return await self.real(host, port)
        return self.answers[min(self.asked, len(self.answers)) - 1]


def loopback_listener(address: str, port: int = 0) -> socket.socket:
    sock = socket.socket()
    sock.bind((address, port))
    sock.listen(8)
    return sock


def connected_to(stream: trio.abc.Stream) -> str:
    assert isinstance(stream, trio.SocketStream)
    return str(stream.socket.getpeername()[0])


async def test_a_name_is_resolved_once_for_many_connections() -> None:
    dns = StandInDns(real=getaddrinfo)
    names = AddressCache(30, resolve=dns)
    with loopback_listener("127.0.0.1") as listener:
        port = listener.getsockname()[1]
        async with trio.open_nursery() as nursery:
            for _ in range(5):  # at once: they wait for one resolution together
                nursery.start_soon(_connect_and_close, "localhost", port, names)
        for _ in range(3):
            await _connect_and_close("localhost", port, names)
    assert dns.asked == 1 and len(names) == 1


async def test_a_broker_that_moved_is_found_at_the_first_refused_connect() -> None:
    with loopback_listener("127.0.0.2") as old:
        port = old.getsockname()[1]
        dns = StandInDns([(socket.AF_INET, ("127.0.0.2", port))],
                         [(socket.AF_INET, ("127.0.0.3", port))])
        names = AddressCache(30, resolve=dns)
        with loopback_listener("127.0.0.3", port):
            stream = await connect("broker-0.example", port, timeout=5, names=names)
            assert connected_to(stream) == "127.0.0.2"
            await stream.aclose()
            old.close()  # the broker moves: its old address refuses
            stream = await connect("broker-0.example", port, timeout=5, names=names)
            assert connected_to(stream) == "127.0.0.3" and dns.asked == 2
            await stream.aclose()


async def test_the_next_address_is_tried_when_one_refuses_and_first_from_then_on() -> None:
    with loopback_listener("127.0.0.1") as listener:
        port = listener.getsockname()[1]
        refusing, accepting = (socket.AF_INET, ("127.0.0.4", port)), (socket.AF_INET,
                                                                       ("127.0.0.1", port))
        names = AddressCache(30, resolve=StandInDns([refusing, accepting]))
        stream = await connect("kafka.example", port, timeout=5, names=names)
        assert connected_to(stream) == "127.0.0.1"
        await stream.aclose()
        # Only the first connection pays for the address that does not answer.
        assert await names.lookup("kafka.example", port) == ([accepting, refusing], False)


async def test_a_name_refused_everywhere_says_where_and_leaves_no_socket() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dns = StandInDns([(socket.AF_INET, ("127.0.0.1", port))])
    before = open_fds()
    with pytest.raises(OSError) as caught:
        await connect("kafka.example", port, timeout=5, names=AddressCache(30, resolve=dns))
    assert caught.value.errno == errno.ECONNREFUSED
    assert f"kafka.example:{port} (127.0.0.1)" in str(caught.value)
    assert open_fds() == before


async def _connect_and_close(host: str, port: int, names: AddressCache) -> None:
    stream = await connect(host, port, timeout=5, names=names)
    await stream.aclose()


async def test_a_proxy_whose_upstream_is_a_name_resolves_it_once(
        nursery: trio.Nursery, tansu: TansuBroker) -> None:
    """`--upstream localhost:PORT` against a real broker: discovery and every client
    connection reach it, and the name is resolved once for all of them."""
    port = int(tansu.bootstrap.rsplit(":", 1)[1])
    proxy = await start_proxy(nursery, f"localhost:{port}")
    names = proxy.rotation.names
    assert names is not None and names.ttl == 30  # the default
    asked = StandInDns(real=getaddrinfo)
    names._resolve = asked
    for cid in range(4):
        client = await RawClient.connect(proxy.bootstrap_port or 0)
        resp = await client.request(api_keys.METADATA, 12, cid, METADATA_V12)
        assert resp.body["brokers"], resp.body
        await client.aclose()
    # Discovery resolved it before any client came; the clients used that answer.
    assert asked.asked == 0 and len(names) == 1
    proxy.shutdown()
