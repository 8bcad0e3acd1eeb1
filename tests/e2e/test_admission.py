"""Admission accounting stays exact under churn, and the open-file budget caps admission.

The churn test runs the proxy in-process against a real tansu broker and opens and
closes thousands of connections every way a client can end one: before any byte,
with a reset (SO_LINGER 0), in the middle of a request, with a request in flight,
and (TLS) in the middle of a handshake. Afterwards exactly ``max_connections`` new
connections must all be admitted, the next one refused, and the internal count and
the gauges agree.
"""

from __future__ import annotations

import logging
import os
import random
import resource
import socket
import ssl
import struct
from pathlib import Path
from typing import Any

import pytest
import trio

from kproxy.codecs import api_keys
from kproxy.codecs.framing import FrameReader
from kproxy.embedded_broker import TansuBroker
from kproxy.runtime.admission import plan_budget
from kproxy.runtime.server import Proxy

from ..support import (
    KproxyProcess,
    RawClient,
    direct_connections,
    encode_request,
    http_get,
    kproxy_process,
    make_config,
)
from .test_security import API_VERSIONS_V3, Pki, closed_by_proxy, pki  # noqa: F401

CHURN = 3000
MAX = 250
REQUEST = encode_request(api_keys.API_VERSIONS, 3, 1, API_VERSIONS_V3)


async def start(nursery: trio.Nursery, upstream: str, **overrides: Any) -> Proxy:
    proxy = Proxy(make_config(upstream, **overrides))
    started: Proxy = await nursery.start(lambda task_status: proxy.run(
        handle_signals=False, task_status=task_status))
    return started


async def gauges(proxy: Proxy) -> dict[str, float]:
    """Samples by exact name (labels summed) from the proxy's own /metrics."""
    assert proxy.http_port is not None
    _, _, body = await http_get(proxy.http_port, "/metrics")
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        if line.startswith("#") or not line:
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0]
        out[name] = out.get(name, 0.0) + float(value)
    return out


