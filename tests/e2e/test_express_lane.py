"""The express lane (kproxy.session.parked.express): busy sessions' small frames relayed by a
thread of the proxy's own, off trio's scheduling, with the same answers.

Most tests use the named stand-in ``tests/fake_broker.FakeBroker`` (a broker set that
changes, a client that stops reading); the last one uses real parts only: librdkafka,
`kproxy run` and tansu. The parking tests (tests/e2e/test_parking.py) run with the lane
on too, which is the default: a drain, the idle timeout, a close and a backend going
away reach a session the lane holds as they reach an idle parked one.
"""

from __future__ import annotations

import select
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from kproxy.codecs import api_keys
from kproxy.codecs.messages import decode_response
from kproxy.codecs.otlp.small import SMALL_POINTS
from kproxy.embedded_broker import TansuBroker
from kproxy.runtime.server import Proxy

from ..fake_broker import FakeBroker
from ..otlp_samples import librdkafka_like_payload
from ..support import RawClient, encode_request, push_body, value_of
from .test_parking import all_ended, closed_by_proxy, connected, parked, parked_gauge, session_tasks
from .test_parking import start_proxy as start_parking_proxy
from .test_proxy_inprocess import METADATA_V12

TOPICS: dict[str, Any] = {
    "topics": [{"topic_id": str(uuid.UUID(int=0)), "name": f"t{i:05}"} for i in range(6000)],
    "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}


@pytest.fixture
async def fake(nursery: trio.Nursery) -> AsyncIterator[FakeBroker]:
    yield await FakeBroker(node_ids=[0, 1]).start(nursery)


async def start_proxy(nursery: trio.Nursery, upstream: str, **overrides: object) -> Proxy:
    # Discovery seldom: what the tests show comes through the sessions' own answers.
    return await start_parking_proxy(nursery, upstream, discovery_interval="600",
                                     **overrides)


def lane_requests(proxy: Proxy) -> float:
    return proxy.metrics.registry.get_sample_value("kproxy_express_lane_requests_total") or 0


def handbacks(proxy: Proxy) -> float:
    return proxy.metrics.registry.get_sample_value("kproxy_express_lane_handbacks_total") or 0


async def warmed(proxy: Proxy, client: RawClient) -> None:
    """One Metadata round trip, and the session parked again: the first answer after
    discovery may be handed back once, while the broker listeners catch up with it."""
    await metadata(client, 1000)
    await parked(proxy)


async def metadata(client: RawClient, cid: int) -> dict[str, Any]:
    resp = await client.request(api_keys.METADATA, 12, cid, METADATA_V12)
    assert resp.header.correlation_id == cid
    return resp.body


async def cut_mid_frame(proxy: Proxy, client: RawClient, cid: int) -> bytes:
    """Send the start of a Metadata request, which the lane cannot relay: wait until it
    hands the session back to trio; the rest of the request, to send next."""
    handed = handbacks(proxy)
    cut = encode_request(api_keys.METADATA, 12, cid, METADATA_V12)
    await client.send(cut[:7])
    with trio.fail_after(10):
        while handbacks(proxy) == handed:
            await trio.sleep(0.01)
    return cut[7:]


async def test_a_busy_session_stays_parked_while_the_lane_answers_in_order(
        nursery: trio.Nursery, fake: FakeBroker) -> None:
    proxy = await start_proxy(nursery, fake.bootstrap)
    assert proxy.parking.lane_running
    client = await connected(proxy)
    await parked(proxy)
    (session,) = proxy.sessions
    await warmed(proxy, client)
    before, handed = lane_requests(proxy), handbacks(proxy)
    for cid in range(2, 202):  # back to back: it never idles, and never needs trio
        body = await metadata(client, cid)
        assert [b["port"] for b in body["brokers"]] == [
            proxy.config.broker_port_base + n for n in (0, 1)]
        assert session.parked and session_tasks() == 0
    # Pipelined requests, answered in order from one receive.
    await client.send(b"".join(encode_request(api_keys.METADATA, 12, cid, METADATA_V12)
                               for cid in range(300, 340)))
    for cid in range(300, 340):
        frame = await client.read_frame()
        assert frame is not None and int.from_bytes(frame[:4], "big") == cid
    assert lane_requests(proxy) - before == 240 and handbacks(proxy) == handed
    assert session.parked and proxy.sessions == {session}
    await client.aclose()
    proxy.shutdown()


async def test_a_session_the_lane_keeps_busy_outlives_the_idle_timeout_then_meets_it(
        nursery: trio.Nursery, fake: FakeBroker) -> None:
    """The lane moves a parked session's last activity without a new deadline entry;
    the entry that comes due is put back at the latest activity. Busy for well over
    the idle timeout, the session stays open; quiet, it is closed on time."""
    proxy = await start_proxy(nursery, fake.bootstrap, idle_timeout="1.0")
    client = await connected(proxy)
    await parked(proxy)
    await warmed(proxy, client)
    (session,) = proxy.sessions
    before = lane_requests(proxy)
    began = trio.current_time()
    cid = 2
    while True:  # 2.5 idle timeouts, a request every 50 ms
        await metadata(client, cid)
        cid += 1
        # The proxy's last activity is at or before the answer's arrival here.
        quiet = trio.current_time()
        if quiet - began >= 2.5:
            break
        await trio.sleep(0.05)
    assert lane_requests(proxy) - before == cid - 2 and session.parked
    await closed_by_proxy(client)
    # Closed one idle timeout after the last answer, less the answer's way to this
    # client (well under 50 ms), and not a whole timeout late.
    assert 0.95 <= trio.current_time() - quiet < 2.5
    assert proxy.metrics.limits_hit.labels("idle_timeout")._value.get() == 1
    proxy.shutdown()


async def test_frames_the_lane_does_not_take_are_finished_by_the_sessions_tasks(
        nursery: trio.Nursery, fake: FakeBroker) -> None:
    """A request cut across receives, one larger than a lane receive, and one answered
    locally: the lane hands each to the session's tasks with what it received, the
    answers come in order, and the session returns to the lane."""
    proxy = await start_proxy(nursery, fake.bootstrap)
    client = await connected(proxy)
    await parked(proxy)
    await warmed(proxy, client)
    rest = await cut_mid_frame(proxy, client, 2)
    await client.send(rest)
    assert (await client.read_frame()) is not None
    large = encode_request(api_keys.METADATA, 12, 3, TOPICS)
    assert len(large) > 64 * 1024  # more than one receive of the lane
    small = encode_request(api_keys.METADATA, 12, 4, METADATA_V12)
    local = encode_request(api_keys.API_VERSIONS, 0, 5, {})  # answered by the proxy
    await client.send(large + small + local)
    for cid in (3, 4, 5):
        frame = await client.read_frame()
        assert frame is not None and int.from_bytes(frame[:4], "big") == cid
    await parked(proxy)  # after a few requests in the lane's place, it parks again
    before = lane_requests(proxy)
    for cid in range(10, 20):
        await metadata(client, cid)
    assert lane_requests(proxy) - before == 10
    await client.aclose()
    proxy.shutdown()


def lot_masks(proxy: Proxy, fds: tuple[int, ...]) -> dict[int, int]:
    """The event mask of each of ``fds`` in the parking lot's epoll, as the kernel holds
    it (/proc/self/fdinfo of the epoll descriptor: one ``tfd:`` line per registration)."""
    epoll = proxy.parking._epoll
    assert epoll is not None
    masks = {}
    for line in Path(f"/proc/self/fdinfo/{epoll.fileno()}").read_text().splitlines():
        if line.startswith("tfd:"):
            fields = line.split()
            fd, mask = int(fields[1]), int(fields[3], 16)
            if fd in fds:
                masks[fd] = mask
    return masks


async def test_the_lane_relays_without_re_arming_and_disarms_what_it_hands_back(
        nursery: trio.Nursery, fake: FakeBroker) -> None:
    """While the lane holds a session its descriptors stay armed, level-triggered, so no
    request costs a re-arm; when the lane hands the session to trio it disarms both,
    or the level-triggered descriptors would keep reporting while trio runs it."""
    proxy = await start_proxy(nursery, fake.bootstrap)
    client = await connected(proxy)
    await parked(proxy)
    await warmed(proxy, client)
    (session,) = proxy.sessions
    fds = session.parking_fds()
    armed = lot_masks(proxy, fds)
    assert len(armed) == 2 and all(
        m & select.EPOLLIN and not m & select.EPOLLONESHOT for m in armed.values())
    for cid in range(2, 12):
        await metadata(client, cid)
    assert lot_masks(proxy, fds) == armed and session.parked
    rest = await cut_mid_frame(proxy, client, 20)
    assert not session.parked
    assert all(not m & select.EPOLLIN for m in lot_masks(proxy, fds).values())
    await client.send(rest)
    assert (await client.read_frame()) is not None
    await parked(proxy)
    assert lot_masks(proxy, fds) == armed
    await client.aclose()
    proxy.shutdown()


class SpawnedTasks(trio.abc.Instrument):
    """The names of the tasks trio starts while it is installed."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.names.append(task.name)


async def test_a_client_that_leaves_while_the_lane_holds_it_is_closed_without_a_task(
        nursery: trio.Nursery, fake: FakeBroker) -> None:
    """The usual end of a short connection: the lane reads the end of the client's
    stream, and the session is closed where the lane hands it back, as its tasks would
    have closed it, but without starting them again."""
    proxy = await start_proxy(nursery, fake.bootstrap)
    records: list[object] = []
    proxy.events.on_connection_closed.append(records.append)
    client = await connected(proxy)
    await parked(proxy)
    await warmed(proxy, client)
    spawned = SpawnedTasks()
    trio.lowlevel.add_instrument(spawned)
    try:
        await client.aclose()
        await all_ended(proxy)
    finally:
        trio.lowlevel.remove_instrument(spawned)
    assert not any(name.endswith("Session.resume") for name in spawned.names), spawned.names
    assert len(records) == 1 and proxy.admission.open == 0
    assert not proxy.parking and parked_gauge(proxy) == 0
    assert proxy.metrics.connections_active.labels("bootstrap")._value.get() == 0
    proxy.shutdown()


async def test_a_session_whose_requests_need_trio_backs_off(
        nursery: trio.Nursery, fake: FakeBroker) -> None:
    """Every request larger than a lane receive: after two short runs in the lane the
    session stays with its tasks, instead of parking and waking for each request."""
    proxy = await start_proxy(nursery, fake.bootstrap)
    client = await connected(proxy)
    await parked(proxy)
    await warmed(proxy, client)
    handed = handbacks(proxy)
    for cid in range(2, 30):
        await client.send(encode_request(api_keys.METADATA, 12, cid, TOPICS))
        frame = await client.read_frame()
        assert frame is not None and int.from_bytes(frame[:4], "big") == cid
    assert handbacks(proxy) - handed <= 3  # two short runs, then the session backs off
    await client.aclose()
    proxy.shutdown()


async def test_a_client_that_stops_reading_gets_every_answer_once_it_reads(
        nursery: trio.Nursery, fake: FakeBroker) -> None:
    """Answers the kernel does not take (the client's receive buffer is full) wait for
    the session's tasks, in order, and nothing is lost or repeated."""
    proxy = await start_proxy(nursery, fake.bootstrap)
    client = await connected(proxy)
    await parked(proxy)
    await warmed(proxy, client)
    handed = handbacks(proxy)
    sock = client.stream.socket
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    burst = b"".join(encode_request(api_keys.METADATA, 12, cid, METADATA_V12)
                     for cid in range(2, 2002))
    await client.send(burst)
    with trio.fail_after(10):
        while handbacks(proxy) == handed:  # a write was left for the session's tasks
            await trio.sleep(0.01)
    for cid in range(2, 2002):
        frame = await client.read_frame()
        assert frame is not None and int.from_bytes(frame[:4], "big") == cid
    await client.aclose()
    proxy.shutdown()


async def test_a_new_broker_in_an_answer_has_its_listener_before_the_client_sees_it(
        nursery: trio.Nursery, fake: FakeBroker) -> None:
    fake.hidden = {1}
    proxy = await start_proxy(nursery, fake.bootstrap)
    client = await connected(proxy)
    await parked(proxy)
    await warmed(proxy, client)
    handed = handbacks(proxy)
    await metadata(client, 2)  # broker 0 only, in the lane
    assert handbacks(proxy) == handed
    fake.hidden = set()
    body = await metadata(client, 3)
    port = proxy.config.broker_port_base + 1
    assert port in [b["port"] for b in body["brokers"]]
    stream = await trio.open_tcp_stream("127.0.0.1", port)  # no wait: already listening
    await stream.aclose()
    assert handbacks(proxy) == handed + 1  # the lane left the change to trio
    await client.aclose()
    proxy.shutdown()


async def test_a_response_the_lane_cannot_read_ends_the_session_as_on_the_trio_path(
        nursery: trio.Nursery) -> None:
    """A Metadata answer that does not decode (a broker at fault, the named stand-in):
    the session closes, and the decode error is counted and logged once."""
    garbage = (7).to_bytes(4, "big") + b"\xff" * 9  # correlation id 7, then no Metadata
    fake = await FakeBroker(node_ids=[0], canned={api_keys.METADATA: (12, garbage)}).start(
        nursery)
    proxy = await start_proxy(nursery, fake.bootstrap)
    client = await connected(proxy)
    await parked(proxy)
    await client.send(encode_request(api_keys.METADATA, 12, 7, METADATA_V12))
    assert await client.read_frame() is None  # closed, nothing relayed
    errors = proxy.metrics.registry.get_sample_value(
        "kproxy_decode_errors_total", {"api": "frame", "side": "response"})
    assert errors == 1 and handbacks(proxy) == 1
    await client.aclose()
    proxy.shutdown()


def push(got: dict[str, object], cid: int, points: int) -> bytes:
    """A PushTelemetry request for the instance ``got`` (a Get's answer), uncompressed."""
    return encode_request(api_keys.PUSH_TELEMETRY, 0, cid,
                          push_body(got, librdkafka_like_payload(points)))


async def pipelined(client: RawClient, requests: list[bytes], cids: list[int]
                    ) -> list[bytes]:
    """Send ``requests`` in one write; their answers, checked to come in order."""
    await client.send(b"".join(requests))
    frames = []
    for cid in cids:
        frame = await client.read_frame()
        assert frame is not None and int.from_bytes(frame[:4], "big") == cid
        frames.append(frame)
    return frames


async def test_telemetry_is_answered_in_the_lane_in_order(
        nursery: trio.Nursery, fake: FakeBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Get and a small push between relayed requests are answered by the lane, in
    order and without a hand-back, and the push listeners still run in trio's thread.
    A push too large to decode at once (an answer made later) is left to trio as the
    lane decided it, answered in its place, and the session returns to the lane.

    The lane's work budget is lifted here: on a busy machine decoding the push can pass
    ``LOCAL_WORK_S`` and rightly hand the rest to trio, which is the next test's case."""
    from kproxy.session.parked import express

    monkeypatch.setattr(express, "LOCAL_WORK_S", 60.0)
    proxy = await start_proxy(nursery, fake.bootstrap)
    assert proxy.telemetry is not None
    heard: list[float] = []  # trio's clock, as each listener call saw it
    proxy.telemetry.push_listeners.append(lambda *_: heard.append(trio.current_time()))
    noted: list[str] = []  # the thread each note ran in: where the push was answered
    proxy.telemetry.push_notes.append(lambda *_: noted.append(threading.current_thread().name))
    client = await connected(proxy)
    await parked(proxy)
    (session,) = proxy.sessions
    await warmed(proxy, client)
    before, handed = lane_requests(proxy), handbacks(proxy)
    get = encode_request(api_keys.GET_TELEMETRY_SUBSCRIPTIONS, 0, 2,
                         {"client_instance_id": uuid.UUID(int=0)})
    (answer,) = await pipelined(client, [get], [2])
    got = decode_response(answer, api_keys.GET_TELEMETRY_SUBSCRIPTIONS, 0).body
    assert got["error_code"] == 0
    frames = await pipelined(client, [encode_request(api_keys.METADATA, 12, 3, METADATA_V12),
                                      push(got, 4, 3),
                                      encode_request(api_keys.METADATA, 12, 5, METADATA_V12)],
                             [3, 4, 5])
    assert decode_response(frames[1], api_keys.PUSH_TELEMETRY, 0).body["error_code"] == 0
    assert lane_requests(proxy) - before == 4 and handbacks(proxy) == handed
    assert session.parked and session_tasks() == 0
    assert noted == ["kproxy-express-lane"]  # noted as answered, with no trio pass
    with trio.fail_after(10):
        while not heard:  # called soon after, in trio
            await trio.sleep(0.01)
    # Another instance's push of more points than are decoded at once.
    get = encode_request(api_keys.GET_TELEMETRY_SUBSCRIPTIONS, 0, 6,
                         {"client_instance_id": uuid.UUID(int=0)})
    got = decode_response((await pipelined(client, [get], [6]))[0],
                          api_keys.GET_TELEMETRY_SUBSCRIPTIONS, 0).body
    frames = await pipelined(client, [encode_request(api_keys.METADATA, 12, 7, METADATA_V12),
                                      push(got, 8, SMALL_POINTS + 1),
                                      encode_request(api_keys.METADATA, 12, 9, METADATA_V12)],
                             [7, 8, 9])
    assert decode_response(frames[1], api_keys.PUSH_TELEMETRY, 0).body["error_code"] == 0
    assert handbacks(proxy) == handed + 1
    accepted = proxy.metrics.registry.get_sample_value(
        "kproxy_telemetry_requests_total", {"api": "PushTelemetry", "error": "none"})
    assert accepted == 2 and len(heard) == 2
    await parked(proxy)
    await metadata(client, 10)
    assert handbacks(proxy) == handed + 1 and session.parked
    await client.aclose()
    proxy.shutdown()


async def test_local_answers_that_take_work_leave_the_rest_to_trio(
        nursery: trio.Nursery, fake: FakeBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``LOCAL_WORK_S`` of local answers in one receive (none here: every one
    passes it), the lane hands the rest to the session's tasks, which pace it; every
    answer still comes once, in order."""
    from kproxy.session.parked import express

    monkeypatch.setattr(express, "LOCAL_WORK_S", 0.0)
    proxy = await start_proxy(nursery, fake.bootstrap)
    client = await connected(proxy)
    await parked(proxy)
    await warmed(proxy, client)
    handed = handbacks(proxy)
    gets = [encode_request(api_keys.GET_TELEMETRY_SUBSCRIPTIONS, 0, cid,
                           {"client_instance_id": uuid.UUID(int=0)}) for cid in (2, 3, 4)]
    await pipelined(client, [*gets, encode_request(api_keys.METADATA, 12, 5, METADATA_V12)],
                    [2, 3, 4, 5])
    assert handbacks(proxy) == handed + 1
    await client.aclose()
    proxy.shutdown()


async def test_the_frame_size_limit_holds_in_the_lane(
        nursery: trio.Nursery, fake: FakeBroker) -> None:
    """A whole request over ``max_frame_bytes`` in one receive is the session's tasks'
    to refuse, as on the trio path: closed and counted, never forwarded."""
    proxy = await start_proxy(nursery, fake.bootstrap, max_frame_bytes=4096)
    client = await connected(proxy)
    await parked(proxy)
    big = encode_request(api_keys.METADATA, 12, 2, {**TOPICS, "topics": TOPICS["topics"][:300]})
    assert 4096 < len(big) < 64 * 1024
    sent = len(fake.requests)
    await client.send(big)
    assert await client.read_frame() is None
    assert proxy.metrics.limits_hit.labels("max_frame_bytes")._value.get() == 1
    assert len(fake.requests) == sent
    await client.aclose()
    proxy.shutdown()


async def test_with_the_lane_off_every_frame_goes_through_trio(
        nursery: trio.Nursery, fake: FakeBroker) -> None:
    proxy = await start_proxy(nursery, fake.bootstrap, express_lane="off")
    assert not proxy.parking.lane_running
    client = await connected(proxy)
    for cid in range(2, 50):
        await metadata(client, cid)
    assert lane_requests(proxy) == 0 and not proxy.parking  # busy: never parked
    await client.aclose()
    proxy.shutdown()


async def test_quotas_keep_sessions_out_of_the_lane(
        nursery: trio.Nursery, fake: FakeBroker, tmp_path: Path) -> None:
    """A quota is counted and applied by the session's tasks: no lane."""
    config = tmp_path / "kproxy.toml"
    config.write_text('[[quotas]]\nprincipal = "User:ANONYMOUS"\n'
                      'requests_per_second = 100000\n')
    proxy = await start_proxy(nursery, fake.bootstrap, config_file=config)
    assert proxy.services.quotas.enabled
    client = await connected(proxy)
    for cid in range(2, 50):
        await metadata(client, cid)
    assert lane_requests(proxy) == 0
    await client.aclose()
    proxy.shutdown()


def test_a_real_producer_and_consumer_through_the_lane(
        shared_tansu: TansuBroker, tmp_path: Path) -> None:
    """librdkafka produces 2,000 messages one at a time (acks=1) and reads them back
    through `kproxy run` with its default settings (a worker per core) in front of
    tansu: every message arrives, in order, and the lane relayed most requests."""
    from confluent_kafka import Consumer, Producer

    from ..scrape_load import metric_value
    from ..support import kproxy_process

    topic = f"lane-{uuid.uuid4().hex[:8]}"
    with kproxy_process(shared_tansu.bootstrap, tmp_path) as kp:
        producer = Producer({"bootstrap.servers": kp.bootstrap, "linger.ms": 0})
        delivered: list[bytes] = []
        for i in range(2000):
            producer.produce(topic, f"m{i}".encode(), key=b"k",
                             on_delivery=lambda err, msg: delivered.append(value_of(msg))
                             if err is None else None)
            assert producer.flush(30) == 0
        assert delivered == [f"m{i}".encode() for i in range(2000)]
        consumer = Consumer({"bootstrap.servers": kp.bootstrap, "group.id": topic,
                             "auto.offset.reset": "earliest"})
        consumer.subscribe([topic])
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < 2000 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(value_of(msg))
        consumer.close()
        assert got == delivered
        assert metric_value(kp.http_port, "kproxy_express_lane_requests_total") >= 1500
