"""The relay's transports over real connected sockets: partial writes, drained reads, fairness."""

from __future__ import annotations

import os
import socket
import ssl

import pytest
import trio
import trio.testing

from kproxy.session.transport import (
    FAIRNESS_OPS,
    SocketTransport,
    StreamTransport,
    _consume,
    transport_for,
)


def test_consume_drops_whole_buffers_and_slices_a_partial_one() -> None:
    parts: list[bytes | bytearray | memoryview] = [b"abc", b"defg", b"hi"]
    assert _consume(parts, 0) == parts
    assert [bytes(p) for p in _consume(parts, 3)] == [b"defg", b"hi"]
    assert [bytes(p) for p in _consume(parts, 5)] == [b"fg", b"hi"]
    assert _consume(parts, 9) == []


async def _socket_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)  # completes in the backlog
    server = await listener.accept()
    await listener.aclose()
    return client, server


async def test_transport_for_picks_the_socket_path_for_plain_tcp() -> None:
    a, b = await _socket_pair()
    try:
        assert isinstance(transport_for(a), SocketTransport)
        left, _right = trio.testing.memory_stream_pair()
        assert isinstance(transport_for(left), StreamTransport)
    finally:
        await a.aclose()
        await b.aclose()


@pytest.mark.skipif(not hasattr(socket, "TCP_NOTSENT_LOWAT"), reason="no TCP_NOTSENT_LOWAT")
async def test_relayed_sockets_queue_unsent_bytes_as_any_socket_does() -> None:
    """trio caps what waits unsent in the kernel at 16 KiB; a relay lifts the cap (0:
    the system's default), plain or under TLS, so a large frame spliced to a broker
    that reads as it can does not wait for room every few dozen KiB."""
    a, b = await _socket_pair()
    c, d = await _socket_pair()

    def lowat(stream: trio.SocketStream) -> int:
        return int(stream.getsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT))

    try:
        assert lowat(a) == lowat(c) == 16 * 1024  # trio's own setting, before
        transport_for(a)
        transport_for(trio.SSLStream(c, ssl.create_default_context(), server_hostname="x"))
        assert lowat(a) == lowat(c) == 0
        assert lowat(b) == 16 * 1024  # a stream the proxy does not relay keeps trio's
    finally:
        for s in (a, b, c, d):
            await s.aclose()


async def test_a_send_larger_than_the_socket_buffers_completes_intact() -> None:
    a, b = await _socket_pair()
    sender, receiver = SocketTransport(a), SocketTransport(b)
    payload = [os.urandom(1 << 20) for _ in range(8)]  # 8 MiB: far past the kernel buffers
    got = bytearray()

    async def read_slowly() -> None:
        while len(got) < 8 << 20:
            await trio.sleep(0.001)
            data = receiver.receive_now(1 << 16) or await receiver.receive(1 << 16)
            assert data
            got.extend(data)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_slowly)
            rest = sender.send_now(list(payload))
            assert rest, "the kernel cannot have taken 8 MiB at once"
            assert sum(map(len, rest)) < 8 << 20, "it took what it could"
            with trio.fail_after(30):
                await sender.send_rest(rest)
        assert bytes(got) == b"".join(payload)
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_short_read_means_drained_and_busy_readers_yield() -> None:
    a, b = await _socket_pair()
    reader = SocketTransport(b)
    try:
        assert reader.receive_now(100) is None  # nothing read yet: wait first
        await a.send_all(b"x" * 10)
        assert await reader.receive(100) == b"x" * 10
        assert reader.receive_now(100) is None, "a short read drained the socket"
        await a.send_all(b"y" * 1000)
        assert await reader.receive(10) == b"y" * 10  # a full read: more may be there
        taken = 0
        while (data := reader.receive_now(10)) is not None:
            taken += 1
            assert data == b"y" * 10
        assert taken == FAIRNESS_OPS - 1, "after a run of reads that did not wait, it yields"
        assert await reader.receive(10) == b"y" * 10  # and the bytes are still there
        await a.aclose()
        rest = b""
        while chunk := await reader.receive(1000):
            rest += chunk
        assert rest == b"y" * (1000 - 10 * (FAIRNESS_OPS + 1))
    finally:
        await b.aclose()


async def test_receive_into_fills_the_given_room() -> None:
    a, b = await _socket_pair()
    reader = SocketTransport(b)
    buf = bytearray(10)
    try:
        await a.send_all(b"0123456789abc")
        assert await reader.receive_into(memoryview(buf)[:4]) == 4  # full: more may be there
        assert reader.receive_into_now(memoryview(buf)[4:]) == 6
        assert bytes(buf) == b"0123456789"
        left = bytearray(10)
        assert reader.receive_into_now(memoryview(left)) == 3  # short: drained
        assert reader.receive_into_now(memoryview(left)) is None
        await a.aclose()
        assert await reader.receive_into(memoryview(left)) == 0  # end of stream
        stream_side = StreamTransport(trio.testing.memory_stream_pair()[0])
        assert stream_side.receive_into_now(memoryview(left)) is None
    finally:
        await b.aclose()


async def test_fill_feeds_chunks_and_receives_a_large_frame_in_place() -> None:
    from kproxy.codecs.framing import FrameReader, frame

    a, b = await _socket_pair()
    io = SocketTransport(b)
    reader = FrameReader(in_place_from=1000)
    big, small = os.urandom(200_000), b"tail"
    try:
        assert io.fill_now(reader, 64) is None  # nothing received yet: wait first
        await a.send_all(frame(big)[:64])
        assert await io.fill(reader, 64) == 64  # a chunk: the size is now known
        assert reader.next_frame() is None and reader.room() is not None
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:  # more than the socket buffers hold
                nursery.start_soon(a.send_all, frame(big)[64:] + frame(small))
                while reader.room() is not None:  # the rest of the big frame, in place
                    n = io.fill_now(reader, 64)
                    if n is None:
                        n = await io.fill(reader, 64)
                    assert n
                assert reader.next_frame() == big
                while (got := reader.next_frame()) is None:
                    n = io.fill_now(reader, 64)
                    assert n != 0
                    if n is None:
                        await io.fill(reader, 64)
            assert got == small
            await a.aclose()
            assert await io.fill(reader, 64) == 0  # end of stream
    finally:
        await b.aclose()


async def test_a_tls_receive_takes_every_record_already_delivered() -> None:
    """Over TLS a receive returns all the records the socket already delivered, not one
    16 KiB record a call (each call a trip through the scheduler); the bytes arrive
    intact, and the peer's close is still reported as the end of the stream."""
    import ssl

    import trustme

    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    a, b = await _socket_pair()
    client = trio.SSLStream(a, client_ctx, server_hostname="127.0.0.1")
    server = trio.SSLStream(b, server_ctx, server_side=True)
    payload = os.urandom(1 << 20)
    receiver = StreamTransport(server)
    sizes: list[int] = []
    got = bytearray()

    async def send() -> None:
        await client.send_all(payload)
        await client.aclose()  # close_notify, then the socket closes

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        await server.do_handshake()
        with trio.fail_after(30):
            while True:
                data = await receiver.receive(1 << 18)
                if not data:
                    break
                sizes.append(len(data))
                got.extend(data)
    await server.aclose()
    assert bytes(got) == payload
    assert max(sizes) > 16 * 1024, sizes  # more than one record in some receive
