"""ParkingLot with stand-in sessions on socket pairs: wake-ups, deadlines, sweeps, heap.

The lot needs only a small part of a session (its descriptors, last activity, what it
does when woken); the stand-in records what the lot asks of it. Real sessions in a
real proxy: tests/e2e/test_parking.py.
"""

from __future__ import annotations

import gc
import socket
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from kproxy.session.parked import parking
from kproxy.session.parked.parking import ParkingLot


class StandIn:
    """What the lot uses of a session: one socket pair per side, the far ends ours."""

    def __init__(self) -> None:
        self.client, self.client_peer = socket.socketpair()
        self.upstream, self.upstream_peer = socket.socketpair()
        self.parked = False
        self.ended = False
        self.ordered: list[object] = []
        self.last_activity = trio.current_time()
        self.woken: list[int] = []
        self.asked = 0
        self.asked_at: list[float] = []  # trio's clock at each ask
        self.abandoned = False

    def parking_fds(self) -> tuple[int, ...]:
        return (self.client.fileno(), self.upstream.fileno())

    async def resume(self, readable: int = -1) -> None:
        self.woken.append(readable)

    def park_if_idle(self) -> None:
        self.asked += 1
        self.asked_at.append(trio.current_time())

    def abandon(self) -> None:
        self.abandoned = True

    def close(self) -> None:
        for s in (self.client, self.client_peer, self.upstream, self.upstream_peer):
            s.close()


@pytest.fixture
async def lot(nursery: trio.Nursery) -> AsyncIterator[tuple[ParkingLot, list[float]]]:
    timeout = [0.0]
    lot = ParkingLot(lambda: timeout[0])
    nursery.start_soon(lot.run, nursery)
    await trio.testing.wait_all_tasks_blocked()
    yield lot, timeout


async def woken(s: StandIn, n: int = 1) -> None:
    with trio.fail_after(5):
        while len(s.woken) < n:
            await trio.sleep(0.005)


async def test_either_socket_wakes_its_session_once_and_says_which(
        lot: tuple[ParkingLot, list[float]]) -> None:
    park, _ = lot
    s = StandIn()
    assert park.park(s)  # type: ignore[arg-type]
    assert s.parked and len(park) == 1
    s.client_peer.send(b"x")
    s.upstream_peer.send(b"y")  # both ready in one poll: one wake-up
    await woken(s)
    await trio.sleep(0.05)
    assert s.woken == [s.client.fileno()] and not s.parked and not park
    # Parked again (the registrations are re-armed, not added): the upstream's end of
    # stream wakes it, and bytes waiting on the client side do not wake it twice.
    s.client.recv(1)
    s.upstream.recv(1)
    assert park.park(s)
    s.upstream_peer.close()
    await woken(s, 2)
    assert s.woken[1] == s.upstream.fileno()
    s.close()


async def test_a_descriptor_number_reused_after_a_close_parks_again(
        lot: tuple[ParkingLot, list[float]]) -> None:
    park, _ = lot
    # Sockets earlier tests in this process left to the garbage collector close first:
    # closed by a collection between the two stand-ins, their lower numbers would be
    # handed out instead of the first one's.
    gc.collect()
    first = StandIn()
    assert park.park(first)  # type: ignore[arg-type]
    first.client_peer.send(b"x")
    await woken(first)
    fds = first.parking_fds()
    first.close()  # its registrations go with its sockets
    second = StandIn()
    assert set(second.parking_fds()) & set(fds)  # the kernel hands the numbers out again
    assert park.park(second)  # type: ignore[arg-type]
    second.client_peer.send(b"x")
    await woken(second)
    assert first.woken == [fds[0]] and second.woken == [second.client.fileno()]
    second.close()


async def test_the_idle_deadline_wakes_a_parked_session_and_a_reload_applies(
        lot: tuple[ParkingLot, list[float]]) -> None:
    park, timeout = lot
    timeout[0] = 0.3
    s = StandIn()
    parked_at = trio.current_time()
    park.park(s)  # type: ignore[arg-type]
    await woken(s)
    assert s.woken == [-1] and 0.25 <= trio.current_time() - parked_at < 1.0
    # Parked with a long timeout, then the timeout is shortened: it wakes at the new one.
    timeout[0] = 600.0
    s.last_activity = trio.current_time()
    park.park(s)  # type: ignore[arg-type]
    await trio.sleep(0.1)
    timeout[0] = 0.2
    park.reconfigured()
    await woken(s, 2)
    assert trio.current_time() - s.last_activity < 1.0
    s.close()


async def test_the_sweep_asks_sessions_idle_long_enough_and_drops_busy_ones(
        lot: tuple[ParkingLot, list[float]], monkeypatch: pytest.MonkeyPatch) -> None:
    park, _ = lot
    monkeypatch.setattr(parking, "PARK_AFTER_S", 0.2)
    monkeypatch.setattr(parking, "SWEEP_S", 0.05)
    idle, busy = StandIn(), StandIn()
    busy.ordered.append(object())
    park.note_idle(idle)  # type: ignore[arg-type]
    park.note_idle(busy)  # type: ignore[arg-type]
    with trio.fail_after(2):
        while not idle.asked:
            await trio.sleep(0.01)
    # Not asked before it had been idle PARK_AFTER_S, by trio's clock (on a busy machine
    # a fixed sleep of less than that can last longer: the clock is what the lot reads).
    assert idle.asked_at[0] - idle.last_activity >= 0.2
    await trio.sleep(0.2)
    assert idle.asked == 1 and busy.asked == 0  # asked once; the busy one forgotten
    idle.close()
    busy.close()


async def test_the_deadline_heap_stays_small_when_sessions_wake_often(
        lot: tuple[ParkingLot, list[float]]) -> None:
    park, timeout = lot
    timeout[0] = 600.0
    sessions = [StandIn() for _ in range(5)]
    for round_ in range(100):
        for s in sessions:
            s.last_activity = trio.current_time()
            park.park(s)  # type: ignore[arg-type]
        for s in sessions:
            s.client_peer.send(b"x")
        for s in sessions:
            await woken(s, round_ + 1)
            s.client.recv(1)
    assert len(park._deadlines) <= 2 * len(park) + 64 + 1
    for s in sessions:
        s.close()


async def test_cancelled_it_closes_the_sessions_still_parked() -> None:
    lot = ParkingLot(lambda: 0.0)
    kept, gone = StandIn(), StandIn()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lot.run, nursery)
        await trio.testing.wait_all_tasks_blocked()
        lot.park(kept)  # type: ignore[arg-type]
        lot.park(gone)  # type: ignore[arg-type]
        gone.client_peer.send(b"x")
        await woken(gone)
        nursery.cancel_scope.cancel()
    assert kept.abandoned and not kept.parked and not gone.abandoned
    late = StandIn()
    assert not lot.park(late)  # type: ignore[arg-type]  # not running: refused
    for s in (kept, gone, late):
        s.close()
