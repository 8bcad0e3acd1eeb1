"""Large frames relayed socket to socket with splice arrive byte-identical.

Differential: every case runs twice through an in-process proxy, with splice on (the
default threshold) and off (``splice_from=0``: the copy path), and both must deliver
exactly the bytes that were sent, in order. The splice run must also have spliced.

Exact cuts inside a frame (its size prefix, its header, one byte before its end) need
a peer that writes where it is told: ``SplitEchoBroker`` below is a stand-in for that
(a FAKE, named as such). The real-broker case produces and consumes 1 MB messages with
confluent-kafka through tansu.
"""

from __future__ import annotations

import functools
import os
import random
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import trio

from kproxy.codecs import api_keys
from kproxy.codecs.framing import FrameReader
from kproxy.codecs.peek import peek_request
from kproxy.embedded_broker import TansuBroker
from kproxy.runtime.server import Proxy
from kproxy.session import splice
from kproxy.session.errors import SessionClosed
from kproxy.session.relay import PEEK_BYTES, RECV_BYTES
from kproxy.session.transport import SocketTransport

from ..fake_broker import FakeBroker
from ..support import RawClient, produce_and_read_back
from .test_proxy_inprocess import start_proxy
from .test_security import metric

pytestmark = pytest.mark.skipif(not splice.AVAILABLE, reason="splice is Linux only")

THRESHOLD = 64 * 1024  # the default splice_from
SIZES = [THRESHOLD - 1, THRESHOLD, THRESHOLD + 1, 300_000, (1 << 20) + 3]
HEADER = 15  # size prefix and a Fetch v4 request header with client id "t"


