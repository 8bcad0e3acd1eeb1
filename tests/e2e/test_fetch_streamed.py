"""Large Fetch v16+ responses relayed as they arrive (``session.streamed``) arrive right.

Such a response may name brokers (KIP-951 NodeEndpoints) in its top-level tagged
section, after every record, so the proxy walks its skeleton as it passes, splices its
records socket to socket, and rewrites the tagged section into as many bytes as it had.
Differential: the stand-in broker below writes each response cut where the test says
(every byte of its start, around each partition head, inside and around the records,
around the tagged section, one byte before its end), and the client must receive:

- without NodeEndpoints, exactly the bytes the broker sent;
- with them, a frame of the same size, identical up to the tagged section, whose
  section names the brokers at the proxy's address, or (when that no longer fits)
  names none and is padded with the unknown tag ``PAD_TAG``;

in request order among small responses and answers the proxy makes itself. A spy on
``relay.stream_through`` and the pipe pool's frame counter show the path was taken; a
malformed response ends its connection (the client has a prefix of it) and the proxy
serves the next one.

Exact cuts inside a frame need a peer that writes where it is told, which a real broker
cannot be made to do: ``FetchBroker`` is a stand-in (a FAKE, named as such).
"""

from __future__ import annotations

import random
import struct
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from kproxy.codecs import api_keys
from kproxy.codecs.interpreter import UNKNOWN_TAGS, decode_top_level_tags
from kproxy.codecs.messages import encode_response_parts
from kproxy.codecs.peek import peek_request
from kproxy.codecs.primitives import Reader
from kproxy.codecs.registry import DECODED
from kproxy.embedded_broker import TansuBroker
from kproxy.policies.rewrite import PAD_TAG
from kproxy.runtime.server import Proxy
from kproxy.session import relay, splice
from kproxy.session import streamed as streamed_module
from kproxy.session.relay import RECV_BYTES
from kproxy.session.streamed import SKELETON_BYTES

from ..support import RawClient, produce_and_read_back
from .test_proxy_inprocess import start_proxy
from .test_security import metric
from .test_splice import (
    THRESHOLD,
    SplitEchoBroker,
    filler,
    local_request,
    until,
)

pytestmark = pytest.mark.skipif(not splice.AVAILABLE, reason="splice is Linux only")

SPEC = DECODED[api_keys.FETCH].response
NODE = 111  # the fake's node, in the proxy's default node-id range (111-111)
OUT_OF_RANGE = 5  # a node outside it: left out of rewritten responses by design
UNSUPPORTED_VERSION = 35


# ------------------------------------------------------------------------ responses


@dataclass(frozen=True)
class Part:
    """One partition of a response to build."""

    records: int | None  # bytes of records; None: null records
    aborted: int | None = None  # aborted transactions; None: a null array
    leader: bool = False  # carries the current_leader tagged field
    error: int = 0


@dataclass
class Built:
    """A response frame (size prefix first, correlation id 0) and where its parts are."""

    wire: bytes
    heads: list[int]  # offset of each partition's head
    records: list[tuple[int, int]]  # (start, end) of each non-empty records run
    tail: int  # offset of the top-level tagged section

    def with_cid(self, cid: int) -> bytes:
        return self.wire[:4] + struct.pack(">i", cid) + self.wire[8:]


def endpoint(node: int, host: str, port: int, rack: str | None = None) -> dict[str, Any]:
    return {"node_id": node, "host": host, "port": port, "rack": rack}