async def churn_one(port: int, kind: int, tls: ssl.SSLContext | None) -> None:
    """One connection, ended in one of the ways a client can end it."""
    sock = trio.socket.socket()
    try:
        await sock.connect(("127.0.0.1", port))
        if kind == 1 or kind == 3:  # reset instead of a FIN
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        if kind == 2 or kind == 3:  # half a request
            await sock.send(REQUEST[: len(REQUEST) // 2])
        elif kind == 4:  # a whole request, its answer never read
            await sock.send(REQUEST)
        elif kind == 5 and tls is not None:  # half a TLS handshake, then a reset
            stream = trio.SSLStream(trio.SocketStream(sock), tls, server_hostname="localhost")
            with trio.move_on_after(0.05):
                await stream.do_handshake()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass  # refused or reset by the proxy: still churn
    finally:
        sock.close()


async def settle(proxy: Proxy, timeout: float = 120) -> None:
    """Wait until every churned connection has been closed by the proxy too: its
    admission given back and its session gone (and so its gauge decremented)."""
    with trio.fail_after(timeout):
        while proxy.admission.open or proxy.sessions:
            await trio.sleep(0.1)


async def assert_exactly_max_admitted(proxy: Proxy, port: int, maximum: int,
                                      tls: ssl.SSLContext | None = None) -> None:
    clients: list[RawClient] = []
    for _ in range(maximum):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        client = RawClient(stream)
        if tls is not None:
            tls_stream = trio.SSLStream(stream, tls, server_hostname="localhost")
            # Now, not when all are open: the proxy times out a handshake that has not
            # completed within tls_handshake_timeout of the accept.
            await tls_stream.do_handshake()
            client.stream = tls_stream  # type: ignore[assignment]
        clients.append(client)

    async def ask(client: RawClient, i: int) -> None:
        resp = await client.request(api_keys.API_VERSIONS, 3, i, API_VERSIONS_V3)
        assert resp.body["error_code"] == 0

    async with trio.open_nursery() as n:  # all at once: every one is answered
        for i, client in enumerate(clients):
            n.start_soon(ask, client, i)
    assert proxy.admission.open == maximum
    seen = await gauges(proxy)
    assert seen["kproxy_client_connections"] == maximum
    assert seen["kproxy_client_connections_admitted"] == maximum
    refused_before = seen.get("kproxy_limit_hits_total", 0.0)
    extra = await RawClient.connect(port)
    assert await closed_by_proxy(extra, 10), "one past max_connections was admitted"
    assert (await gauges(proxy))["kproxy_limit_hits_total"] == refused_before + 1
    for client in clients:  # the refusal disturbed no admitted connection
        await client.aclose()
    await settle(proxy)
    seen = await gauges(proxy)
    assert seen["kproxy_client_connections"] == 0
    assert seen["kproxy_client_connections_admitted"] == 0


async def test_admission_is_exact_after_churn(nursery: trio.Nursery, tansu: TansuBroker) -> None:
    proxy = await start(nursery, tansu.bootstrap, max_connections=MAX,
                        max_connections_per_source=10 * MAX, node_id_range="111-111")
    port = proxy.bootstrap_port
    assert port is not None
    rnd = random.Random(7)
    for start_at in range(0, CHURN, 100):  # 100 at a time, every way of ending
        async with trio.open_nursery() as n:
            for _ in range(min(100, CHURN - start_at)):
                n.start_soon(churn_one, port, rnd.randrange(5), None)
    await settle(proxy)
    assert proxy.admission.by_source == {}
    assert (await gauges(proxy)).get("kproxy_client_connections", 0) == 0
    await assert_exactly_max_admitted(proxy, port, MAX)


async def test_admission_is_exact_after_tls_churn(nursery: trio.Nursery, tansu: TansuBroker,
                                                  pki: Pki) -> None:  # noqa: F811
    proxy = await start(nursery, tansu.bootstrap, max_connections=100,
                        max_connections_per_source=1000, tls_cert=pki.cert, tls_key=pki.key,
                        tls_handshake_timeout=10)
    port = proxy.bootstrap_port
    assert port is not None
    tls = ssl.create_default_context(cafile=str(pki.ca_file))
    rnd = random.Random(8)
    for _ in range(10):  # handshakes cut short, plaintext on the TLS port, resets
        async with trio.open_nursery() as n:
            for _ in range(50):
                n.start_soon(churn_one, port, rnd.choice((0, 1, 3, 4, 5)), tls)
    await settle(proxy)
    assert proxy.admission.by_source == {}
    await assert_exactly_max_admitted(proxy, port, 100, tls)


def test_fd_budget_reserves_listeners_and_halves_the_rest() -> None:
    budget = plan_budget(20_000, 20_000, None, listener_fds=2, broker_listener_fds=1024,
                         archive=True)
    assert budget.reserved > 1024 + 2
    assert budget.connections == (20_000 - budget.reserved) // 2
    tiny = plan_budget(256, 256, None, listener_fds=2, broker_listener_fds=1024,
                       archive=False)
    assert tiny.connections == 0


# ----------------------------------------------------------------------------- fd budget

FD_LIMIT = 400


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def _gauge(kp: KproxyProcess, name: str) -> float:
    for line in kp.http_get("/metrics")[1].splitlines():
        if line.split("{", 1)[0].split(" ", 1)[0] == name:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def _ping(sock: socket.socket, cid: int) -> bool:
    """One ApiVersions round trip; False when the proxy closed the connection."""
    sock.sendall(encode_request(api_keys.API_VERSIONS, 3, cid, API_VERSIONS_V3))
    reader = FrameReader()
    while reader.next_frame() is None:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return False
        if not data:
            return False
        reader.feed(data)
    return True


def test_flood_past_the_fd_budget_is_refused_at_accept(tmp_path: Path,
                                                       tansu: TansuBroker) -> None:
    """kproxy under `ulimit -n 400`: the cap follows the budget, no EMFILE ever."""
    # One worker: the open-file budget is a process's own, and which worker fills up
    # first is the kernel's spread of connections; one process shows the cap exactly.
    # The flood's connections are pinged one after another, each its first request:
    # on a loaded machine the last ones waited past the default first-request timeout
    # (10 s) and were closed as silent, which is not what this test is about.
    with kproxy_process(tansu.bootstrap, tmp_path, "--workers", "1",
                        "--first-request-timeout", "300", preexec=_low_fd_limit) as kp:
        effective = int(_gauge(kp, "kproxy_max_connections_effective"))
        assert 0 < effective < 200, effective  # well under max_connections (10,000)
        assert "max_connections lowered to what the open-file limit holds" in kp.log()
        control = socket.create_connection(("127.0.0.1", kp.bootstrap_port), timeout=30)
        assert _ping(control, 1)
        flood: list[socket.socket] = []
        try:
            for _ in range(effective + 150):
                s = socket.create_connection(("127.0.0.1", kp.bootstrap_port), timeout=30)
                flood.append(s)
            answered = sum(_ping(s, 1) for s in flood)
            assert answered == effective - 1  # the control client holds one place
            assert _ping(control, 2), "the control client was disturbed"
            hits = [ln for ln in kp.http_get("/metrics")[1].splitlines()
                    if ln.startswith('kproxy_limit_hits_total{limit="fds"}')]
            assert hits and float(hits[0].rsplit(" ", 1)[1]) == len(flood) - answered
            # Never half-opened: one upstream connection per admitted client, no more.
            upstream = direct_connections(kp.worker_pids(), tansu.port)
            assert upstream <= effective + 2  # + discovery, which may be connected now
            assert all(len(os.listdir(f"/proc/{pid}/fd")) < FD_LIMIT for pid in kp.worker_pids())
        finally:
            for s in flood:
                s.close()
        assert _ping(control, 3)
        control.close()
    log = kp.log()
    assert "EMFILE" not in log and "Too many open files" not in log


async def test_emfile_at_accept_is_counted_and_waited_out(
        nursery: trio.Nursery, tansu: TansuBroker, caplog: pytest.LogCaptureFixture) -> None:
    """Descriptors run out for real (this process's limit lowered under the proxy):
    accept's EMFILE is counted and logged once, nothing crashes, and the connections
    waiting in the backlog are served once descriptors are free again."""
    proxy = await start(nursery, tansu.bootstrap, node_id_range="111-111")
    port = proxy.bootstrap_port
    assert port is not None
    clients = [socket.socket() for _ in range(5)]  # made before the limit drops
    for c in clients:
        c.setblocking(False)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.dup(0)
    os.close(lowest_free)
    fds_hit = proxy.metrics.limits_hit.labels("fds")
    with caplog.at_level(logging.WARNING, logger="kproxy"):
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
        try:
            for c in clients:  # a connect needs no new descriptor; the proxy's accept does
                c.connect_ex(("127.0.0.1", port))
            with trio.fail_after(30):
                while fds_hit._value.get() < 3:  # accept failed, waited, tried again
                    await trio.sleep(0.05)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for i, c in enumerate(clients):
            c.setblocking(True)
            c.settimeout(30)
            assert await trio.to_thread.run_sync(_ping, c, i), "a waiting client was dropped"
            c.close()
    warnings = [r.getMessage() for r in caplog.records if "at accept" in r.getMessage()]
    assert len(warnings) == 1 and "EMFILE" in warnings[0]
    await settle(proxy)  # and the count came back to zero
