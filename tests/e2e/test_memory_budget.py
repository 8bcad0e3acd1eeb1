"""The memory budget and the cut-through relay.

Unit tests drive ``MemoryBudget`` and the frame reader's pass-through without
sockets; the end-to-end tests fetch large responses through a real kproxy process
in front of a real tansu broker and read the proxy's peak memory from /proc.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from kproxy.codecs import api_keys
from kproxy.codecs.framing import FrameReader
from kproxy.embedded_broker import TansuBroker
from kproxy.memory import Charge, MemoryBudget

from ..support import KproxyProcess, RawClient, kproxy_process, metric_value, rss_kib
from .test_security import API_VERSIONS_V3

# ----------------------------------------------------------------------------- unit


async def test_reservations_wait_in_order_and_are_woken_by_writes() -> None:
    budget = MemoryBudget(100)
    await budget.reserve(80)
    order: list[str] = []

    async def want(name: str, n: int) -> None:
        await budget.reserve(n)
        order.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(want, "big", 60)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(want, "small", 10)  # would fit, but waits its turn
        await trio.testing.wait_all_tasks_blocked()
        assert order == [] and budget.waits == 2
        budget.give_back(30)  # 50 used: the small one would fit, the big one not yet
        await trio.testing.wait_all_tasks_blocked()
        assert order == []  # first come, first served: the big one is not starved
        budget.give_back(20)  # 30 used: both fit now
        await trio.testing.wait_all_tasks_blocked()
    assert sorted(order) == ["big", "small"] and budget.used == 100
    assert budget.overdrafts == 0


async def test_only_waiters_holding_bytes_is_not_a_deadlock() -> None:
    """Two connections each hold part of a frame and need more than is left: nobody
    else will give room back, so the first is let through over the budget."""
    budget = MemoryBudget(100)
    a, b = Charge(budget), Charge(budget)
    a.settle(40)
    b.settle(40)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.reserve_to, 90)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(b.reserve_to, 90)
            await trio.testing.wait_all_tasks_blocked()
            assert a.held == 90 and budget.overdrafts == 1  # a went through at once
            a.release()  # a finished its frame: b fits again
    assert b.held == 90 and budget.used == 90


async def test_idle_connections_hold_nothing_of_the_budget() -> None:
    """A connection waiting for its next request holds no reservation: ten thousand idle
    ones leave the whole budget to those moving data."""
    budget = MemoryBudget(1024 * 1024)
    idle = [Charge(budget) for _ in range(10_000)]
    for charge in idle:
        await charge.wait_for_room()  # what each does before a receive that may block
    assert budget.used == 0
    busy = Charge(budget)
    busy.settle(1024 * 1024)  # one connection fills it...
    with trio.move_on_after(0.05) as waited:
        await idle[0].wait_for_room()  # ...and the next receive waits for room
    assert waited.cancelled_caught
    busy.release()
    await idle[0].wait_for_room()
    assert budget.used == 0


async def test_a_cancelled_waiter_leaves_nothing_behind() -> None:
    budget = MemoryBudget(10)
    await budget.reserve(10)
    with trio.move_on_after(0.05):
        await budget.reserve(5)
    assert budget.used == 10
    budget.give_back(10)
    assert budget.used == 0 and budget.fits(10)


def test_a_pending_frame_is_handed_over_for_pass_through() -> None:
    body = bytes(range(256)) * 4000  # 1,024,000 bytes
    wire = struct.pack(">i", len(body)) + body
    reader = FrameReader()
    reader.feed(wire[:5000])
    total, head = reader.pending() or (0, b"")
    assert total == len(wire) and head == wire[:8]
    parts, rest = reader.take_partial()
    assert b"".join(parts) == wire[:5000] and rest == len(wire) - 5000
    assert reader.held() == 0 and reader.pending() is None
    reader.feed(struct.pack(">i", 3) + b"abc")  # what follows the passed-through frame
    assert reader.frames() == [b"abc"]


def test_a_pending_frame_can_be_received_in_place() -> None:
    body = b"x" * 300_000
    wire = struct.pack(">i", len(body)) + body
    reader = FrameReader()
    reader.feed(wire[:1000])
    reader.open_in_place()
    assert reader.held() == len(wire)
    room = reader.room()
    assert room is not None and len(room) == len(wire) - 1000
    room[:] = wire[1000:]
    reader.filled(len(room))
    assert reader.frames() == [body]


# ----------------------------------------------------------------------------- end to end

TOPIC = "big"
MESSAGE = 100_000
MESSAGES = 80  # 8 MB on the partition; tansu answers a fetch with about 5 MB of it
BUDGET = 16 * 1024 * 1024


def _fetch_v4(correlation_id: int, topic: str, max_bytes: int) -> bytes:
    """A Fetch v4 request for partition 0 from offset 0 (written by hand: the proxy
    relays Fetch opaquely, so its codec has no request schema)."""
    client = b"mem-test"
    t = topic.encode()
    body = (struct.pack(">hhih", 1, 4, correlation_id, len(client)) + client
            + struct.pack(">iiiib", -1, 500, 1, max_bytes, 0)
            + struct.pack(">ih", 1, len(t)) + t
            + struct.pack(">iiqi", 1, 0, 0, max_bytes))
    return struct.pack(">i", len(body)) + body


async def _advertised_max(port: int, api_key: int) -> int:
    client = await RawClient.connect(port)
    try:
        resp = await client.request(api_keys.API_VERSIONS, 3, 1, API_VERSIONS_V3)
    finally:
        await client.aclose()
    return int(next(e["max_version"] for e in resp.body["api_keys"]
                    if e["api_key"] == api_key))


def _rss_peaks_kib(kp: KproxyProcess) -> dict[int, int]:
    """Each worker's peak RSS: the budget is a worker's own (one per process)."""
    return {pid: rss_kib(pid, "VmHWM") for pid in kp.worker_pids()}


def _grown_mib(before: dict[int, int], after: dict[int, int]) -> float:
    """The most any one worker's peak grew."""
    return max(after[pid] - before[pid] for pid in before) / 1024