def cuts(size: int) -> list[int]:
    """Where a frame is cut in two: every byte of its prefix and header and of the
    sizes that follow, around the peek window, its middle, one byte before its end."""
    wanted = {*range(1, HEADER + 10), 4095, 4096, 4097, size // 2, size - 1}
    return sorted(c for c in wanted if 0 < c < size)


@cache
def filler(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def echo_request(cid: int, size: int, response: int, cut: int) -> bytes:
    """A Fetch v4 frame of ``size`` bytes (the proxy relays it opaquely) asking the
    stand-in for a response of ``response`` bytes written cut at ``cut`` (0: whole)."""
    head = struct.pack(">ihhih", size - 4, api_keys.FETCH, 4, cid, 1) + b"t"
    head += struct.pack(">ii", response, cut)
    return head + filler(size - len(head), size)


def echo_response(cid: int, size: int) -> bytes:
    return struct.pack(">ii", size - 4, cid) + filler(size - 8, size + 1)


# Asked locally of the proxy: an ApiVersions version newer than it reads is answered
# by the proxy itself (UNSUPPORTED_VERSION), in its place among the relayed answers.
def local_request(cid: int) -> bytes:
    body = struct.pack(">hhih", api_keys.API_VERSIONS, 99, cid, 1) + b"t" + b"\x00\x00"
    return struct.pack(">i", len(body)) + body


async def until(cond: Callable[[], bool], what: str) -> None:
    with trio.fail_after(10):
        while not cond():
            await trio.sleep(0.001)
    assert cond(), what


@dataclass
class SplitEchoBroker:
    """STAND-IN BROKER (a fake): answers each Fetch v4 echo request with the response it
    asks for, written in two pieces cut where it says, and records every echo request
    byte for byte. A real broker cannot be told where to cut its writes. Everything
    else (ApiVersions, Metadata for discovery) the scripted ``FakeBroker`` answers.

    With ``held`` (how much of the budget the proxy holds) it waits, at a cut, until
    the proxy holds the first piece, so the proxy really sees the frame cut there."""

    held: Callable[[], int]
    hang_up_at_cut: bool = False  # close the connection instead of the second piece
    fake: FakeBroker = field(default_factory=lambda: FakeBroker(node_ids=[111]))
    received: list[bytes] = field(default_factory=list)

    async def start(self, nursery: trio.Nursery) -> SplitEchoBroker:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.fake.ports[111] = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, self._handle, listeners)
        return self

    async def _handle(self, stream: trio.SocketStream) -> None:
        reader = FrameReader()
        try:
            while data := await stream.receive_some(1 << 20):
                reader.feed(data)
                while (wire := reader.next_wire()) is not None:
                    await self._answer(stream, bytes(wire.wire))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _answer(self, stream: trio.SocketStream, wire: bytes) -> None:
        peek = peek_request(wire[4:])
        if peek.api_key != api_keys.FETCH:
            reply = self.fake.answer(wire[4:])
            assert reply is not None
            await stream.send_all(reply)
            return
        self.received.append(wire)
        size, cut = struct.unpack_from(">ii", wire, HEADER)
        reply = echo_response(peek.correlation_id, size)
        if not cut:
            await stream.send_all(reply)
            return
        await until(lambda: self.held() == 0, "the proxy let go of the request")
        await stream.send_all(reply[:cut])
        await until(lambda: self.held() > 0, "the proxy took the first piece")
        if self.hang_up_at_cut:
            await stream.aclose()
            return
        await stream.send_all(reply[cut:])


async def round_trips(proxy: Proxy, broker: SplitEchoBroker) -> int:
    """Every size cut at every boundary, each way; returns how many frames were over
    one receive buffer (those are spliced whatever the timing)."""
    client = await RawClient.connect(proxy.bootstrap_port or 0)
    cid, large = 0, 0
    sent: list[bytes] = []
    for size in SIZES:
        for cut in cuts(size):
            cid += 1
            wire = echo_request(cid, size, size, cut)
            sent.append(wire)
            await until(lambda: proxy.budget.used == 0, "the proxy holds nothing")
            await client.send(wire[:cut])
            await until(lambda: proxy.budget.used > 0, "the proxy took the first piece")
            await client.send(wire[cut:])
            frame = await client.read_frame()
            assert frame is not None, "connection closed"
            assert struct.pack(">i", len(frame)) + frame == echo_response(cid, size), \
                f"response of {size} bytes cut at {cut} arrived changed"
            large += 2 * (size > RECV_BYTES)
    await client.aclose()
    assert broker.received == sent, "a request arrived changed"
    return large


async def interleaved(proxy: Proxy, broker: SplitEchoBroker) -> None:
    """Large, small and locally answered requests sent in one write, answered in order."""
    client = await RawClient.connect(proxy.bootstrap_port or 0)
    rng = random.Random(7)
    plan: list[tuple[int, int | None]] = []  # (cid, echo size or None: answered here)
    wires: list[bytes] = []
    for cid in range(1, 41):
        if cid % 3 == 0:
            plan.append((cid, None))
            wires.append(local_request(cid))
        else:
            size = rng.choice([200, THRESHOLD + 5, 700_000, 2_000_000])
            plan.append((cid, size))
            wires.append(echo_request(cid, rng.choice([300, THRESHOLD * 3]), size, 0))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.send, b"".join(wires))  # it reads while this writes
        for cid, echoed in plan:
            frame = await client.read_frame()
            assert frame is not None, "connection closed"
            assert struct.unpack_from(">i", frame)[0] == cid, "answers out of order"
            if echoed is None:
                assert struct.unpack_from(">h", frame, 4)[0] == 35  # UNSUPPORTED_VERSION
            else:
                assert struct.pack(">i", len(frame)) + frame == echo_response(cid, echoed)
    await client.aclose()
    echoes = [w for w in wires if peek_request(w[4:]).api_key == api_keys.FETCH]
    assert broker.received[-len(echoes):] == echoes


@pytest.mark.parametrize("splice_from", [THRESHOLD, 0], ids=["splice", "copy"])
async def test_cut_and_interleaved_frames_arrive_byte_identical(
        nursery: trio.Nursery, splice_from: int) -> None:
    box: list[Proxy] = []
    broker = await SplitEchoBroker(lambda: box[0].budget.used).start(nursery)
    proxy = await start_proxy(nursery, broker.fake.bootstrap, splice_from=splice_from)
    box.append(proxy)
    before = splice.PIPES.frames
    large = await round_trips(proxy, broker)
    await interleaved(proxy, broker)
    spliced = splice.PIPES.frames - before
    print(f"{spliced} frames spliced, {len(broker.received)} echo requests")
    if splice_from:
        assert spliced >= large > 0
    else:
        assert spliced == 0
    await until(lambda: not proxy.sessions, "every session ended")
    assert await metric(proxy, "kproxy_internal_errors_total") == 0
    assert proxy.budget.used == 0
    proxy.shutdown()