def build(version: int, shape: list[list[Part]], seed: int = 0,
          endpoints: list[dict[str, Any]] | None = None,
          unknown: dict[int, bytes] | None = None) -> Built:
    """A Fetch response of ``shape`` (topics of partitions); NodeEndpoints and unknown
    top-level tags when given. Offsets are found in the bytes, not taken from a walk."""
    marks: list[int] = []
    runs: list[bytes] = []
    topics = []
    for t, parts in enumerate(shape):
        partitions = []
        for i, part in enumerate(parts):
            mark = 0x5EED_0000_0000 + 100 * seed + len(marks)  # high watermark, findable
            marks.append(mark)
            records = None if part.records is None else filler(part.records, seed * 97
                                                                + len(marks))
            if records:
                runs.append(records)
            p: dict[str, Any] = {
                "partition_index": i, "error_code": part.error, "high_watermark": mark,
                "last_stable_offset": mark - 1, "log_start_offset": 3,
                "aborted_transactions": None if part.aborted is None else [
                    {"producer_id": 4000 + k, "first_offset": 10 * k}
                    for k in range(part.aborted)],
                "preferred_read_replica": -1, "records": records}
            if part.leader:
                p["current_leader"] = {"leader_id": NODE, "leader_epoch": 7 + i}
            partitions.append(p)
        topics.append({"topic_id": uuid.UUID(int=seed * 16 + t + 1), "partitions": partitions})
    body: dict[str, Any] = {"throttle_time_ms": 0, "error_code": 0, "session_id": 99,
                            "responses": topics}
    plain = encode_response_parts(api_keys.FETCH, version, 0, body)
    assert plain[-1] == 0, "a response without tags ends with an empty tagged section"
    tail = 4 + len(plain) - 1
    if endpoints is not None:
        body["node_endpoints"] = endpoints
    if unknown:
        body[UNKNOWN_TAGS] = unknown
    raw = encode_response_parts(api_keys.FETCH, version, 0, body)
    assert raw[: tail - 4] == plain[: tail - 4]
    wire = struct.pack(">i", len(raw)) + raw
    heads = [wire.index(struct.pack(">q", mark)) - 6 for mark in marks]
    where = []
    for run in runs:
        start = wire.index(run, 8)
        where.append((start, start + len(run)))
    return Built(wire, heads, where, tail)


