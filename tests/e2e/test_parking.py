"""Idle sessions park: their tasks end, their sockets and state stay
(kproxy.session.parked.parking).

Everything that reaches a running session must reach a parked one the same way: the
client's next request, either side closing, the idle timeout and a reload of it, a
drain, its backend going away, a close, the status page, admission counts, the proxy
stopping. Parking is made quick here (50 ms idle) so that each test parks often.

The broker in most tests is the named stand-in ``tests/fake_broker.FakeBroker``: they
close connections from the broker's side and read what it received, which tansu does
not let a test do. The last test uses real parts only: librdkafka, `kproxy run` and
tansu.
"""

from __future__ import annotations

import dataclasses
import json
import random
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme

from kproxy.codecs import api_keys
from kproxy.embedded_broker import TansuBroker
from kproxy.policies import timeouts
from kproxy.runtime.server import Proxy
from kproxy.session.parked import parking

from ..fake_broker import FakeBroker
from ..support import RawClient, encode_request, http_get, value_of
from .test_proxy_inprocess import METADATA_V12
from .test_proxy_inprocess import start_proxy as start_any_proxy

SOFTWARE = {"client_software_name": "parking-test", "client_software_version": "1"}
# The tasks a session runs in: its first one (admission), a resumed one, the response side.
SESSION_TASKS = ("Admission._run", "Session.resume", "relay_responses")


@pytest.fixture(autouse=True)
def quick_parking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parking, "PARK_AFTER_S", 0.05)
    monkeypatch.setattr(parking, "SWEEP_S", 0.02)


@pytest.fixture
async def fake(nursery: trio.Nursery) -> AsyncIterator[FakeBroker]:
    yield await FakeBroker(node_ids=[0]).start(nursery)


async def start_proxy(nursery: trio.Nursery, upstream: str, **overrides: Any) -> Proxy:
    return await start_any_proxy(nursery, upstream, node_id_range="0-9", **overrides)


async def parked(proxy: Proxy, n: int = 1, timeout: float = 10) -> None:
    with trio.fail_after(timeout):
        while len(proxy.parking) != n:
            await trio.sleep(0.01)


async def connected(proxy: Proxy, correlation_id: int = 1) -> RawClient:
    """A client whose first request was relayed: the upstream connection is open too."""
    client = await RawClient.connect(proxy.bootstrap_port or 0)
    resp = await client.request(api_keys.API_VERSIONS, 3, correlation_id, SOFTWARE)
    assert resp.body["error_code"] == 0
    return client


def session_tasks() -> int:
    """How many trio tasks are running for sessions, anywhere in the task tree."""
    root = trio.lowlevel.current_root_task()
    assert root is not None
    count, nurseries = 0, list(root.child_nurseries)
    while nurseries:
        for task in nurseries.pop().child_tasks:
            count += task.name.endswith(SESSION_TASKS)
            nurseries.extend(task.child_nurseries)
    return count


async def closed_by_proxy(client: RawClient, timeout: float = 10) -> None:
    """The proxy closes the connection without answering anything more."""
    assert await client.read_frame(timeout=timeout) is None


async def all_ended(proxy: Proxy) -> None:
    """Every session has ended, and given back its admission."""
    with trio.fail_after(10):
        while proxy.sessions:
            await trio.sleep(0.01)
    assert proxy.admission.open == 0 and proxy.admission.by_source == {}


def parked_gauge(proxy: Proxy) -> float | None:
    return proxy.metrics.registry.get_sample_value("kproxy_connections_parked")


