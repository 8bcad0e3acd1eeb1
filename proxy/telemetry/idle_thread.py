"""A thread the kernel runs only when a core has nothing else to do, for decompression.

A telemetry push is decompressed off the event loop (the codecs release the interpreter
lock), but the thread doing it still takes a core: up to 16 MiB expanded, several
milliseconds, while the relay's threads, the broker and the clients wait for that core
on a small machine. On Linux this thread asks for the kernel's idle class
(``SCHED_IDLE``): any ordinary thread that wakes takes the core from it at once. With
bombs pushed back to back, a producer's p99 on another connection read about a quarter
lower than with trio's worker threads (docs/benchmarks.md, "Hostile pushes").

The thread is its own, not one of trio's cached workers: a thread cannot leave the
idle class again without the privilege to raise its priority, and trio's workers also
resolve names and close files, which must not wait behind everything else. One thread
serves the process: decompression runs one push at a time proxy-wide anyway
(``telemetry.DECODE_CONCURRENCY``). Where the idle class is refused (or not Linux) the
thread runs at ordinary priority, as trio's would.

The idle class is a preference, never a wait without end. On a machine whose cores are
all busy (a sidecar beside an application that uses every core it has), idle-class
work gets a sliver of a core: a 1.5 KB bomb's check took over 30 s and 8 MiB of
decompression 13.6 s beside one busy process on the same core, and the push's
connection waited all that while, its later answers behind it. So such work waits
at most ``IdleTime.patience``; past that it runs at ordinary priority (still paced:
``pacing.Pacer``), and for a while after (``IdleTime``) no work is given to the idle
class at all.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar, cast

import trio
from prometheus_client.core import CounterMetricFamily, Metric

T = TypeVar("T")
log = logging.getLogger("kproxy.telemetry")
# Seconds idle-class work may wait before it runs at ordinary priority instead: a
# helper's start (about 0.1 s, at ordinary priority) and a bomb's check (about 10 ms)
# fit many times over on a machine with a core to spare.
PATIENCE = 1.0
FIRST_BACKOFF = 10.0  # seconds no work goes to the idle class after it last waited
LONGEST_BACKOFF = 300.0  # while it keeps waiting, the backoff doubles up to this


class IdleTime:
    """Whether the machine has lately had idle time for the kernel's idle class.

    Work that waited past ``patience`` there calls ``starved``: for the next backoff no
    work is given to the idle class (``available`` is False), and each time that
    happens again the backoff doubles, up to ``longest``; work done there in time
    (``served``) sets it back. The telemetry service keeps one for its vetting helper
    and its decompressions, so that each learns it from the other.
    """

    def __init__(self, patience: float = PATIENCE, first: float = FIRST_BACKOFF,
                 longest: float = LONGEST_BACKOFF) -> None:
        self.patience = patience
        self._first, self._longest = first, longest
        self._backoff = first
        self._until = -math.inf
        self.starvations = 0

    def available(self, now: float) -> bool:
        return now >= self._until

    def starved(self, now: float, what: str) -> None:
        """``what`` waited past the patience at ``now`` (trio's clock)."""
        self.starvations += 1
        self._until = now + self._backoff
        log.warning("telemetry work waited past its patience in the kernel's idle class "
                    "(no core had time to spare); it runs at ordinary priority, paced, "
                    "and so does such work for the backoff",
                    extra={"fields": {"what": what, "patience_s": self.patience,
                                      "backoff_s": self._backoff}})
        self._backoff = min(self._backoff * 2, self._longest)

    def served(self) -> None:
        self._backoff = self._first


class IdleTimeCollector:
    """/metrics: how often idle-class work waited past its patience."""

    def __init__(self, idle_time: IdleTime) -> None:
        self.idle_time = idle_time

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "kproxy_telemetry_idle_class_starved", "Times telemetry work left to the "
            "kernel's idle class (the vetting helper, decompression) waited past its "
            "patience because no core had time to spare; it then ran at ordinary "
            "priority, paced", self.idle_time.starvations)


class _Job(Generic[T]):
    """One call on the thread, and how its caller learns that it ended. A job not yet
    begun can be withdrawn (``withdraw``): the thread then skips it."""

    __slots__ = ("begun", "done", "error", "fn", "lock", "token", "value")

    def __init__(self, fn: Callable[[], T], token: trio.lowlevel.TrioToken) -> None:
        self.fn: Callable[[], T] | None = fn
        self.token = token
        self.done = trio.Event()
        self.value: T | None = None
        self.error: BaseException | None = None
        self.begun = False
        self.lock = threading.Lock()

    def withdraw(self) -> bool:
        """Whether the job was withdrawn before it began (its call then never runs)."""
        with self.lock:
            if self.begun:
                return False
            self.fn = None  # what it holds is freed now, not when the thread reaches it
            return True

    def run(self) -> None:
        with self.lock:
            fn, self.begun = self.fn, True
        if fn is None:
            return
        try:
            self.value = fn()
        except BaseException as exc:  # handed to the caller, on its own thread
            self.error = exc
        with contextlib.suppress(trio.RunFinishedError):  # the caller's run has ended
            self.token.run_sync_soon(self.done.set)


class IdleThread:
    """Runs one call at a time on a thread of its own, in the kernel's idle class."""

    def __init__(self, name: str = "kproxy-idle", what: str = "telemetry decompression"
                 ) -> None:
        self.name, self.what = name, what
        self.idle_class: bool | None = None  # None until the thread has started
        self._jobs: queue.SimpleQueue[_Job[Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        # A job given up on while it ran, and still running: nothing more goes behind it.
        self._abandoned: _Job[Any] | None = None

    async def run(self, fn: Callable[[], T], idle_time: IdleTime | None = None) -> T:
        """``fn()`` on the thread, or at ordinary priority on one of trio's when the idle
        class has had no time to spare (``idle_time``, else ``IDLE_TIME``). A call that
        waits past the patience is withdrawn, or if it has begun left to finish with
        its result dropped, and made again at ordinary priority. A cancelled caller
        stops waiting; the call still runs to its end there, and its result is dropped."""
        idle_time = idle_time or IDLE_TIME
        if not idle_time.available(trio.current_time()) or (
                self._abandoned is not None and not self._abandoned.done.is_set()):
            return await trio.to_thread.run_sync(fn)
        job = _Job(fn, trio.lowlevel.current_trio_token())
        self._start()
        self._jobs.put(job)
        with trio.move_on_after(idle_time.patience):
            await job.done.wait()
        if not job.done.is_set():
            if not job.withdraw():
                self._abandoned = job
            idle_time.starved(trio.current_time(), self.what)
            return await trio.to_thread.run_sync(fn)
        idle_time.served()
        if job.error is not None:
            raise job.error
        return cast(T, job.value)  # set when no error was

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name,
                                                daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        self.idle_class = enter_idle_class(self.what)
        while True:
            self._jobs.get().run()


def enter_idle_class(what: str) -> bool:
    """Put the calling thread in the kernel's idle class; whether that was taken."""
    idle = getattr(os, "SCHED_IDLE", None)
    if idle is None:
        return False
    try:
        os.sched_setscheduler(0, idle, os.sched_param(0))  # 0: the calling thread
    except OSError as exc:  # e.g. a seccomp profile that forbids it
        log.info("%s runs at ordinary priority", what,
                 extra={"fields": {"reason": exc.strerror or str(exc)}})
        return False
    return True


IDLE_TIME = IdleTime()
DECOMPRESSION = IdleThread("kproxy-decompress")
