"""A closed connection's session is freed when it ends, not by the cyclic collector.

A session in a reference cycle (the session, its writer, a callback that holds the
session) outlives its connection until CPython's full collection finds it, which on a
proxy whose start-up objects are frozen came about every 500 connections: each closed
session kept its sockets' objects, its buffers' bookkeeping and its state until then,
and that collection then had to walk them all with the event loop held.

So this test runs what users run (confluent-kafka producing and consuming through an
in-process proxy in front of tansu: ApiVersions, Metadata, telemetry, Produce, Fetch,
the express lane and parking) with the cyclic collector off, and asserts that once
every connection has closed no session object is left.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import trio
import trio.testing

from kproxy.embedded_broker import TansuBroker
from kproxy.session.client_writer import ClientWriter
from kproxy.session.session import Session
from kproxy.session.transport import SocketTransport

from ..support import produce_and_read_back
from .test_proxy_inprocess import start_proxy

LEFT_BEHIND = (Session, ClientWriter, SocketTransport)


@pytest.fixture
def collector_off() -> Iterator[None]:
    """The cyclic collector off for the test: only reference counting frees."""
    was_on = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def cyclic_garbage() -> list[str]:
    """Session-side objects that only the cyclic collector would free: a full
    collection that keeps what it finds (``DEBUG_SAVEALL``) instead of freeing it."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = [type(o).__qualname__ for o in gc.garbage if isinstance(o, LEFT_BEHIND)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    return found


def alive() -> list[str]:
    return [type(o).__qualname__ for o in gc.get_objects() if isinstance(o, LEFT_BEHIND)]


@pytest.mark.broker
@pytest.mark.usefixtures("collector_off")
async def test_closed_sessions_are_freed_without_the_cyclic_collector(
        nursery: trio.Nursery, shared_tansu: TansuBroker) -> None:
    proxy = await start_proxy(nursery, shared_tansu.bootstrap)
    bootstrap = f"127.0.0.1:{proxy.bootstrap_port}"
    values = [b"release-%d" % i for i in range(20)]
    got = await trio.to_thread.run_sync(produce_and_read_back, bootstrap, "session-release",
                                        values)
    assert got == values
    accepted = sum(sample.value for metric in proxy.metrics.registry.collect()
                   if metric.name == "kproxy_client_connections_accepted"
                   for sample in metric.samples if sample.name.endswith("_total"))
    assert accepted >= 2  # the clients' connections came through the proxy
    with trio.fail_after(30):
        while proxy.sessions:
            await trio.sleep(0.05)
    await trio.testing.wait_all_tasks_blocked()
    assert cyclic_garbage() == []
    # Nothing else holds them either (the parking lot's sweep lets go of an ended
    # session at its next pass).
    with trio.move_on_after(10):
        while alive():
            await trio.sleep(0.05)
    assert alive() == []
    proxy.shutdown()