async def test_an_idle_session_parks_without_a_task_and_wakes_for_its_client(
        nursery: trio.Nursery, fake: FakeBroker) -> None:
    proxy = await start_proxy(nursery, fake.bootstrap)
    client = await connected(proxy)
    await parked(proxy)
    (session,) = proxy.sessions
    assert session.parked and session.upstream is not None
    assert session_tasks() == 0
    assert parked_gauge(proxy) == 1
    assert proxy.admission.open == 1
    assert proxy.metrics.connections_active.labels("bootstrap")._value.get() == 1
    for cid in range(2, 7):  # wakes, answers, parks again: the same session every time
        resp = await client.request(api_keys.METADATA, 12, cid, METADATA_V12)
        assert resp.header.correlation_id == cid and resp.body["brokers"]
        await parked(proxy)
        assert proxy.sessions == {session}
    # Several requests at once to a parked session come back in order.
    await client.send(b"".join(encode_request(api_keys.METADATA, 12, cid, METADATA_V12)
                               for cid in range(10, 15)))
    for cid in range(10, 15):
        frame = await client.read_frame()
        assert frame is not None and int.from_bytes(frame[:4], "big") == cid
    await client.aclose()
    await all_ended(proxy)
    assert not proxy.parking
    assert proxy.metrics.connections_active.labels("bootstrap")._value.get() == 0
    proxy.shutdown()


@pytest.mark.parametrize("lane", ["off", "on"])
async def test_requests_racing_the_park_are_all_answered_in_order(
        nursery: trio.Nursery, fake: FakeBroker, lane: str) -> None:
    """Requests arrive around the moment the session parks (idle 40-70 ms against a
    50 ms threshold checked every 20 ms): each one wakes it or is read before it parks.
    With the express lane (the default), a session parks once its answers have left and
    the lane relays the bursts, racing the session's own tasks as it parks."""
    proxy = await start_proxy(nursery, fake.bootstrap, express_lane=lane)
    parks = 0
    park = proxy.parking.park

    def counting(session: object) -> bool:
        nonlocal parks
        parks += 1
        return park(session)  # type: ignore[arg-type]

    proxy.parking.park = counting  # type: ignore[method-assign]
    rng = random.Random(19)

    async def one_client(n: int) -> None:
        client = await connected(proxy, 1)
        for cid in range(2, 40):
            await trio.sleep(rng.uniform(0.04, 0.07))
            burst = rng.randint(1, 3)
            await client.send(b"".join(encode_request(api_keys.METADATA, 12, cid * 10 + i,
                                                      METADATA_V12) for i in range(burst)))
            for i in range(burst):
                frame = await client.read_frame()
                assert frame is not None, f"client {n} lost its connection"
                assert int.from_bytes(frame[:4], "big") == cid * 10 + i
        await client.aclose()

    async with trio.open_nursery() as clients:
        for n in range(4):
            clients.start_soon(one_client, n)
    if lane == "off":
        assert parks > 20  # the race was run, many times
    else:  # parked at the first idle moment, and relayed in the lane from then on
        assert parks >= 4
        assert (proxy.metrics.registry.get_sample_value(
            "kproxy_express_lane_requests_total") or 0) > 100
    await all_ended(proxy)
    assert not proxy.parking
    proxy.shutdown()


async def test_a_busy_connection_does_not_park(nursery: trio.Nursery, fake: FakeBroker) -> None:
    """Without the express lane: a session parks only once idle. (With it, a busy
    session parks at once and stays parked: tests/e2e/test_express_lane.py.)"""
    proxy = await start_proxy(nursery, fake.bootstrap, express_lane="off")
    client = await connected(proxy)
    with trio.move_on_after(0.5):
        cid = 2
        while True:  # back to back, and a pause shorter than the threshold now and then
            await client.request(api_keys.METADATA, 12, cid, METADATA_V12)
            assert not proxy.parking
            cid += 1
            if cid % 20 == 0:
                await trio.sleep(0.02)
    await parked(proxy)  # and once it stops, it does
    await client.aclose()
    proxy.shutdown()