def _produce(bootstrap: str) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=1)])[TOPIC].result(30)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                  "message.max.bytes": 2_000_000, "compression.type": "none"})
    for i in range(MESSAGES):
        p.produce(TOPIC, bytes([i % 251]) * MESSAGE)
    assert p.flush(60) == 0


async def _fetch_all(port: int, readers: int, pause: float, chunk: int) -> list[int]:
    """``readers`` connections fetch the partition at once; each reads ``chunk`` bytes
    per ``pause`` seconds (0: as fast as it can). Returns each response's size."""
    sizes: list[int] = []

    async def one(i: int) -> None:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(_fetch_v4(i, TOPIC, 64 * 1024 * 1024))
        got = bytearray()
        while len(got) < 4 or len(got) < 4 + struct.unpack(">i", got[:4])[0]:
            data = await stream.receive_some(chunk)
            assert data, "connection closed mid-response"
            got += data
            if pause:
                await trio.sleep(pause)
        sizes.append(len(got))
        await stream.aclose()

    with trio.fail_after(240):
        async with trio.open_nursery() as nursery:
            for i in range(readers):
                nursery.start_soon(one, i)
    return sizes


@pytest.mark.broker
async def test_large_fetches_stay_within_the_budget(tmp_path: Path) -> None:
    broker = TansuBroker(log_path=tmp_path / "tansu.log").start()
    try:
        await trio.to_thread.run_sync(_produce, broker.bootstrap)
        with kproxy_process(broker.bootstrap, tmp_path,
                            "--max-buffered-bytes", str(BUDGET)) as kp:
            port = kp.broker_port_base  # node 111 is the first of the range
            (one,) = await _fetch_all(port, 1, 0, 1 << 20)  # warm up
            assert one > 4_000_000, "each response should carry megabytes"
            before = _rss_peaks_kib(kp)
            # 20 fast readers: held whole, this was 20 x 8 MB.
            assert await _fetch_all(port, 20, 0, 1 << 20) == [one] * 20
            # 10 slow readers (about 2.5 MB/s each): the proxy must not buffer for them.
            assert await _fetch_all(port, 10, 0.1, 256 * 1024) == [one] * 10
            grown_mib = _grown_mib(before, _rss_peaks_kib(kp))
            print(f"a worker's peak RSS grew {grown_mib:.1f} MiB for 20 fast + 10 slow readers "
                  f"of {one / 1e6:.1f} MB fetch responses (budget {BUDGET >> 20} MiB)")
            # The budget plus a receive buffer per connection, with room for the
            # allocator; holding the responses whole would be 20 x 5 MB and more.
            assert grown_mib < BUDGET / 2**20 + 30 * 0.25 + 24
            _, metrics = kp.http_get("/metrics")
            # One budget per worker: /metrics adds them up.
            assert metric_value(metrics, "kproxy_buffered_bytes_limit") == BUDGET * len(before)
    finally:
        broker.stop()