@pytest.mark.parametrize("cut", [100, 300_000])
async def test_a_broker_gone_mid_splice_ends_the_connection(nursery: trio.Nursery,
                                                            cut: int) -> None:
    """The broker writes part of a large response and hangs up: the client gets exactly
    that part and then a close, never bytes of anything else."""
    box: list[Proxy] = []
    broker = await SplitEchoBroker(lambda: box[0].budget.used, hang_up_at_cut=True
                                   ).start(nursery)
    proxy = await start_proxy(nursery, broker.fake.bootstrap)
    box.append(proxy)
    before = splice.PIPES.opened
    client = await RawClient.connect(proxy.bootstrap_port or 0)
    await client.send(echo_request(1, 100, 200, 0))  # opens the upstream connection
    assert await client.read_frame() is not None
    await client.send(echo_request(2, 100, 1_000_000, cut))
    got = b""
    with trio.fail_after(10):
        while data := await client.stream.receive_some(1 << 16):
            got += data
    assert len(got) == cut, len(got)
    assert got == echo_response(2, 1_000_000)[:cut]
    await until(lambda: not proxy.sessions, "the session ended")
    assert splice.PIPES.opened <= before + 1  # a pipe cut short is closed, not pooled
    assert await metric(proxy, "kproxy_internal_errors_total") == 0
    assert proxy.budget.used == 0
    await client.aclose()
    proxy.shutdown()


async def test_a_client_gone_mid_splice_ends_the_connection(nursery: trio.Nursery) -> None:
    """The client writes part of a large request and hangs up: the broker never gets a
    whole frame from it, and the session ends."""
    box: list[Proxy] = []
    broker = await SplitEchoBroker(lambda: box[0].budget.used).start(nursery)
    proxy = await start_proxy(nursery, broker.fake.bootstrap)
    box.append(proxy)
    client = await RawClient.connect(proxy.bootstrap_port or 0)
    await client.send(echo_request(1, 100, 200, 0))
    assert await client.read_frame() is not None
    before = splice.PIPES.frames
    wire = echo_request(2, 1_000_000, 100, 0)
    await client.send(wire[:400_000])
    await until(lambda: proxy.budget.used > 0, "the proxy took the first piece")
    await client.aclose()
    await until(lambda: not proxy.sessions, "the session ended")
    assert len(broker.received) == 1 and splice.PIPES.frames == before
    assert await metric(proxy, "kproxy_internal_errors_total") == 0
    assert proxy.budget.used == 0
    proxy.shutdown()


