"""Fuzz the running proxy: random and mutated frames from raw clients, a real broker behind.

Each input goes on a fresh connection. It must end in a clean close or in a
response, never in a crash; a control connection opened first must keep getting
correct answers throughout; and when the inputs are done the proxy holds no
sessions and counts no internal errors. ``make fuzz`` runs this with many more
examples (hypothesis profile ``fuzz``); ``make test`` runs the short profile.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kproxy.codecs import api_keys
from kproxy.embedded_broker import TansuBroker
from kproxy.runtime.server import Proxy
from kproxy.session import splice

from ..conftest import load_vectors
from ..support import RawClient, encode_request, make_config
from .test_security import API_VERSIONS_V3, metric

REQUESTS = [v.frame for v in load_vectors() if v.direction == "request"]


def framed(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


@st.composite
def mutated_request(draw: st.DrawFn) -> bytes:
    frame = bytearray(draw(st.sampled_from(REQUESTS)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "api"]))
        pos = draw(st.integers(0, max(len(frame) - 1, 0)))
        if op == "flip" and frame:
            frame[pos] ^= draw(st.integers(1, 255))
        elif op == "truncate":
            del frame[pos:]
        elif op == "insert":
            frame[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "api" and len(frame) >= 4:  # any key and version, the body kept
            frame[0:4] = struct.pack(">hh", draw(st.integers(-5, 100)),
                                     draw(st.integers(-2, 20)))
        elif frame:
            del frame[pos]
    return framed(bytes(frame))


SPLICE_FROM = 64 * 1024  # the default splice_from
# A first request that opens the upstream connection: a large frame after it can be
# spliced (kproxy.session.splice), where a connection's first frame never is.
OPENER = encode_request(api_keys.API_VERSIONS, 3, 1, API_VERSIONS_V3)


@st.composite
def large_request(draw: st.DrawFn) -> bytes:
    """A mutated request padded past the splice threshold, after an opener; sometimes cut
    short (the client then hangs up in the middle of a spliced frame)."""
    frame = bytearray(draw(mutated_request()))
    size = draw(st.integers(SPLICE_FROM, 3 * SPLICE_FROM))
    frame += bytes([draw(st.integers(0, 255))]) * max(0, size - len(frame))
    frame[0:4] = struct.pack(">i", len(frame) - 4)
    cut = draw(st.one_of(st.just(len(frame)), st.integers(5, len(frame))))
    return OPENER + bytes(frame[:cut])


# What a raw client sends on one connection: whole mutated frames, bare random bytes,
# a random size prefix with what follows, or a large frame after an opener.
INPUTS = st.one_of(
    large_request(),
    mutated_request(),
    st.binary(min_size=1, max_size=64),
    st.builds(lambda size, rest: struct.pack(">i", size) + rest,
              st.integers(-(2**31), 2**31 - 1), st.binary(max_size=32)),
    st.lists(mutated_request(), min_size=2, max_size=4).map(b"".join),
)


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    log = tmp_path_factory.mktemp("fuzz") / "tansu.log"
    with TansuBroker(log_path=log) as broker:
        yield broker


async def one_input(port: int, data: bytes) -> str:
    """Send one input; say how the connection ended: closed, answered or open.

    "open" means the proxy still waits for the rest of a frame or for the broker;
    both end by a timeout, which the checks after the inputs prove.
    """
    client = await RawClient.connect(port)
    outcome = "open"
    try:
        await client.send(data)
        deadline = trio.current_time() + 3
        while trio.current_time() < deadline:
            with trio.move_on_at(deadline):
                frame = await client.read_frame(5)
                if frame is None:
                    return "closed" if outcome == "open" else "answered+closed"
                outcome = "answered"
                deadline = trio.current_time() + 0.2  # a little while for more answers
    except (trio.BrokenResourceError, ConnectionResetError):
        return "closed"
    finally:
        await client.aclose()
    return outcome


async def fuzz_proxy(broker: TansuBroker, inputs: list[bytes]) -> None:
    proxy = Proxy(make_config(broker.bootstrap, first_request_timeout="0.5",
                              max_frame_bytes=1 << 20))
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: proxy.run(handle_signals=False,
                                                          task_status=task_status))
        port = proxy.bootstrap_port
        assert port is not None
        control = await RawClient.connect(port)
        # Its first request now, before the first-request timeout could close it.
        resp = await control.request(api_keys.API_VERSIONS, 3, 0, API_VERSIONS_V3)
        assert resp.body["error_code"] == 0
        for i, data in enumerate(inputs):
            await one_input(port, data)
            resp = await control.request(api_keys.API_VERSIONS, 3, i + 1, API_VERSIONS_V3)
            assert resp.body["error_code"] == 0, "the control connection was disturbed"
        with trio.fail_after(10):  # every fuzzed session ends; only the control one is left
            while len(proxy.sessions) > 1:
                await trio.sleep(0.1)
        assert await metric(proxy, "kproxy_internal_errors_total") == 0
        await control.aclose()
        proxy.shutdown()


# make fuzz raises this (KPROXY_FUZZ_EXAMPLES); each example is up to 15 connections.
EXAMPLES = int(os.environ.get("KPROXY_FUZZ_EXAMPLES", "12"))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@given(st.lists(INPUTS, min_size=1, max_size=15))
def test_random_and_mutated_frames_never_hurt_the_proxy(fuzz_broker: TansuBroker,
                                                        inputs: list[bytes]) -> None:
    assert fuzz_broker.process is not None and fuzz_broker.process.poll() is None, \
        "the broker itself died (a broker bug, not the proxy's)"
    trio.run(fuzz_proxy, fuzz_broker, inputs)


def test_an_encoded_request_is_a_sanity_check_for_the_harness(fuzz_broker: TansuBroker) -> None:
    """The harness sees a well-formed request answered, so 'answered' is reachable."""
    async def run() -> str:
        proxy = Proxy(make_config(fuzz_broker.bootstrap))
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: proxy.run(handle_signals=False,
                                                              task_status=task_status))
            assert proxy.bootstrap_port is not None
            outcome = await one_input(proxy.bootstrap_port, encode_request(
                api_keys.API_VERSIONS, 3, 7, API_VERSIONS_V3))
            proxy.shutdown()
            return outcome

    assert trio.run(run) == "answered"


def test_large_inputs_take_the_splice_path(fuzz_broker: TansuBroker) -> None:
    """What ``large_request`` makes is spliced: the fuzzer reaches the new path."""
    async def run() -> int:
        proxy = Proxy(make_config(fuzz_broker.bootstrap))
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: proxy.run(handle_signals=False,
                                                              task_status=task_status))
            assert proxy.bootstrap_port is not None
            before = splice.PIPES.frames
            body = struct.pack(">hhih", api_keys.FETCH, 4, 2, 1) + b"t"
            body += bytes(2 * SPLICE_FROM)
            await one_input(proxy.bootstrap_port, OPENER + framed(body))
            spliced = splice.PIPES.frames - before
            assert await metric(proxy, "kproxy_internal_errors_total") == 0
            proxy.shutdown()
            return spliced

    assert trio.run(run) == 1
