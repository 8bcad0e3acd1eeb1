"""Connection limits hold across workers: one count in the supervisor.

A real supervisor (in this process, so its per-worker rows can be read) runs two real
``kproxy run`` workers in front of a real tansu broker. Floods of raw TCP connections
from 127.0.0.1 go to the shared bootstrap port; the kernel spreads them over both
workers, and at most the limit is admitted in all. A worker killed with SIGKILL is
restarted, and the counts it held are given back.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from kproxy.embedded_broker import TansuBroker
from kproxy.supervisor.workers import Supervisor

from ..support import broker_port_base, free_port, http_get, make_config

pytestmark = pytest.mark.broker


@asynccontextmanager
async def supervised(tansu: TansuBroker, tmp_path: Path, *limits: str,
                     ) -> AsyncIterator[tuple[Supervisor, int]]:
    """Two workers under a supervisor; (the supervisor, the bootstrap port)."""
    port, http, base = free_port(), free_port(), broker_port_base()
    argv = ["--upstream", tansu.bootstrap, "--listen", f"127.0.0.1:{port}",
            "--broker-port-base", str(base), "--node-id-range", "111-111",
            "--first-request-timeout", "120", "--log-level", "warning", *limits]
    flags = dict(zip(limits[::2], limits[1::2], strict=True))
    cfg = make_config(tansu.bootstrap, http=f"127.0.0.1:{http}", **{
        k.removeprefix("--").replace("-", "_"): v for k, v in flags.items()})
    supervisor = Supervisor(cfg, argv, 2)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(supervisor.run)
        await until(lambda: ready(http), "both workers ready", timeout=90)
        try:
            yield supervisor, port
        finally:
            supervisor.stop()


async def ready(http: int) -> bool:
    try:
        _, _, body = await http_get(http, "/readyz")
    except OSError:
        return False
    return body.startswith(b"2/2 workers ready")


async def until(check: Callable[[], object], what: str, timeout: float = 30) -> None:
    """Wait for a condition (sync or async), polling; fail with ``what``."""
    with trio.move_on_after(timeout):
        while True:
            result = check()
            if hasattr(result, "__await__"):
                result = await result
            if result:
                return
            await trio.sleep(0.05)
    raise AssertionError(f"timed out waiting for: {what}")


class Flood:
    """Raw TCP connections that send nothing; each notes when the proxy closes it."""

    def __init__(self) -> None:
        self.open: list[trio.socket.SocketType] = []
        self.closed = 0

    async def connect(self, nursery: trio.Nursery, port: int, count: int) -> None:
        for _ in range(count):
            sock = trio.socket.socket()
            await sock.connect(("127.0.0.1", port))
            self.open.append(sock)
            nursery.start_soon(self._watch, sock)

    async def _watch(self, sock: trio.socket.SocketType) -> None:
        try:
            data = await sock.recv(1)
        except trio.ClosedResourceError:
            return  # closed by this test
        except OSError:
            data = b""
        if not data:
            self.closed += 1

    def close_all(self) -> None:
        for sock in self.open:
            sock.close()
        self.open.clear()


async def worker_metric(supervisor: Supervisor, index: int, name: str) -> float:
    """A sample summed over its labels, from one worker's own /metrics."""
    _, _, body = await http_get(supervisor.workers[index].http_port, "/metrics")
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


@pytest.mark.parametrize(("flag", "limit", "refused_as"), [
    ("--max-connections-per-source", 40, "max_connections_per_source"),
    ("--max-connections", 30, "max_connections"),
])
async def test_a_flood_over_two_workers_admits_at_most_the_limit(
        tansu: TansuBroker, tmp_path: Path, flag: str, limit: int, refused_as: str) -> None:
    async with (supervised(tansu, tmp_path, flag, str(limit)) as (sup, port),
                trio.open_nursery() as nursery):
        flood = Flood()
        await flood.connect(nursery, port, 3 * limit)
        await until(lambda: flood.closed >= 2 * limit, "the refused ones closed")
        assert sup.hub.open == limit
        admitted = [await worker_metric(sup, i, "kproxy_client_connections_admitted")
                    for i in (0, 1)]
        refused = [await worker_metric(sup, i, "kproxy_limit_hits_total")
                   for i in (0, 1)]
        assert sum(admitted) == limit and sum(refused) == 2 * limit
        # The kernel gave both workers connections; the limit held over their sum.
        assert all(a + r > 0 for a, r in zip(admitted, refused, strict=True)), (
            admitted, refused)
        rows = {r["limit"]: r for r in sup.limit_rows()}
        assert rows[refused_as]["hits"] == 2 * limit
        assert rows["max_connections"]["in_use"] == limit
        _, _, merged = await http_get(sup.cfg.http[1], "/metrics")
        assert b"kproxy_client_connections_admitted " + str(float(limit)).encode() \
            in merged
        assert flood.closed == 2 * limit  # no admitted one was closed

        flood.close_all()
        await until(lambda: sup.hub.open == 0, "every count returned")
        again = Flood()
        await again.connect(nursery, port, limit)
        await until(lambda: sup.hub.open == limit, "a new batch admitted")
        assert again.closed == 0
        again.close_all()
        nursery.cancel_scope.cancel()


async def test_a_worker_killed_with_sigkill_gives_its_counts_back(
        tansu: TansuBroker, tmp_path: Path) -> None:
    limit = 40
    async with (supervised(tansu, tmp_path, "--max-connections-per-source",
                           str(limit)) as (sup, port),
                trio.open_nursery() as nursery):
        flood = Flood()
        await flood.connect(nursery, port, limit)
        await until(lambda: sup.hub.open == limit, "the first batch admitted")
        rows = sup.worker_rows()
        victim = max(rows, key=lambda r: int(str(r["connections"])))
        held = int(str(victim["connections"]))
        assert held > 0 and victim["restarts"] == 0
        os.kill(int(str(victim["pid"])), signal.SIGKILL)

        def restarted() -> bool:
            row = sup.worker_rows()[int(str(victim["worker"]))]
            return bool(row["alive"] and row["pid"] != victim["pid"])

        await until(restarted, "the killed worker restarted", timeout=60)
        row = sup.worker_rows()[int(str(victim["worker"]))]
        assert row["restarts"] == 1 and row["given_back_at_last_exit"] == held
        assert sup.hub.open == limit - held
        await until(lambda: flood.closed == held, "the killed worker's clients closed")
        await until(lambda: ready(sup.cfg.http[1]), "both workers ready again", 60)
        # The room it held is free: a new batch up to the limit is admitted.
        more = Flood()
        await more.connect(nursery, port, held + 5)
        await until(lambda: more.closed >= 5, "the ones over the limit refused")
        assert sup.hub.open == limit and more.closed == 5
        _, _, merged = await http_get(sup.cfg.http[1], "/metrics")
        text = merged.decode()
        assert "kproxy_worker_restarts_total 1" in text
        assert f"kproxy_admission_given_back_total {float(held)!r}" in text
        flood.close_all()
        more.close_all()
        nursery.cancel_scope.cancel()