async def test_either_side_closing_ends_a_parked_session(
        nursery: trio.Nursery, fake: FakeBroker) -> None:
    proxy = await start_proxy(nursery, fake.bootstrap)
    records: list[Any] = []
    proxy.events.on_connection_closed.append(records.append)
    by_client, by_broker = await connected(proxy), await connected(proxy)
    await parked(proxy, 2)
    await by_client.aclose()
    with trio.fail_after(10):
        while len(proxy.sessions) != 1:
            await trio.sleep(0.01)
    for stream in list(fake.streams):  # the broker closes the other one's connection
        await stream.aclose()
    await closed_by_proxy(by_broker)
    await all_ended(proxy)
    assert len(records) == 2  # one inventory record each, at the real close
    assert proxy.admission.open == 0 and proxy.admission.by_source == {}
    assert not proxy.parking and parked_gauge(proxy) == 0
    proxy.shutdown()


async def test_the_idle_timeout_closes_a_parked_session_on_time(
        nursery: trio.Nursery, fake: FakeBroker) -> None:
    proxy = await start_proxy(nursery, fake.bootstrap, idle_timeout="0.6")
    client = await connected(proxy)
    answered = trio.current_time()
    await parked(proxy)
    await closed_by_proxy(client)
    took = trio.current_time() - answered
    assert 0.55 <= took < 1.5, took
    hits = proxy.metrics.limits_hit.labels("idle_timeout")._value.get()
    assert hits == 1
    proxy.shutdown()


async def test_a_reloaded_idle_timeout_applies_to_parked_sessions(
        nursery: trio.Nursery, fake: FakeBroker) -> None:
    proxy = await start_proxy(nursery, fake.bootstrap, idle_timeout="0.5")
    client = await connected(proxy)
    await parked(proxy)
    proxy.set_config(dataclasses.replace(proxy.config, idle_timeout=600.0))  # longer
    await trio.sleep(1.0)
    assert len(proxy.parking) == 1  # still open, still parked
    proxy.set_config(dataclasses.replace(proxy.config, idle_timeout=1.2))  # shorter again
    await closed_by_proxy(client, timeout=1.0)  # idle 1.2 s already: closed at once
    proxy.shutdown()


async def test_a_drain_ends_parked_sessions_at_once(fake: FakeBroker) -> None:
    """A drain waits (up to drain_timeout, 30 s) for requests in flight; a parked session
    has none, so it ends at once and the proxy stops."""
    with trio.fail_after(5):
        async with trio.open_nursery() as inner:
            proxy = await start_proxy(inner, fake.bootstrap)
            clients = [await connected(proxy) for _ in range(20)]
            await parked(proxy, 20)
            proxy.shutdown()  # returns from run once drained: the nursery closes
    for client in clients:
        await closed_by_proxy(client, timeout=1)
    assert not proxy.sessions and proxy.admission.open == 0


async def test_a_parked_session_whose_backend_went_ends_at_its_next_request_or_after_grace(
        nursery: trio.Nursery, fake: FakeBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeouts, "GONE_GRACE_S", 0.3)
    proxy = await start_proxy(nursery, fake.bootstrap)
    quiet, asking = await connected(proxy), await connected(proxy, 7)
    # Metadata v12: a legacy client, which a backend change closes (legacy_clients=close).
    for client in (quiet, asking):
        await client.request(api_keys.METADATA, 12, 2, METADATA_V12)
    await parked(proxy, 2)
    before = fake.requests[:]
    await proxy.backend.force("operator")  # the real fan-out: end_at_next_request
    await asking.send(encode_request(api_keys.METADATA, 12, 3, METADATA_V12))
    await closed_by_proxy(asking, timeout=5)  # not answered, not forwarded
    started = trio.current_time()
    await closed_by_proxy(quiet, timeout=5)
    assert trio.current_time() - started < 2
    assert fake.requests == before
    await all_ended(proxy)
    proxy.shutdown()


async def test_close_reaches_a_parked_session(nursery: trio.Nursery, fake: FakeBroker) -> None:
    proxy = await start_proxy(nursery, fake.bootstrap)
    client = await connected(proxy)
    await parked(proxy)
    (session,) = proxy.sessions
    session.close()
    await closed_by_proxy(client)
    await all_ended(proxy)
    assert not proxy.parking
    proxy.shutdown()


