"""Connection limits and timeouts: each refuses or closes, is counted, and spares others.

The broker is the scripted FakeBroker (named fake), so a request can be made to
take as long as a test needs.
"""

from __future__ import annotations

import logging
import socket
import struct
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from kproxy.codecs import api_keys
from kproxy.embedded_broker import TansuBroker
from kproxy.runtime.server import Proxy

from ..fake_broker import FakeBroker
from ..support import (
    RawClient,
    direct_connections,
    encode_request,
    kproxy_process,
    make_config,
    wait_until,
)
from .test_security import API_VERSIONS_V3, closed_by_proxy, metric

METADATA = {"topics": [], "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False}


async def start(nursery: trio.Nursery, fake: FakeBroker, **overrides: Any) -> Proxy:
    proxy = Proxy(make_config(fake.bootstrap, node_id_range="0-0", **overrides))
    started: Proxy = await nursery.start(lambda task_status: proxy.run(
        handle_signals=False, task_status=task_status))
    return started


async def answered(client: RawClient, correlation_id: int = 1) -> bool:
    resp = await client.request(api_keys.API_VERSIONS, 3, correlation_id, API_VERSIONS_V3)
    return bool(resp.body["error_code"] == 0)


async def limit(proxy: Proxy, name: str) -> float:
    return await metric(proxy, f'kproxy_limit_hits_total{{limit="{name}"}}')


async def test_connection_limits_global_and_per_source(
        nursery: trio.Nursery, caplog: pytest.LogCaptureFixture) -> None:
    fake = await FakeBroker(node_ids=[0]).start(nursery)
    proxy = await start(nursery, fake, max_connections_per_source=2, max_connections=3)
    port = proxy.bootstrap_port
    assert port is not None
    first = [await RawClient.connect(port) for _ in range(2)]
    assert all([await answered(c) for c in first])
    with caplog.at_level(logging.WARNING, logger="kproxy"):
        third = await RawClient.connect(port)
        assert await closed_by_proxy(third)
        for _ in range(5):  # counted every time, logged once per interval
            assert await closed_by_proxy(await RawClient.connect(port))
    assert await limit(proxy, "max_connections_per_source") == 6
    assert sum("per-source connection limit" in r.getMessage() for r in caplog.records) == 1
    # Closing one frees its place.
    await first[0].aclose()
    with trio.fail_after(30):
        while proxy.admission.by_source.get("127.0.0.1", 0) > 1:
            await trio.sleep(0.05)
    again = await RawClient.connect(port)
    assert await answered(again)
    assert await answered(first[1], 2), "an existing connection was disturbed"


async def test_global_limit_counts_every_source(nursery: trio.Nursery) -> None:
    fake = await FakeBroker(node_ids=[0]).start(nursery)
    proxy = await start(nursery, fake, listen="0.0.0.0:0", advertised_host="127.0.0.1",
                        broker_bind_host="127.0.0.1", max_connections=2)
    port = proxy.bootstrap_port
    assert port is not None
    a = await RawClient.connect(port, source="127.0.0.1")
    b = await RawClient.connect(port, source="127.0.0.2")
    assert await answered(a) and await answered(b)
    c = await RawClient.connect(port, source="127.0.0.3")
    assert await closed_by_proxy(c)
    assert await limit(proxy, "max_connections") == 1
    assert proxy.admission.by_source == {"127.0.0.1": 1, "127.0.0.2": 1}


async def test_first_request_timeout_closes_silent_and_dribbling_clients(
        nursery: trio.Nursery) -> None:
    fake = await FakeBroker(node_ids=[0]).start(nursery)
    proxy = await start(nursery, fake, first_request_timeout="0.5")
    port = proxy.bootstrap_port
    assert port is not None
    silent = await RawClient.connect(port)
    dribbler = await RawClient.connect(port)
    request = encode_request(api_keys.API_VERSIONS, 3, 1, API_VERSIONS_V3)
    await dribbler.send(request[:5])  # a frame that never completes
    fine = await RawClient.connect(port)
    assert await answered(fine)
    assert await closed_by_proxy(silent, 3)
    assert await closed_by_proxy(dribbler, 3)
    assert await limit(proxy, "first_request_timeout") == 2
    await trio.sleep(0.6)
    assert await answered(fine, 2), "a client that spoke in time was closed"


async def test_idle_timeout_spares_connections_waiting_for_an_answer(
        nursery: trio.Nursery) -> None:
    fake = await FakeBroker(node_ids=[0], delay=1.5).start(nursery)
    proxy = await start(nursery, fake, idle_timeout="0.6")
    port = proxy.bootstrap_port
    assert port is not None
    busy = await RawClient.connect(port)
    idle = await RawClient.connect(port)
    await idle.send(encode_request(api_keys.API_VERSIONS, 3, 1, API_VERSIONS_V3))
    await busy.send(encode_request(api_keys.API_VERSIONS, 3, 1, API_VERSIONS_V3))
    assert await idle.read_frame() is not None
    # The busy client waits 1.5 s for its second answer: longer than the idle timeout.
    assert await busy.read_frame() is not None
    await busy.send(encode_request(api_keys.METADATA, 12, 2, METADATA))
    assert await busy.read_frame(5) is not None, "closed while a request was in flight"
    assert await closed_by_proxy(idle, 5)
    assert await closed_by_proxy(busy, 5)  # idle after its answer, so closed as well
    assert await limit(proxy, "idle_timeout") == 2


async def test_oversized_frame_is_refused_and_counted(nursery: trio.Nursery) -> None:
    fake = await FakeBroker(node_ids=[0]).start(nursery)
    proxy = await start(nursery, fake, max_frame_bytes=4096)
    port = proxy.bootstrap_port
    assert port is not None
    big = await RawClient.connect(port)
    await big.send(struct.pack(">i", 100 * 1024 * 1024) + b"\0" * 64)
    assert await closed_by_proxy(big)
    assert await limit(proxy, "max_frame_bytes") == 1


async def test_max_inflight_stops_reading_instead_of_buffering(nursery: trio.Nursery) -> None:
    fake = await FakeBroker(node_ids=[0], delay=0.05).start(nursery)
    proxy = await start(nursery, fake, max_inflight=4)
    port = proxy.bootstrap_port
    assert port is not None
    client = await RawClient.connect(port)
    n = 40
    await client.send(b"".join(encode_request(api_keys.API_VERSIONS, 3, i, API_VERSIONS_V3)
                               for i in range(n)))
    with trio.fail_after(20):
        seen_peak = 0
        got = 0
        while got < n:
            seen_peak = max(seen_peak, max((len(s.ordered) for s in proxy.sessions),
                                           default=0))
            assert await client.read_frame() is not None
            got += 1
    assert seen_peak <= 4, f"{seen_peak} requests in flight with max_inflight=4"
    assert await limit(proxy, "max_inflight") >= 1


@pytest.mark.broker
def test_stalled_connections_cost_no_broker_connection(tansu: TansuBroker,
                                                       tmp_path: Path) -> None:
    """The upstream is opened at the first complete request: connections that send a
    byte and stall (a slowloris) hold no broker connection; a request opens one. The
    only other connections are discovery's, one kept open by each worker."""
    with kproxy_process(tansu.bootstrap, tmp_path, "--discovery-interval", "3600",
                        "--first-request-timeout", "60") as kp:
        workers = kp.worker_pids()
        wait_until(lambda: direct_connections(workers, tansu.port) == len(workers), 60,
                   "each worker's discovery connection")
        stalled = [socket.create_connection(("127.0.0.1", kp.bootstrap_port))
                   for _ in range(200)]
        try:
            for s in stalled:
                s.sendall(b"\x00")
            deadline = time.monotonic() + 60
            while 'kproxy_client_connections{listener="bootstrap"} 200.0' not in (
                    kp.http_get("/metrics")[1]):
                assert time.monotonic() < deadline, "the proxy did not take the connections"
                time.sleep(0.1)
            assert direct_connections(workers, tansu.port) == len(workers)
            with socket.create_connection(("127.0.0.1", kp.bootstrap_port)) as live:
                live.sendall(encode_request(api_keys.API_VERSIONS, 3, 1, API_VERSIONS_V3))
                live.settimeout(30)
                assert len(live.recv(65536)) > 8  # answered through the broker
                assert direct_connections(workers, tansu.port) == len(workers) + 1
        finally:
            for s in stalled:
                s.close()