@pytest.mark.broker
@pytest.mark.parametrize("max_fetch_version", [None, 15])
async def test_fetches_that_must_be_rewritten_wait_for_room(
        tmp_path: Path, max_fetch_version: int | None) -> None:
    """librdkafka fetches at v16, whose responses may carry NodeEndpoints: streamed on
    plain TCP (received whole where they cannot be, and then admitted by the budget a
    few at a time), every consumer still reads everything within the budget. With
    --max-fetch-version 15 they fetch at v15 and pass through."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    broker = TansuBroker(log_path=tmp_path / "tansu.log").start()
    try:
        await trio.to_thread.run_sync(_produce, broker.bootstrap)
        cap = ["--max-fetch-version", str(max_fetch_version)] if max_fetch_version else []
        with kproxy_process(broker.bootstrap, tmp_path,
                            "--max-buffered-bytes", str(BUDGET), *cap) as kp:
            before = _rss_peaks_kib(kp)

            def consume(i: int) -> int:
                c = Consumer({"bootstrap.servers": kp.bootstrap, "group.id": f"g{i}",
                              "enable.partition.eof": True, "fetch.max.bytes": 64 << 20,
                              "max.partition.fetch.bytes": 64 << 20,
                              "receive.message.max.bytes": 80 << 20})
                c.assign([TopicPartition(TOPIC, 0, 0)])
                n, deadline = 0, time.monotonic() + 180
                try:
                    while time.monotonic() < deadline:
                        msg = c.poll(0.5)
                        if msg is None:
                            continue
                        if (error := msg.error()) is not None:
                            if error.code() == KafkaError._PARTITION_EOF and n:
                                break
                            continue
                        n += 1
                finally:
                    c.close()
                return n

            async with trio.open_nursery() as nursery:
                counts: list[int] = []

                async def run(i: int) -> None:
                    counts.append(await trio.to_thread.run_sync(consume, i))

                for i in range(8):
                    nursery.start_soon(run, i)
            assert counts == [MESSAGES] * 8
            grown_mib = _grown_mib(before, _rss_peaks_kib(kp))
            _, metrics = kp.http_get("/metrics")
            peak = float(next(line.split()[1] for line in metrics.splitlines()
                              if line.startswith("kproxy_buffered_bytes_peak ")))
            fetch_max = await _advertised_max(kp.bootstrap_port, api_keys.FETCH)
            assert (fetch_max == 15) if max_fetch_version else (fetch_max >= 16)
            print(f"proxy peak RSS grew {grown_mib:.1f} MiB for 8 consumers (max Fetch "
                  f"version {max_fetch_version or 'uncapped'}); budget peak "
                  f"{peak / 2**20:.1f} MiB")
            # Whole responses are admitted while they fit (one may go over when only
            # waiters hold bytes); a receive buffer per connection besides.
            # Each worker's peak, added up on /metrics: within the budget, per worker.
            assert peak <= len(before) * (BUDGET + 6e6 + 16 * 256 * 1024)
            assert grown_mib < 2 * BUDGET / 2**20 + 24  # 8 x 5 MB held whole: 40 MB+
    finally:
        broker.stop()
