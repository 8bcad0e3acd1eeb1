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
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

import trio

T = TypeVar("T")
log = logging.getLogger("kproxy.telemetry")


class _Job(Generic[T]):
    """One call on the thread, and how its caller learns that it ended."""

    __slots__ = ("done", "error", "fn", "token", "value")

    def __init__(self, fn: Callable[[], T], token: trio.lowlevel.TrioToken) -> None:
        self.fn, self.token = fn, token
        self.done = trio.Event()
        self.value: T | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as exc:  # handed to the caller, on its own thread
            self.error = exc
        with contextlib.suppress(trio.RunFinishedError):  # the caller's run has ended
            self.token.run_sync_soon(self.done.set)


class IdleThread:
    """Runs one call at a time on a thread of its own, in the kernel's idle class."""

    def __init__(self, name: str = "kproxy-idle") -> None:
        self.name = name
        self.idle_class: bool | None = None  # None until the thread has started
        self._jobs: queue.SimpleQueue[_Job[Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the thread. A cancelled caller stops waiting; the call still runs
        to its end there, and its result is dropped."""
        job = _Job(fn, trio.lowlevel.current_trio_token())
        self._start()
        self._jobs.put(job)
        await job.done.wait()
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
        self.idle_class = enter_idle_class("telemetry decompression")
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


DECOMPRESSION = IdleThread("kproxy-decompress")
