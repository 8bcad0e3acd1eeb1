"""express.Turns: trio and the express lane never run Python at once, and when both
want to, they alternate: neither a busy trio nor a busy lane starves the other (with a
plain lock, whoever just gave it up takes it back first)."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
import trio

from kproxy.session.parked import express
from kproxy.session.parked.express import Turns


async def test_a_busy_trio_and_a_busy_lane_alternate_and_never_overlap() -> None:
    turns = Turns()
    turns.trio_takes()
    trio.lowlevel.add_instrument(turns)
    inside = threading.Event()  # the lane is in its turn
    overlaps = passes = 0
    started, done = threading.Event(), threading.Event()
    passes_at_turn: list[int] = []  # trio's pass count as each lane turn began

    def lane() -> None:
        for _ in range(200):  # busy: asks again as soon as it gives its turn up
            with turns:
                passes_at_turn.append(passes)
                started.set()
                inside.set()
                time.sleep(0.0002)  # work in the turn, with the interpreter released
                inside.clear()
        done.set()

    thread = threading.Thread(target=lane, daemon=True)
    thread.start()
    try:
        with trio.fail_after(60):
            while not done.is_set():  # busy: a pass, then straight to the next
                overlaps += inside.is_set()
                passes += started.is_set()
                await trio.sleep(0)
    finally:
        trio.lowlevel.remove_instrument(turns)
        turns.trio_gives()
        thread.join(10)
    assert overlaps == 0 and not thread.is_alive()
    assert passes >= 10  # trio ran between the lane's turns, not only after the last
    # Nor did a busy trio keep the lane waiting: between most of the lane's turns trio
    # took one pass or so (a plain lock, taken back first by whoever gave it up, let
    # trio take about a thousand).
    between = sorted(b - a for a, b in itertools.pairwise(passes_at_turn))
    assert between[len(between) // 2] <= 50, between


async def test_a_call_from_the_lane_runs_in_trio_and_a_failure_stays_in_the_log(
        caplog: pytest.LogCaptureFixture) -> None:
    """``call_in_trio``: from trio's thread at once; from the lane's, soon, by trio's
    run loop, where what it raises is logged instead of ending the run."""
    ran: list[float] = []  # trio's clock as each call saw it: there is none outside trio
    express.call_in_trio(lambda: ran.append(trio.current_time()))
    assert len(ran) == 1
    token = trio.lowlevel.current_trio_token()

    def fail() -> None:
        raise ValueError("a listener's fault")

    def lane() -> None:
        express._in_lane.token = token  # as the lane's thread holds it
        express.call_in_trio(fail)
        express.call_in_trio(lambda: ran.append(trio.current_time()))

    thread = threading.Thread(target=lane, daemon=True)
    thread.start()
    with trio.fail_after(10):
        while len(ran) < 2:
            await trio.sleep(0.01)
    thread.join()
    assert any("express lane left to trio" in r.message and r.exc_info
               and isinstance(r.exc_info[1], ValueError) for r in caplog.records)