async def test_a_drained_source_is_waited_for_not_asked_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``splice_exactly`` moves every byte, and after a splice that emptied the source's
    queue it waits for it instead of asking again (a system call that finds nothing)."""
    calls: list[tuple[int, int | None]] = []  # (source descriptor, bytes or None: EAGAIN)
    real = os.splice  # what splice.py calls, looked up on the os module at each call

    def counting(src: int, dst: int, count: int, *args: Any) -> int:
        try:
            got = real(src, dst, count, *args)
        except BlockingIOError:
            calls.append((src, None))
            raise
        calls.append((src, got))
        return got

    monkeypatch.setattr(os, "splice", counting)
    a, a_peer = trio.socket.socketpair()
    b, b_peer = trio.socket.socketpair()
    data = filler(300_000, 5)
    pipe = splice.PIPES.take()
    assert pipe is not None
    got = bytearray()

    async def reader() -> None:
        while len(got) < len(data):
            got.extend(await b_peer.recv(1 << 16))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        nursery.start_soon(functools.partial(splice.splice_exactly, read_timeout=10.0,
                                             write_timeout=10.0),
                           a.fileno(), b.fileno(), len(data), pipe)
        for i in range(0, len(data), 50_000):  # in pieces, each after the last is taken
            await a_peer.send(data[i : i + 50_000])
            await trio.sleep(0.02)
    splice.PIPES.give_back(pipe, empty=True)
    assert bytes(got) == data
    from_source = [n for fd, n in calls if fd == a.fileno()]
    assert sum(n for n in from_source if n) == len(data)
    assert None not in from_source, from_source  # never asked a drained source
    for s in (a, a_peer, b, b_peer):
        s.close()


async def test_no_yield_after_a_frames_last_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    """The yield for fairness never comes after the frame's last byte left: the caller
    expects the request's answer only once ``splice_exactly`` returns, and a broker
    answering during such a yield would find its answer taken for a stray one (dropped,
    and every later answer on the connection waiting behind the lost one). Every splice
    that moves bytes counts toward the yield here (``FAIRNESS_OPS`` 1)."""
    monkeypatch.setattr(splice, "FAIRNESS_OPS", 1)
    a, a_peer = trio.socket.socketpair()
    b, b_peer = socket.socketpair()  # plain sockets: read without a wait at each yield
    b.setblocking(False)
    b_peer.settimeout(10)
    data = filler(100_000, 6)
    delivered_at_yields: list[int] = []  # bytes the destination held at each yield
    real_checkpoint = trio.lowlevel.checkpoint

    async def noting() -> None:
        try:
            held = len(b_peer.recv(len(data) + 1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except BlockingIOError:
            held = 0
        delivered_at_yields.append(held)
        await real_checkpoint()

    monkeypatch.setattr(trio.lowlevel, "checkpoint", noting)
    pipe = splice.PIPES.take()
    assert pipe is not None
    sent = 0
    while sent < len(data):  # all there before the splice: it never waits
        sent += await a_peer.send(data[sent:])
    size, pipe.size = pipe.size, 16 * 1024  # at most 16 KiB a round: several rounds
    try:
        await splice.splice_exactly(a.fileno(), b.fileno(), len(data), pipe,
                                    read_timeout=10.0, write_timeout=10.0)
    finally:
        pipe.size = size
    splice.PIPES.give_back(pipe, empty=True)
    got = bytearray()
    while len(got) < len(data):
        got.extend(b_peer.recv(1 << 16))
    assert bytes(got) == data
    assert delivered_at_yields, "FAIRNESS_OPS 1: a yield after each splice but the last"
    assert all(n < len(data) for n in delivered_at_yields), delivered_at_yields
    for sock in (a, a_peer, b, b_peer):
        sock.close()


@pytest.mark.parametrize("side", ["read", "write"])
async def test_a_splice_waiting_past_its_timeout_ends(side: str) -> None:
    """No byte of the rest within the read timeout, or no room at the destination within
    the write timeout: ``splice_exactly`` gives up with ``SessionClosed``."""
    a, a_peer = trio.socket.socketpair()
    b, b_peer = trio.socket.socketpair()
    pipe = splice.PIPES.take()
    assert pipe is not None
    reason = "within the read timeout" if side == "read" else "write timed out"

    async def flood() -> None:  # the source never runs dry; nobody reads the destination
        while True:
            await a_peer.send(filler(1 << 16, 9))

    async with trio.open_nursery() as nursery:
        if side == "write":
            nursery.start_soon(flood)
        with trio.fail_after(10), pytest.raises(SessionClosed, match=reason):
            # Only the timeout under test is short: a busy machine may pause the flood.
            await splice.splice_exactly(a.fileno(), b.fileno(), 1 << 30, pipe,
                                        read_timeout=0.05 if side == "read" else 5.0,
                                        write_timeout=0.05 if side == "write" else 5.0)
        nursery.cancel_scope.cancel()
    splice.PIPES.give_back(pipe, empty=False)
    for s in (a, a_peer, b, b_peer):
        s.close()


@pytest.mark.parametrize("side", ["request", "response"])
async def test_after_a_spliced_frame_a_receive_asks_for_a_header_only(
        nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, side: str) -> None:
    """After a spliced request the client's next receive asks for ``PEEK_BYTES`` (the
    next large request is spliced from there, not copied in and out from 256 KiB on);
    after a request taken whole, for ``RECV_BYTES`` again. The same on the broker's side
    after a spliced response (a consumer's next response is likely large too). Every
    frame arrives intact.

    These are the sizes of the trio side's receives, so the express lane is off: with
    it on, a session idle after its second request parks, and the receive after the
    last frame is the lane's own (``express.LANE_BYTES``), whatever trio would ask."""
    asked: list[tuple[int, int]] = []  # (descriptor, bytes asked) of every receive
    fill_now = SocketTransport.fill_now

    def recording(self: SocketTransport, reader: FrameReader, max_bytes: int) -> int | None:
        asked.append((self.fd, max_bytes))
        return fill_now(self, reader, max_bytes)

    monkeypatch.setattr(SocketTransport, "fill_now", recording)
    box: list[Proxy] = []
    broker = await SplitEchoBroker(lambda: box[0].budget.used).start(nursery)
    proxy = await start_proxy(nursery, broker.fake.bootstrap, express_lane="off")
    box.append(proxy)
    client = await RawClient.connect(proxy.bootstrap_port or 0)
    before = splice.PIPES.frames
    # (correlation id, request size, response size): the large ones on the side tested.
    plan = [(cid, size, 300) if side == "request" else (cid, 100, size)
            for cid, size in [(1, 100), (2, 1_000_000), (3, 700_000), (4, 100)]]
    for cid, size, response in plan:
        await client.send(echo_request(cid, size, response, 0))
        frame = await client.read_frame()
        assert frame is not None and struct.pack(">i", len(frame)) + frame == \
            echo_response(cid, response)
    peeks = {fd for fd, n in asked if n == PEEK_BYTES}
    assert len(peeks) == 1, asked  # only the side tested, only after a splice
    (fd,) = peeks
    mine = [n for at, n in asked if at == fd]
    # The first receive and the one after the last (small) frame ask for a full buffer.
    assert mine[0] == RECV_BYTES and mine[-1] == RECV_BYTES, mine
    assert splice.PIPES.frames - before == 2
    assert broker.received == [echo_request(cid, size, response, 0)
                               for cid, size, response in plan]
    await client.aclose()
    await until(lambda: not proxy.sessions, "every session ended")
    assert proxy.budget.used == 0
    proxy.shutdown()


@pytest.mark.broker
@pytest.mark.parametrize("splice_from", [THRESHOLD, 0], ids=["splice", "copy"])
async def test_megabyte_messages_through_a_real_broker_arrive_intact(
        nursery: trio.Nursery, tmp_path: Path, splice_from: int) -> None:
    """confluent-kafka produces 1 MB messages (and small ones between) through the proxy
    to tansu and consumes them back at Fetch v15 (passed through, so spliced too)."""
    rng = random.Random(11)
    values = [rng.randbytes(rng.choice([100, 70_000, 1_000_000, 1_000_003]))
              for _ in range(24)]
    with TansuBroker(log_path=tmp_path / "tansu.log") as broker:
        proxy = await start_proxy(nursery, broker.bootstrap, splice_from=splice_from,
                                  max_fetch_version=15)
        before = splice.PIPES.frames
        got = await trio.to_thread.run_sync(
            produce_and_read_back, f"127.0.0.1:{proxy.bootstrap_port}", "big", values)
        spliced = splice.PIPES.frames - before
        print(f"{spliced} frames spliced")
        assert got == values
        assert (spliced > 0) if splice_from else spliced == 0
        assert await metric(proxy, "kproxy_internal_errors_total") == 0
        proxy.shutdown()


async def test_a_slow_reader_of_a_50_mb_fetch_holds_one_pipe(nursery: trio.Nursery) -> None:
    """A 50 MB Fetch v4 response read in small pieces: the proxy never holds more than
    one receive buffer and one pipe of the budget, and every byte arrives."""
    size = 50 * 1024 * 1024
    fake = await FakeBroker(node_ids=[111], fetch_bytes=size).start(nursery)
    proxy = await start_proxy(nursery, fake.bootstrap)
    before = splice.PIPES.frames
    stream = await trio.open_tcp_stream("127.0.0.1", proxy.bootstrap_port or 0)
    fetch = struct.pack(">hhih", api_keys.FETCH, 4, 1, 1) + b"t" + bytes(40)
    await stream.send_all(struct.pack(">i", len(fetch)) + fetch)
    bound = RECV_BYTES + splice.PIPE_BYTES
    got, total, nonzero = 0, None, 0
    with trio.fail_after(120):
        while total is None or got < total:
            data = await stream.receive_some(64 * 1024)
            assert data, "closed mid-response"
            if total is None:
                total = struct.unpack_from(">i", data)[0] + 4
            got += len(data)
            nonzero += len(data) - data.count(0)  # the records are zeros
            assert proxy.budget.used <= bound
    assert got == total and total > size and nonzero < 100  # only the header's bytes
    assert splice.PIPES.frames == before + 1
    print(f"budget peak {proxy.budget.peak / 2**20:.2f} MiB for a {got / 2**20:.0f} MiB "
          "response")
    assert proxy.budget.peak <= bound
    await stream.aclose()
    proxy.shutdown()