def cut_points(b: Built, dense: bool = True) -> list[int]:
    """Where the broker cuts its write: every byte of the start (``dense``), around each
    partition head and each records run, around the tagged section, before the end."""
    size = len(b.wire)
    wanted = set(range(1, 61)) if dense else {1, 4, 7, 8, 9, 12, 23, 37}
    for h in b.heads:
        wanted |= {h - 1, h, h + 1, h + 31}
    for start, end in b.records:
        wanted |= {start - 1, start, start + 1, (start + end) // 2, end - 1, end, end + 1}
    wanted |= {b.tail - 1, b.tail, b.tail + 1, b.tail + 5, size - 1}
    return sorted(c for c in wanted if 0 < c < size)


def fetch_request(cid: int, version: int) -> bytes:
    """A Fetch request frame: the proxy reads only its header (no handler reads Fetch
    requests; its body goes upstream as bytes), so the body is filler."""
    body = struct.pack(">hhih", api_keys.FETCH, version, cid, 1) + b"t" + b"\x00"
    body += filler(48, 3)
    return struct.pack(">i", len(body)) + body


# --------------------------------------------------------------------------- broker


@dataclass
class Reply:
    wire: bytes
    cut: int = 0  # 0: written whole
    hold: bool = False  # kept back, written with the next reply not held, in one write


@dataclass
class FetchBroker(SplitEchoBroker):
    """STAND-IN BROKER (a fake): answers each Fetch request with the reply the test
    planned for its correlation id, cut where it says (the first piece written once the
    proxy holds nothing, the second once it holds the first: the proxy really sees the
    frame cut there), or held back and written in one write with the next reply.
    Everything else (ApiVersions, Metadata for discovery) the scripted ``FakeBroker``
    answers, as in ``test_splice``."""

    plan: dict[int, Reply] = field(default_factory=dict)
    held_back: list[bytes] = field(default_factory=list)

    async def _answer(self, stream: trio.SocketStream, wire: bytes) -> None:
        peek = peek_request(wire[4:])
        if peek.api_key != api_keys.FETCH:
            await super()._answer(stream, wire)
            return
        self.received.append(wire)
        reply = self.plan.pop(peek.correlation_id)
        if reply.hold:
            self.held_back.append(reply.wire)
            return
        data = b"".join(self.held_back) + reply.wire
        self.held_back.clear()
        if not reply.cut:
            await stream.send_all(data)
            return
        cut = len(data) - len(reply.wire) + reply.cut
        await until(lambda: self.held() == 0, "the proxy holds nothing")
        await stream.send_all(data[:cut])
        await until(lambda: self.held() > 0, "the proxy took the first piece")
        await stream.send_all(data[cut:])


@pytest.fixture
def streamed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The correlation ids of the responses relayed by ``stream_through`` (a spy: the
    real function does the work)."""
    cids: list[int] = []
    real = streamed_module.stream_through  # the function relay.py calls by this name

    async def spy(session: Any, upstream: Any, reader: Any, charge: Any, slot: Any,
                  *rest: Any) -> None:
        cids.append(slot.correlation_id)
        await real(session, upstream, reader, charge, slot, *rest)

    monkeypatch.setattr(relay, "stream_through", spy)
    return cids


async def start(nursery: trio.Nursery, path: str = "splice") -> tuple[Proxy, FetchBroker]:
    """The proxy in front of the stand-in broker; ``path`` "copy" turns splice off (as
    on TLS, or when the pipe pool is spent: the records are copied through a buffer)."""
    box: list[Proxy] = []
    broker = FetchBroker(lambda: box[0].budget.used)
    await broker.start(nursery)
    splice_from = THRESHOLD if path == "splice" else 0
    proxy = await start_proxy(nursery, broker.fake.bootstrap, splice_from=splice_from)
    box.append(proxy)
    assert proxy.config.splice_from == splice_from
    return proxy, broker


PATHS = ["splice", "copy"]


async def exchange(client: RawClient, broker: FetchBroker, cid: int, version: int,
                   reply: Reply) -> bytes:
    """One Fetch request and its response as the client received it (size prefix too)."""
    broker.plan[cid] = reply
    await client.send(fetch_request(cid, version))
    frame = await client.read_frame()
    assert frame is not None, f"connection closed (correlation id {cid})"
    return struct.pack(">i", len(frame)) + frame


async def finish(proxy: Proxy) -> None:
    await until(lambda: not proxy.sessions, "every session ended")
    assert await metric(proxy, "kproxy_internal_errors_total") == 0
    assert proxy.budget.used == 0
    proxy.shutdown()


def differs(a: bytes, b: bytes) -> int:
    """The first offset where ``a`` and ``b`` differ (the shorter's length if one is a
    prefix of the other)."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def tags_of(wire: bytes, b: Built, version: int) -> dict[str, Any]:
    return dict(decode_top_level_tags(SPEC, version, Reader(wire[b.tail :])))


def check_rewritten(got: bytes, sent: bytes, b: Built, version: int,
                    endpoints: list[dict[str, Any]] | None, kept: dict[int, bytes],
                    padded: bool, what: str) -> None:
    """``got`` is ``sent`` with its tagged section rewritten in place: ``endpoints``
    (None: left out), the unknown tags ``kept``, and (``padded``) padding of zeros."""
    assert len(got) == len(sent), f"{what}: size changed"
    assert got[: b.tail] == sent[: b.tail], f"{what}: changed before the tagged section"
    tags = tags_of(got, b, version)
    unknown = dict(tags.pop(UNKNOWN_TAGS, {}))
    pad = unknown.pop(PAD_TAG, None)
    assert unknown == kept, f"{what}: unknown tags {unknown}"
    if endpoints is None:
        assert tags == {}, f"{what}: {tags}"
        assert pad is not None, f"{what}: dropped endpoints without padding"
    else:
        assert tags == {"node_endpoints": endpoints}, f"{what}: {tags}"
    assert (pad is not None) is padded, f"{what}: padding {pad!r}"
    if pad is not None:
        assert pad == bytes(len(pad)), f"{what}: padding is not zeros"


# ------------------------------------------------------------------------ the cases


SHAPES: dict[str, list[list[Part]]] = {
    "1x1": [[Part(70_000)]],
    "2x3": [[Part(100_000, aborted=2, leader=True), Part(None, error=6, leader=True),
             Part(0, aborted=0)],
            [Part(150_000, leader=True), Part(50_000, aborted=1), Part(1_000)]],
    "3x1-3": [[Part((1 << 20) + 3, aborted=3, leader=True), Part(10)],
              [Part(5_000, aborted=0)],
              [Part(None), Part(20_000, leader=True), Part(1, aborted=1)]],
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("version", [16, 17, 18])
async def test_responses_without_endpoints_arrive_byte_identical(
        nursery: trio.Nursery, streamed: list[int], version: int, path: str) -> None:
    """Every shape cut at every point: the client receives exactly the broker's bytes,
    and each response was streamed (all those over one receive buffer, and, spliced,
    those whose first piece held the size and correlation id)."""
    proxy, broker = await start(nursery, path)
    client = await RawClient.connect(proxy.bootstrap_port or 0)
    before = splice.PIPES.frames
    cid, must = 0, set()
    for n, (name, shape) in enumerate(SHAPES.items()):
        b = build(version, shape, seed=n)
        assert len(b.wire) >= THRESHOLD
        for cut in cut_points(b, dense=version == 16):
            cid += 1
            sent = b.with_cid(cid)
            got = await exchange(client, broker, cid, version, Reply(sent, cut))
            assert got == sent, f"{name} v{version} cut at {cut}: arrived changed " \
                f"({len(got)} bytes of {len(sent)}, first difference at {differs(got, sent)})"
            if len(sent) > RECV_BYTES + 8 or (cut >= 8 and path == "splice"):
                must.add(cid)
    await client.aclose()
    print(f"{cid} responses, {len(streamed)} streamed")
    assert must <= set(streamed), sorted(must - set(streamed))
    assert set(streamed) <= set(range(1, cid + 1))
    assert splice.PIPES.frames - before == (len(streamed) if path == "splice" else 0)
    await finish(proxy)


ENDPOINT_SHAPE = [[Part(300_000, leader=True)],  # over one receive: always streamed
                  [Part(30_000, aborted=1), Part(None, error=6, leader=True)]]


@pytest.mark.parametrize("path", PATHS)
async def test_node_endpoints_rewritten_in_place(nursery: trio.Nursery,
                                                 streamed: list[int], path: str) -> None:
    """NodeEndpoints of a streamed response: the same size, the same bytes up to the
    tagged section, and in it the broker at the proxy's address (padded when the
    address is shorter), or, when the proxy's address would not fit, no endpoints and
    the padding tag. An unknown top-level tag is kept; an out-of-range node left out."""
    proxy, broker = await start(nursery, path)
    host, port = proxy.config.port_map.advertised(NODE) or ("", 0)
    assert host == "127.0.0.1" and port == proxy.config.broker_port_base
    real_port = broker.fake.ports[NODE]
    long_host = "broker-111.kafka-cluster.eu-west-1.internal.example.com"
    variants: list[tuple[str, list[dict[str, Any]], dict[int, bytes],
                         list[dict[str, Any]] | None, bool]] = [
        # (name, the broker's endpoints, its unknown tags, the endpoints expected, padded)
        ("same length", [endpoint(NODE, "127.0.0.1", real_port)], {},
         [endpoint(NODE, host, port)], False),
        ("long host", [endpoint(OUT_OF_RANGE, "b5", 9092),
                       endpoint(NODE, long_host, 9092, "rack-a")],
         {7: b"a future field"}, [endpoint(NODE, host, port, "rack-a")], True),
        ("short host", [endpoint(NODE, "b", 9092)], {}, None, True),
    ]
    out_of_range = proxy.metrics.node_out_of_range._value.get()
    client = await RawClient.connect(proxy.bootstrap_port or 0)
    before = splice.PIPES.frames
    cid = 0
    for n, (name, eps, unknown, expected, padded) in enumerate(variants):
        b = build(16, ENDPOINT_SHAPE, seed=10 + n, endpoints=eps, unknown=unknown)
        original = tags_of(b.wire, b, 16)
        assert original["node_endpoints"] == eps  # what the broker sent names a broker
        for cut in cut_points(b, dense=False):
            cid += 1
            sent = b.with_cid(cid)
            got = await exchange(client, broker, cid, 16, Reply(sent, cut))
            check_rewritten(got, sent, b, 16, expected, unknown, padded,
                            f"{name}, cut at {cut}")
            assert cid in streamed, f"{name}, cut at {cut}: not streamed"
        for version in (17, 18):
            b = build(version, ENDPOINT_SHAPE, seed=10 + n, endpoints=eps, unknown=unknown)
            cid += 1
            sent = b.with_cid(cid)
            got = await exchange(client, broker, cid, version, Reply(sent, b.tail + 1))
            check_rewritten(got, sent, b, version, expected, unknown, padded,
                            f"{name} v{version}")
            assert cid in streamed
    await client.aclose()
    assert len(streamed) == cid
    assert splice.PIPES.frames - before == (cid if path == "splice" else 0)
    assert proxy.metrics.node_out_of_range._value.get() > out_of_range
    await finish(proxy)


async def test_interleaved_with_small_and_local_answers(nursery: trio.Nursery,
                                                        streamed: list[int]) -> None:
    """Large streamed responses, each followed in the same broker write by a small one,
    with answers the proxy makes itself between: all in request order, intact."""
    proxy, broker = await start(nursery)
    host, port = proxy.config.port_map.advertised(NODE) or ("", 0)
    big = build(16, [[Part(2_000_000, aborted=1, leader=True)], [Part(9_000)]], seed=20)
    small = build(16, [[Part(150)]], seed=21)
    eps = [endpoint(NODE, "broker-111.kafka-cluster.internal.example.com", 9092)]
    named = build(16, [[Part(700_000)], [Part(80_000, leader=True), Part(None)]],
                  seed=22, endpoints=eps)
    # (cid, what, the broker's reply (None: the proxy answers), held back to go out in
    # one write with the next reply)
    plan: list[tuple[int, str, Built | None, bool]] = [
        (1, "big", big, True), (2, "local", None, False), (3, "small", small, False),
        (4, "named", named, True), (5, "local", None, False), (6, "small", small, False),
        (7, "local", None, False), (8, "big", big, False), (9, "local", None, False)]
    wires = []
    for cid, _, b, hold in plan:
        if b is None:
            wires.append(local_request(cid))
        else:
            broker.plan[cid] = Reply(b.with_cid(cid), hold=hold)
            wires.append(fetch_request(cid, 16))
    client = await RawClient.connect(proxy.bootstrap_port or 0)
    async with trio.open_nursery() as inner:
        inner.start_soon(client.send, b"".join(wires))
        for cid, what, b, _ in plan:
            frame = await client.read_frame()
            assert frame is not None, f"connection closed before {cid}"
            got = struct.pack(">i", len(frame)) + frame
            assert struct.unpack_from(">i", got, 4)[0] == cid, "answers out of order"
            if b is None:
                assert struct.unpack_from(">h", got, 8)[0] == UNSUPPORTED_VERSION
            elif what == "named":
                check_rewritten(got, b.with_cid(cid), b, 16, [endpoint(NODE, host, port)],
                                {}, True, "named")
            else:
                assert got == b.with_cid(cid), f"{what} {cid} arrived changed"
    await client.aclose()
    assert broker.received == [w for w in wires if peek_request(w[4:]).api_key
                               == api_keys.FETCH]
    assert {1, 4, 8} <= set(streamed) and not {3, 6} & set(streamed), streamed
    await finish(proxy)


def _patched(wire: bytes, at: int, new: bytes) -> bytes:
    """``wire`` with ``new`` written over its bytes from ``at`` (its size unchanged)."""
    return wire[:at] + new + wire[at + len(new) :]


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def malformed() -> list[tuple[str, bytes, int]]:
    """(what is wrong, the response, how many of its bytes the client gets at least:
    those before the first wrong byte that were spliced or must have been sent)."""
    out = []
    # Records whose length runs past the frame's end (same varint size, larger value).
    b = build(16, [[Part(300_000)]], seed=30)
    start, end = b.records[0]
    length = _uvarint(300_000 + 1)
    longer = _uvarint(300_000 + 1 + 400_000)
    assert len(longer) == len(length) and b.wire[start - len(length) : start] == length
    out.append(("records past the end", _patched(b.wire, start - len(length), longer), 0))
    # Garbage in the skeleton after the first records: a varint longer than 5 bytes
    # where the partition's tagged section starts.
    b = build(16, [[Part(300_000), Part(40_000)], [Part(1_000)]], seed=31)
    start, end = b.records[0]
    out.append(("garbage after records", _patched(b.wire, end, b"\x80" * 6), end))
    # A huge partition count after the first records.
    b = build(16, [[Part(300_000)], [Part(40_000)]], seed=32)
    start, end = b.records[0]
    count_at = b.heads[1] - 1  # the second topic's partition count
    out.append(("partition count", _patched(b.wire, count_at, b"\xff\xff\xff\x7f"), end))
    # A frame that ends where its top-level tagged section should be.
    b = build(16, [[Part(300_000)], [Part(40_000)]], seed=33)
    raw = b.wire[4:-1]
    out.append(("no tagged section", struct.pack(">i", len(raw)) + raw, b.records[-1][1]))
    # A NodeEndpoints tag whose value cannot be read.
    b = build(16, [[Part(300_000)], [Part(40_000)]], seed=34)
    raw = b.wire[4 : b.tail] + b"\x01\x00\x03\xff\xff\xff"
    out.append(("unreadable endpoints", struct.pack(">i", len(raw)) + raw,
                b.records[-1][1]))
    return out


async def test_a_malformed_response_ends_its_connection_only(nursery: trio.Nursery,
                                                             streamed: list[int]) -> None:
    """Each malformed streamed response: the client gets a prefix of it, then the
    connection closes; the proxy counts a decode error and serves the next connection
    (a good streamed response arrives intact)."""
    proxy, broker = await start(nursery)
    good = build(16, SHAPES["2x3"], seed=40)
    cid = 0
    for what, wire, at_least in malformed():
        assert len(wire) > RECV_BYTES  # more than one receive: pending, so streamed
        errors = await metric(proxy, "kproxy_decode_errors_total")
        client = await RawClient.connect(proxy.bootstrap_port or 0)
        cid += 1
        broker.plan[cid] = Reply(_patched(wire, 4, struct.pack(">i", cid)))
        sent = broker.plan[cid].wire
        await client.send(fetch_request(cid, 16))
        got = b""
        with trio.fail_after(10):
            try:
                while data := await client.stream.receive_some(1 << 16):
                    got += data
            except trio.BrokenResourceError:
                pass  # a reset is a close too
        await client.aclose()
        print(f"{what}: {len(got)} of {len(sent)} bytes, then closed")
        assert cid in streamed, f"{what}: not streamed"
        assert len(got) < len(sent), f"{what}: the whole frame went out"
        assert got == sent[: len(got)], f"{what}: not a prefix of what the broker sent"
        assert len(got) >= at_least, f"{what}: {len(got)} bytes, fewer than {at_least}"
        await until(lambda: not proxy.sessions, f"{what}: the session ended")
        assert await metric(proxy, "kproxy_decode_errors_total") == errors + 1, what
        # The proxy goes on: a new connection gets a good streamed response.
        client = await RawClient.connect(proxy.bootstrap_port or 0)
        cid += 1
        ok = good.with_cid(cid)
        assert await exchange(client, broker, cid, 16, Reply(ok, 100)) == ok, what
        assert cid in streamed
        await client.aclose()
    await finish(proxy)


@pytest.mark.broker
async def test_megabyte_messages_at_fetch_v16_through_a_real_broker(
        nursery: trio.Nursery, tmp_path: Path, streamed: list[int]) -> None:
    """confluent-kafka produces 1 MB messages (and small ones between) through the proxy
    to tansu and consumes them back at the Fetch version it picks (v16 or later): the
    large responses are streamed, and every message arrives intact."""
    rng = random.Random(12)
    values = [rng.randbytes(rng.choice([100, 70_000, 1_000_000, 1_000_003]))
              for _ in range(24)]
    with TansuBroker(log_path=tmp_path / "tansu.log") as broker:
        proxy = await start_proxy(nursery, broker.bootstrap)
        got = await trio.to_thread.run_sync(
            produce_and_read_back, f"127.0.0.1:{proxy.bootstrap_port}", "big16", values)
        assert got == values
        assert streamed, "no Fetch response was streamed"
        assert await metric(proxy, "kproxy_internal_errors_total") == 0
        proxy.shutdown()


@pytest.mark.parametrize("path", PATHS)
async def test_a_slow_reader_of_a_50_mb_streamed_fetch_stays_within_the_budget(
        nursery: trio.Nursery, streamed: list[int], path: str) -> None:
    """A 50 MB Fetch v16 response with NodeEndpoints, read by the client in small
    pieces: the proxy holds at most a receive buffer, a pipe (or, copying, one more
    buffer) and the skeleton of the budget, never the response, and the response
    arrives whole with its tagged section rewritten in place."""
    proxy, broker = await start(nursery, path)
    host, port = proxy.config.port_map.advertised(NODE) or ("", 0)
    long_host = "broker-111.kafka-cluster.eu-west-1.internal.example.com"
    b = build(16, [[Part(50 << 20, leader=True)]], seed=30,
              endpoints=[endpoint(NODE, long_host, 9092)])
    sent = b.with_cid(1)
    broker.plan[1] = Reply(sent)
    stream = await trio.open_tcp_stream("127.0.0.1", proxy.bootstrap_port or 0)
    await stream.send_all(fetch_request(1, 16))
    bound = 2 * RECV_BYTES + splice.PIPE_BYTES + SKELETON_BYTES
    got = bytearray()
    with trio.fail_after(120):
        while len(got) < len(sent):
            data = await stream.receive_some(64 * 1024)
            assert data, f"closed after {len(got)} of {len(sent)} bytes"
            got += data
            assert proxy.budget.used <= bound
    assert streamed == [1]
    check_rewritten(bytes(got), sent, b, 16, [endpoint(NODE, host, port)], {}, True,
                    "50 MB")
    print(f"budget peak {proxy.budget.peak / 2**20:.2f} MiB for a "
          f"{len(got) / 2**20:.0f} MiB response ({path})")
    assert proxy.budget.peak <= bound
    await stream.aclose()
    await finish(proxy)
