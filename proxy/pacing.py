"""A share of the processor for background work, so the relay keeps the rest.

Telemetry pushes are decoded in steps (``codecs.otlp_decode``); between two steps
the event loop serves every other connection. That alone keeps one push from
stalling the relay, but a client that pushes back to back could still keep the
loop (and a core, for decompression) busy most of the time. ``Pacer`` makes the
work take at most ``share`` of the time: after a step that took ``t`` seconds it
sleeps ``t * (1 - share) / share``. Used behind one proxy-wide limiter, it bounds
what all telemetry decoding together can take, whatever the number of clients.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
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
        started = time.perf_counter()
        try:
            for _ in steps:
                now = time.perf_counter()
                await self._rest(now - started)
                started = time.perf_counter()
        finally:  # the last step, or the one that raised, is paid for too
            await self._rest(time.perf_counter() - started)

    async def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Await ``fn()`` (e.g. work on a thread), then rest in proportion to its time."""
        started = time.perf_counter()
        try:
            return await fn()
        finally:
            await self._rest(time.perf_counter() - started)
