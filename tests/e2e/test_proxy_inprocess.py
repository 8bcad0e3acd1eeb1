"""The proxy in-process under trio: port mapping, listeners, ordering, failure handling.

Multi-node shapes and misbehaving brokers come from FakeBroker (a named fake);
ordering under pipelining runs against the real tansu broker.
"""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from kproxy.codecs import api_keys
from kproxy.codecs.messages import decode_response, encode_response_parts
from kproxy.codecs.peek import RequestPeek, peek_correlation_id
from kproxy.embedded_broker import TansuBroker
from kproxy.policies.connection import ConnectionState
from kproxy.policies.handlers import LocalHandler
from kproxy.runtime.server import Proxy

from ..fake_broker import FakeBroker
from ..support import RawClient, broker_port_base, encode_request, make_config

METADATA_V12 = {"topics": [], "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False}

VECTORS = Path(__file__).parent.parent / "vectors"


async def start_proxy(nursery: trio.Nursery, upstream: str,
                      local_handlers: dict[int, LocalHandler] | None = None,
                      config_file: Path | None = None, **overrides: Any) -> Proxy:
    proxy = Proxy(make_config(upstream, config_file, **overrides),
                  local_handlers=local_handlers)
    started: Proxy = await nursery.start(lambda task_status: proxy.run(
        handle_signals=False, task_status=task_status))
    return started


async def port_open(port: int) -> bool:
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        return False
    await stream.aclose()
    return True


@pytest.fixture
async def fake(nursery: trio.Nursery) -> AsyncIterator[FakeBroker]:
    yield await FakeBroker(node_ids=[0, 1, 2, 50]).start(nursery)


async def test_multi_node_mapping_listeners_and_out_of_range(
        nursery: trio.Nursery, fake: FakeBroker) -> None:
    proxy = await start_proxy(nursery, fake.bootstrap, node_id_range="0-9",
                              discovery_interval="0.2")
    base = proxy.config.broker_port_base
    # Discovery opened one listener per in-range broker before any client asked.
    assert [await port_open(base + n) for n in (0, 1, 2)] == [True, True, True]
    client = await RawClient.connect(proxy.bootstrap_port or 0)
    resp = await client.request(api_keys.METADATA, 12, 1, METADATA_V12)
    brokers = {b["node_id"]: (b["host"], b["port"]) for b in resp.body["brokers"]}
    assert brokers == {0: ("127.0.0.1", base), 1: ("127.0.0.1", base + 1),
                       2: ("127.0.0.1", base + 2)}  # node 50 is out of range: left out
    assert proxy.metrics.node_out_of_range._value.get() >= 1

    # A connection to broker 2's proxy port reaches fake node 2, not another one.
    before = dict(fake.connections)
    via2 = await RawClient.connect(base + 2)
    await via2.request(api_keys.API_VERSIONS, 3, 5, {"client_software_name": "t",
                                                     "client_software_version": "1"})
    assert fake.connections[2] == before.get(2, 0) + 1

    # FindCoordinator leads to the coordinator's proxy port (v3 single, v4 batched).
    fake.coordinator = 1
    single = await client.request(api_keys.FIND_COORDINATOR, 3, 2, {"key": "g", "key_type": 0})
    assert (single.body["host"], single.body["port"]) == ("127.0.0.1", base + 1)
    batched = await client.request(api_keys.FIND_COORDINATOR, 4, 3,
                                   {"key_type": 0, "coordinator_keys": ["g"]})
    assert batched.body["coordinators"][0]["port"] == base + 1

    # A broker that leaves the cluster loses its listener at the next discovery.
    fake.hidden.add(2)
    with trio.fail_after(30):
        while await port_open(base + 2):
            await trio.sleep(0.05)
    assert await port_open(base + 1)
    await client.aclose()
    await via2.aclose()
    proxy.shutdown()


async def test_silent_upstream_and_cut_response_close_the_client(
        nursery: trio.Nursery, fake: FakeBroker) -> None:
    proxy = await start_proxy(nursery, fake.bootstrap, node_id_range="0-9")
    fake.mode = "cut-mid-response"
    client = await RawClient.connect(proxy.bootstrap_port or 0)
    await client.send(encode_request(api_keys.METADATA, 12, 1, METADATA_V12))
    assert await client.read_frame(timeout=5) is None  # closed promptly, no half frame
    assert proxy.metrics.upstream_disconnects.labels("bootstrap")._value.get() == 1
    proxy.shutdown()


async def test_unreachable_upstream_closes_client_promptly(nursery: trio.Nursery) -> None:
    import socket

    # Bound but not listening: connecting is refused, and no one else can take the port.
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    try:
        proxy = await start_proxy(nursery, f"127.0.0.1:{closed.getsockname()[1]}",
                                  connect_timeout="2")
        client = await RawClient.connect(proxy.bootstrap_port or 0)
        # The upstream is connected lazily, at the first request: none yet, no attempt.
        await trio.sleep(0.2)
        assert proxy.metrics.upstream_connect_failures.labels("bootstrap")._value.get() == 0
        await client.send(encode_request(api_keys.METADATA, 12, 1, METADATA_V12))
        with trio.fail_after(30):
            assert await client.read_frame() is None
    finally:
        closed.close()
    assert proxy.metrics.upstream_connect_failures.labels("bootstrap")._value.get() == 1
    status = proxy.ready()
    assert status == (False, "backend not reached yet")
    proxy.shutdown()


@pytest.fixture
def tansu_bg(tmp_path: Path) -> TansuBroker:
    broker = TansuBroker(log_path=tmp_path / "tansu.log").start()
    return broker


async def test_pipelined_requests_leave_in_order_with_local_answers(
        nursery: trio.Nursery, tansu_bg: TansuBroker) -> None:
    try:
        def answer_71(session: ConnectionState, peek: RequestPeek, frame: memoryview) -> bytes:
            # Test hook: answered by the proxy at once, ahead of slower upstream replies.
            return encode_response_parts(71, 0, peek.correlation_id, {
                "throttle_time_ms": 0, "error_code": 0,
                "client_instance_id": __import__("uuid").UUID(int=1), "subscription_id": 0,
                "accepted_compression_types": [], "push_interval_ms": 1000,
                "telemetry_max_bytes": 1, "delta_temporality": False, "requested_metrics": []})

        proxy = await start_proxy(nursery, tansu_bg.bootstrap, local_handlers={71: answer_71})
        acks0 = next(json.loads(line) for line in (
            VECTORS / "kafka-python.jsonl").read_text().splitlines()
            if json.loads(line)["api_name"] == "Produce" and b"fire" in bytes.fromhex(
                json.loads(line)["hex"]))
        fire = bytearray(bytes.fromhex(acks0["hex"]))

        client = await RawClient.connect(proxy.bootstrap_port or 0)
        sent: list[int] = []
        batch = bytearray()
        for cid in range(1, 301):
            kind = cid % 4
            if kind == 0:
                batch += encode_request(71, 0, cid, {"client_instance_id":
                                                     __import__("uuid").UUID(int=0)})
            elif kind == 1:
                batch += encode_request(api_keys.METADATA, 12, cid, METADATA_V12)
            elif kind == 2:
                batch += encode_request(api_keys.API_VERSIONS, 3, cid,
                                        {"client_software_name": "t",
                                         "client_software_version": "1"})
            else:  # acks=0 produce: no response, must not stall the queue
                fire[4:8] = struct.pack(">i", cid)
                batch += struct.pack(">i", len(fire)) + fire
                continue
            sent.append(cid)
        await client.send(bytes(batch))
        got = []
        for _ in sent:
            frame = await client.read_frame()
            assert frame is not None
            got.append(peek_correlation_id(frame))
        assert got == sent
        # Rewritten on the way: the broker's own port never reaches the client.
        resp = await client.request(api_keys.METADATA, 12, 1000, METADATA_V12)
        assert resp.body["brokers"][0]["port"] == proxy.config.broker_port_base
        assert str(tansu_bg.port) not in json.dumps(
            decode_response(encode_response_parts(3, 12, 1, resp.body), 3, 12).body)
        await client.aclose()
        proxy.shutdown()
    finally:
        tansu_bg.stop()


async def test_client_gone_with_requests_in_flight_leaves_nothing(
        nursery: trio.Nursery, fake: FakeBroker) -> None:
    proxy = await start_proxy(nursery, fake.bootstrap, node_id_range="0-9")
    fake.mode = "silent"
    for _ in range(20):
        client = await RawClient.connect(proxy.bootstrap_port or 0)
        await client.send(encode_request(api_keys.METADATA, 12, 1, METADATA_V12) * 5)
        await client.aclose()
    with trio.fail_after(30):
        while proxy.sessions:
            await trio.sleep(0.02)
    assert proxy.metrics.connections_active.labels("bootstrap")._value.get() == 0
    proxy.shutdown()


async def test_api_versions_newer_than_ours_gets_error_35_at_v0(
        nursery: trio.Nursery, fake: FakeBroker) -> None:
    proxy = await start_proxy(nursery, fake.bootstrap, node_id_range="0-9")
    client = await RawClient.connect(proxy.bootstrap_port or 0)
    # Header only: a v9 body is unknown to everyone; the answer must come at v0.
    hdr = struct.pack(">hhih", 18, 9, 77, 1) + b"x" + b"\x00"
    await client.send(struct.pack(">i", len(hdr)) + hdr)
    frame = await client.read_frame()
    assert frame is not None
    body = decode_response(frame, 18, 0).body
    assert body["error_code"] == 35
    assert body["api_keys"] == [{"api_key": 18, "min_version": 0, "max_version": 4}]
    assert not any(r[0] == 18 and r[1] == 9 for r in fake.requests)
    proxy.shutdown()


async def test_admin_rebootstrap_and_metadata_v13_bridge(
        nursery: trio.Nursery, tansu_bg: TansuBroker) -> None:
    from kproxy.policies.rebootstrap import REBOOTSTRAP_REQUIRED

    from ..support import http_get

    try:
        proxy = await start_proxy(nursery, tansu_bg.bootstrap)
        status, _, _ = await http_get(proxy.http_port or 0, "",
                                      raw=b"POST /admin/rebootstrap HTTP/1.1\r\nhost: t\r\n"
                                      b"content-length: 0\r\n\r\n")
        assert status == 403  # disabled unless --admin
        proxy.set_config(make_config(tansu_bg.bootstrap, admin="on"))
        client = await RawClient.connect(proxy.bootstrap_port or 0)
        versions = await client.request(api_keys.API_VERSIONS, 3, 1, {
            "client_software_name": "t", "client_software_version": "1"})
        meta = next(e for e in versions.body["api_keys"] if e["api_key"] == api_keys.METADATA)
        assert meta["max_version"] == 13  # tansu stops at 12; the proxy bridges
        body13 = {**METADATA_V12}
        first = await client.request(api_keys.METADATA, 13, 2, body13)
        assert first.body["error_code"] == 0 and first.body["brokers"]
        status, _, text = await http_get(proxy.http_port or 0, "",
                                         raw=b"POST /admin/rebootstrap HTTP/1.1\r\nhost: t\r\n"
                                         b"content-length: 0\r\n\r\n")
        assert status == 200 and b"epoch is now 1" in text
        told = await client.request(api_keys.METADATA, 13, 3, body13)
        assert told.body["error_code"] == REBOOTSTRAP_REQUIRED  # once...
        again = await client.request(api_keys.METADATA, 13, 4, body13)
        assert again.body["error_code"] == 0  # ...then normal responses
        # The same backend answer is rewritten once and then served from the cache,
        # except for the injecting response, which is never cached.
        assert again.body == first.body and again.header.correlation_id == 4
        assert proxy.state.rewrites.hits >= 1 and len(proxy.state.rewrites) == 1
        await client.aclose()
        proxy.shutdown()
    finally:
        tansu_bg.stop()


async def test_reuse_port_lets_two_proxies_share_their_ports(
        nursery: trio.Nursery, tansu_bg: TansuBroker) -> None:
    from ..support import free_port

    try:
        listen_port, base = free_port(), broker_port_base()
        shared: dict[str, Any] = {"listen": f"127.0.0.1:{listen_port}",
                                  "broker_port_base": base, "reuse_port": "on"}
        proxies = [await start_proxy(nursery, tansu_bg.bootstrap, **shared) for _ in range(2)]
        assert [p.bootstrap_port for p in proxies] == [listen_port, listen_port]
        clients = [await RawClient.connect(listen_port) for _ in range(16)]
        for i, client in enumerate(clients):
            resp = await client.request(api_keys.METADATA, 12, i, METADATA_V12)
            assert resp.body["brokers"][0]["port"] == base
        # The kernel spread the connections over both processes' listeners.
        served = [len(p.sessions) for p in proxies]
        assert sum(served) == 16 and min(served) > 0, served
        broker = await RawClient.connect(base)  # the broker port is shared too
        assert (await broker.request(api_keys.METADATA, 12, 99, METADATA_V12)).body["brokers"]
        for client in [*clients, broker]:
            await client.aclose()
        for p in proxies:
            p.shutdown()
    finally:
        tansu_bg.stop()


async def test_without_reuse_port_a_taken_port_is_refused() -> None:
    from kproxy.runtime.listeners import open_listeners

    from ..support import free_port

    port = free_port()
    held = await open_listeners("127.0.0.1", port, reuse_port=False)
    with pytest.raises(OSError):
        await open_listeners("127.0.0.1", port, reuse_port=False)
    for listener in held:
        await listener.aclose()
    shared = [await open_listeners("127.0.0.1", port, reuse_port=True) for _ in range(2)]
    for listeners in shared:
        for listener in listeners:
            await listener.aclose()


async def test_a_backend_change_reaching_a_closing_session_is_harmless(
        nursery: trio.Nursery, fake: FakeBroker) -> None:
    """A topology change tells every session in the proxy's set to end; one whose tasks
    have all ended and that is still closing its sockets must take that quietly (it
    once raised "Nursery is closed to new arrivals" and took the proxy down)."""
    proxy = await start_proxy(nursery, fake.bootstrap, node_id_range="0-9")
    client = await RawClient.connect(proxy.bootstrap_port or 0)
    await client.send(encode_request(api_keys.METADATA, 12, 1, METADATA_V12))
    assert await client.read_frame(timeout=10) is not None
    (session,) = proxy.sessions
    await client.aclose()
    with trio.fail_after(30):
        await session.wait_ended()
    session.end_at_next_request()  # what the backend watch calls on a change
    await proxy.backend.force("operator")  # and through the real fan-out
    client = await RawClient.connect(proxy.bootstrap_port or 0)  # the proxy serves on
    await client.send(encode_request(api_keys.METADATA, 12, 2, METADATA_V12))
    assert await client.read_frame(timeout=10) is not None
    await client.aclose()
    proxy.shutdown()
