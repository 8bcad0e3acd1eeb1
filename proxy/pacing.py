"""A share of the processor for background work, so the relay keeps the rest.

Telemetry pushes are decoded in steps (``codecs.otlp_decode``); between two steps
the event loop serves every other connection. That alone keeps one push from
stalling the relay, but a client that pushes back to back could still keep the
loop (and a core, for decompression) busy most of the time. ``Pacer`` makes the
work take at most ``share`` of the time: after a step that took ``t`` seconds it
sleeps ``t * (1 - share) / share``. Used behind one proxy-wide limiter, it bounds
what all telemetry decoding together can take, whatever the number of clients.

Work is measured in processor time of the thread that did it (``time.thread_time``),
not wall time: on a busy machine a step that was preempted has not cost more, and
resting in proportion to the wait would slow telemetry down for nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import trio

T = TypeVar("T")
DEFAULT_SHARE = 0.25  # of one core: what telemetry decoding may use at most
_MIN_PAUSE = 0.0002  # shorter steps only yield; a sleep that short is all overhead


class Pacer:
    def __init__(self, share: float = DEFAULT_SHARE) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self.share = share
        self.busy_seconds = 0.0  # total time spent in paced work, for tests and metrics

    async def _rest(self, took: float) -> None:
        self.busy_seconds += took
        pause = took * (1 - self.share) / self.share
        if pause >= _MIN_PAUSE:
            await trio.sleep(pause)
        else:
            await trio.lowlevel.checkpoint()

    async def steps(self, steps: Iterator[None]) -> None:
        """Run a stepped computation to its end, resting after each step."""
        started = time.thread_time()
        try:
            for _ in steps:
                now = time.thread_time()
                await self._rest(now - started)
                started = time.thread_time()
        finally:  # the last step, or the one that raised, is paid for too
            await self._rest(time.thread_time() - started)

    async def in_thread(self, fn: Callable[[], T]) -> T:
        """``fn()`` on a worker thread, then a rest in proportion to its processor time."""
        spent = 0.0

        def timed() -> T:
            nonlocal spent
            started = time.thread_time()
            try:
                return fn()
            finally:
                spent = time.thread_time() - started

        try:
            return await trio.to_thread.run_sync(timed)
        finally:
            await self._rest(spent)
