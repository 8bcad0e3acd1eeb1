"""Discovery keeps one connection to the first bootstrap server open from round to round.

The broker is ``FakeBroker`` (named as a fake: it counts the connections it accepts
and can drop them all at once, as a broker restart or ``connections.max.idle.ms``
would), and a name's answers come from a resolver of the test's (a DNS switch-over
cannot be staged on loopback otherwise). Discovery's rounds are the fakes' Metadata
v4 requests.
"""

from __future__ import annotations

import logging
import socket

import pytest
import trio

from kproxy.codecs import api_keys
from kproxy.runtime.server import Proxy
from kproxy.runtime.upstream import Address, AddressCache

from ..fake_broker import FakeBroker
from ..support import free_port, make_config
from .test_proxy_inprocess import start_proxy


def discovery_rounds(fake: FakeBroker) -> int:
    return sum(1 for key, version, _ in fake.requests
               if key == api_keys.METADATA and version == 4)


async def rounds(fake: FakeBroker, count: int) -> None:
    """Wait for ``count`` more discovery rounds."""
    goal = discovery_rounds(fake) + count
    with trio.fail_after(30):
        while discovery_rounds(fake) < goal:
            await trio.sleep(0.01)


async def test_rounds_share_one_connection_and_a_dropped_one_is_replaced_quietly(
        nursery: trio.Nursery, caplog: pytest.LogCaptureFixture) -> None:
    fake = await FakeBroker(node_ids=[0]).start(nursery)
    await start_proxy(nursery, fake.bootstrap, discovery_interval="0.02")
    await rounds(fake, 5)
    assert fake.connections[0] == 1
    for stream in list(fake.streams):  # the broker drops it between two rounds
        await stream.aclose()
    await rounds(fake, 5)
    assert fake.connections[0] == 2
    assert "backend discovery failed" not in caplog.text


async def test_a_later_server_is_not_kept_so_the_first_is_tried_again(
        nursery: trio.Nursery, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    fake = await FakeBroker(node_ids=[0]).start(nursery)
    nothing_there = f"127.0.0.1:{free_port()}"
    await start_proxy(nursery, f"{nothing_there},{fake.bootstrap}", discovery_interval="0.02")
    before = fake.connections[0]
    await rounds(fake, 5)
    assert fake.connections[0] >= before + 5  # a connection per round, as before
    assert "backend discovery failed" not in caplog.text


async def test_a_name_that_moves_is_followed_as_its_answer_renews(
        nursery: trio.Nursery) -> None:
    """The upstream is a name; its answer (kept ``upstream_dns_ttl``) moves from one
    broker to another of a different cluster, as a DNS switch-over would. The kept
    connection is left for the new address once the answer renews, then kept there."""
    blue = await FakeBroker(node_ids=[0], cluster_id="blue").start(nursery)
    green = await FakeBroker(node_ids=[0], cluster_id="green").start(nursery)
    points_at = [blue.ports[0]]

    async def resolve(host: str, port: int) -> list[Address]:
        return [(socket.AF_INET, ("127.0.0.1", points_at[0]))]

    proxy = Proxy(make_config("kafka.test:9092", discovery_interval="0.02",
                              upstream_dns_ttl="0.1"))
    proxy.rotation.names = AddressCache(0.1, resolve)
    await nursery.start(lambda task_status: proxy.run(handle_signals=False,
                                                      task_status=task_status))
    await rounds(blue, 10)  # over more than one renewal of the answer
    assert blue.connections[0] == 1 and proxy.state.view.cluster_id == "blue"
    points_at[0] = green.ports[0]
    with trio.fail_after(30):
        while proxy.state.view.cluster_id != "green":
            await trio.sleep(0.01)
    await rounds(green, 10)
    assert green.connections[0] == 1