async def test_the_status_page_lists_parked_sessions(
        nursery: trio.Nursery, fake: FakeBroker) -> None:
    proxy = await start_proxy(nursery, fake.bootstrap)
    clients = [await connected(proxy, n) for n in range(3)]
    await parked(proxy, 3)
    status, _, body = await http_get(proxy.http_port or 0, "/status.json")
    assert status == 200
    snapshot = json.loads(body)
    assert snapshot["clients"]["connections"] == 3
    (group,) = snapshot["clients"]["groups"]
    assert group["software_name"] == "parking-test" and group["connections"] == 3
    assert len(proxy.parking) == 3  # reading them did not wake them
    for client in clients:
        await client.aclose()
    proxy.shutdown()


async def test_a_stopping_proxy_closes_parked_sessions(fake: FakeBroker) -> None:
    """Cancelled outright (no drain), the proxy still closes what is parked."""
    async with trio.open_nursery() as inner:
        proxy = await start_proxy(inner, fake.bootstrap)
        clients = [await connected(proxy) for _ in range(3)]
        await parked(proxy, 3)
        inner.cancel_scope.cancel()
    for client in clients:
        await closed_by_proxy(client, timeout=5)
    assert not proxy.sessions and proxy.admission.open == 0
    assert proxy.metrics.connections_active.labels("bootstrap")._value.get() == 0


async def test_a_tls_session_never_parks(
        nursery: trio.Nursery, fake: FakeBroker, tmp_path: Path) -> None:
    """A TLS stream may hold decrypted bytes that no epoll reports: it keeps its tasks."""
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    server.cert_chain_pems[0].write_to_path(str(cert))
    server.private_key_pem.write_to_path(str(key))
    proxy = await start_proxy(nursery, fake.bootstrap, tls_cert=cert, tls_key=key)
    context = ssl.create_default_context()
    ca.configure_trust(context)
    tcp = await trio.open_tcp_stream("127.0.0.1", proxy.bootstrap_port or 0)
    client = RawClient(trio.SSLStream(tcp, context, server_hostname="127.0.0.1"))  # type: ignore[arg-type]
    for cid in (1, 2):
        resp = await client.request(api_keys.API_VERSIONS, 3, cid, SOFTWARE)
        assert resp.header.correlation_id == cid
        await trio.sleep(0.3)  # six times the park threshold
        assert not proxy.parking and session_tasks() == 2
    await client.aclose()
    await all_ended(proxy)
    proxy.shutdown()


def test_a_real_clients_connections_park_and_wake_through_tansu(
        shared_tansu: TansuBroker, tmp_path: Path) -> None:
    """The same with real parts: librdkafka through a `kproxy run` in front of tansu.
    After a produce its connections go quiet and park; a produce after that wakes the
    connection it needs, is delivered, and both messages read back."""
    from confluent_kafka import Consumer, Producer

    from ..scrape_load import metric_value
    from ..support import kproxy_process

    topic = f"park-{random.randrange(1 << 30)}"
    with kproxy_process(shared_tansu.bootstrap, tmp_path, "--workers", "1") as kp:
        producer = Producer({"bootstrap.servers": kp.bootstrap, "linger.ms": 0})
        producer.produce(topic, b"before", key=b"k")  # one partition: read in order
        assert producer.flush(30) == 0
        deadline = time.monotonic() + 30  # idle 0.25 s, then the next sweep parks
        while metric_value(kp.http_port, "kproxy_connections_parked") < 1:
            assert time.monotonic() < deadline, "no connection parked"
            time.sleep(0.1)
        producer.produce(topic, b"after", key=b"k")
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": kp.bootstrap, "group.id": topic,
                             "auto.offset.reset": "earliest"})
        consumer.subscribe([topic])
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < 2 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(value_of(msg))
        consumer.close()
        assert got == [b"before", b"after"]
