"""express.Turns: trio and the express lane never run Python at once, and when both
want to, they alternate: neither a busy trio nor a busy lane starves the other (with a
plain lock, whoever just gave it up takes it back first)."""

from __future__ import annotations

import threading
import time

import trio

from kproxy.session.express import Turns


async def test_a_busy_trio_and_a_busy_lane_alternate_and_never_overlap() -> None:
    turns = Turns()
    turns.trio_takes()
    trio.lowlevel.add_instrument(turns)
    inside = threading.Event()  # the lane is in its turn
    overlaps = passes = 0
    started, done = threading.Event(), threading.Event()

    def lane() -> None:
        for _ in range(200):  # busy: asks again as soon as it gives its turn up
            with turns:
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
