"""A share of the processor for background work, so the relay keeps the rest.

Telemetry pushes are decoded in steps (``codecs.otlp.decode``); between two steps
the event loop serves every other connection. That alone keeps one push from
stalling the relay, but a client that pushes back to back could still keep the
loop (and a core, for decompression) busy most of the time. ``Pacer`` holds the
work to ``share`` of the time, with a small burst allowance so that occasional
pushes are not held back. Used behind one proxy-wide limiter, it bounds what all
telemetry decoding together can take, whatever the number of clients.

However full the bucket, the worker really sleeps (``LEAST_REST``) once it has
worked ``REST_EVERY`` since it last did, a few steps. A step on the loop holds the
interpreter, and the express lane's thread relays its connections' requests only
while it has the interpreter. A checkpoint between steps never blocks the loop's
thread, so the lane's thread waited for the interpreter's switch interval (5 ms)
while a push was decoded within its burst; pushes 45 ms apart put a producer's p99
on the lane at 4.5 to 5 ms where it read 0.4 ms without them. A sleep after every
step did as well for the lane, but at about a millisecond a step (the loop's wait
rounds up to its millisecond) it cut what a worker decodes to a third of its share.

Work is measured in processor time of the thread that did it (``time.thread_time``),
not wall time: on a busy machine a step that was preempted has not cost more, and
resting in proportion to the wait would slow telemetry down for nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kproxy.telemetry.idle_thread import DECOMPRESSION, IdleTime

T = TypeVar("T")
DEFAULT_SHARE = 0.25  # of one core: what telemetry decoding may use at most
DEFAULT_BURST = 0.05  # seconds of work allowed at once after a quiet period
# The least sleep, so that the loop's thread blocks and the lane's thread can take the
# interpreter (the loop's wait rounds it up to its millisecond); taken at least once
# per REST_EVERY of processor time.
LEAST_REST = 0.0002
REST_EVERY = 0.0005


class Pacer:
    """A token bucket of processor time: ``share`` seconds per second, ``burst`` at most.

    Work spends tokens; while the bucket is below zero the worker sleeps until it
    has refilled. Occasional work rests only ``LEAST_REST`` every ``REST_EVERY`` of
    work; sustained work (pushes back to back) is held to ``share`` of the time.
    """

    def __init__(self, share: float = DEFAULT_SHARE, burst: float = DEFAULT_BURST) -> None:
        if not 0 < share <= 1 or burst < 0:
            raise ValueError(f"share must be in (0, 1] and burst >= 0, got {share}, {burst}")
        self.share = share
        self.burst = burst
        self.tokens = burst
        self._updated: float | None = None
        # trio's clock, where work is charged outside trio (the express lane's thread):
        # set by the proxy at start (``trio.lowlevel.current_clock``); else trio's time.
        self.clock: Callable[[], float] | None = None
        self.busy_seconds = 0.0  # total processor time of paced work
        self._unslept = 0.0  # processor time worked since the last sleep
        self.longest_step = 0.0  # processor time of the longest step run on the loop

    def _refill(self) -> None:
        if self.clock is not None:
            now = self.clock()
        else:
            try:
                now = trio.current_time()
            except RuntimeError:  # outside trio with no clock given: nothing to refill by
                return
        if self._updated is not None:
            self.tokens = min(self.burst, self.tokens + (now - self._updated) * self.share)
        self._updated = now

    def may_spend(self) -> bool:
        """Whether work may run at once (the bucket is not empty). Called where a push
        is answered, the express lane's thread included: it never waits or calls trio
        when ``clock`` is set."""
        self._refill()
        return self.tokens > 0

    def spent(self, took: float) -> None:
        """Work that ran at once (``may_spend``) takes its processor time from the bucket
        that paced work rests by."""
        self.longest_step = max(self.longest_step, took)
        self._charge(took)

    def _charge(self, took: float) -> None:
        self.busy_seconds += took
        self._refill()
        self.tokens -= took

    async def rest(self, took: float) -> None:
        """Charge ``took`` seconds of work (done anywhere) and rest as the bucket says."""
        self._charge(took)
        self._unslept += took
        pause = -self.tokens / self.share
        if pause >= LEAST_REST or self._unslept >= REST_EVERY:
            self._unslept = 0.0
            await trio.sleep(max(pause, LEAST_REST))
        else:
            await trio.lowlevel.checkpoint()

    async def steps(self, steps: Iterator[None]) -> None:
        """Run a stepped computation to its end, resting after each step."""
        started = time.thread_time()
        try:
            for _ in steps:
                await self._step_done(time.thread_time() - started)
                started = time.thread_time()
        finally:  # the last step, or the one that raised, is paid for too
            await self._step_done(time.thread_time() - started)

    async def _step_done(self, took: float) -> None:
        self.longest_step = max(self.longest_step, took)
        await self.rest(took)

    async def in_thread(self, fn: Callable[[], T], idle_time: IdleTime | None = None) -> T:
        """``fn()`` on the idle-class thread (``idle_thread``; at ordinary priority when
        ``idle_time`` says no core has had time to spare), then a rest in proportion to
        its processor time."""
        spent = 0.0

        def timed() -> T:
            nonlocal spent
            started = time.thread_time()
            try:
                return fn()
            finally:
                spent = time.thread_time() - started

        try:
            return await DECOMPRESSION.run(timed, idle_time)
        finally:
            await self.rest(spent)


class PacerCollector:
    """What paced work took, for /metrics: total processor time, and the longest step
    that held the event loop (what a relay on the same loop waited for at most)."""

    def __init__(self, pacer: Pacer, what: str) -> None:
        self.pacer = pacer
        self.what = what

    def collect(self) -> Iterator[Metric]:
        name = f"kproxy_{self.what}"
        yield CounterMetricFamily(f"{name}_cpu_seconds", f"Processor time of paced "
                                  f"{self.what.replace('_', ' ')} work",
                                  value=self.pacer.busy_seconds)
        yield GaugeMetricFamily(f"{name}_longest_step_cpu_seconds", "Processor time of the "
                                "longest step that held the event loop, since start",
                                value=self.pacer.longest_step)
