"""The idle-class thread that telemetry decompression runs on."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import trio

from kproxy.telemetry.idle_thread import IdleThread, IdleTime, _Job

from ..support import busy_core


async def test_a_call_runs_on_the_thread_and_returns_or_raises() -> None:
    worker = IdleThread("test-idle")
    assert await worker.run(lambda: threading.current_thread().name) == "test-idle"

    def fails() -> None:
        raise ValueError("bad payload")

    with pytest.raises(ValueError, match="bad payload"):
        await worker.run(fails)
    assert await worker.run(lambda: 7) == 7  # the thread outlives a call that raised


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE is Linux's")
async def test_on_linux_the_thread_is_in_the_kernels_idle_class() -> None:
    worker = IdleThread("test-idle-class")
    policy = await worker.run(lambda: os.sched_getscheduler(0))
    assert worker.idle_class is True
    assert policy == os.SCHED_IDLE
    # Only that thread: the caller's stays as it was.
    assert os.sched_getscheduler(0) != os.SCHED_IDLE


async def test_a_cancelled_caller_stops_waiting_and_the_next_call_still_runs() -> None:
    worker = IdleThread("test-idle-cancel")
    release = threading.Event()
    with trio.move_on_after(0.05) as scope:
        await worker.run(lambda: release.wait(30))
    assert scope.cancelled_caught
    release.set()  # the abandoned call ends on the thread; its result is dropped
    assert await worker.run(lambda: "next") == "next"


async def test_where_the_idle_class_is_refused_the_thread_runs_at_ordinary_priority(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def refused(*args: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refused)
    worker = IdleThread("test-idle-refused")
    with caplog.at_level("INFO", logger="kproxy.telemetry"):
        assert await worker.run(lambda: "ran") == "ran"
    assert worker.idle_class is False
    assert any(r.getMessage() == "telemetry decompression runs at ordinary priority"
               for r in caplog.records)


def test_idle_time_backs_off_doubling_to_its_longest_and_a_served_call_resets_it(
        caplog: pytest.LogCaptureFixture) -> None:
    idle = IdleTime(patience=1.0, first=10.0, longest=25.0)
    assert idle.available(0.0)
    with caplog.at_level("WARNING", logger="kproxy.telemetry"):
        idle.starved(0.0, "work")
    (record,) = caplog.records  # said once, with what waited and for how long it is left
    assert record.__dict__["fields"] == {"what": "work", "patience_s": 1.0, "backoff_s": 10.0}
    assert not idle.available(9.9) and idle.available(10.0)
    idle.starved(10.0, "work")  # 20 s now
    assert not idle.available(29.9) and idle.available(30.0)
    idle.starved(30.0, "work")  # 25 s: the longest
    assert not idle.available(54.9) and idle.available(55.0)
    idle.served()
    idle.starved(55.0, "work")
    assert idle.available(65.0) and idle.starvations == 4


def test_a_job_withdrawn_before_it_began_never_runs_and_one_begun_cannot_be() -> None:
    ran: list[int] = []
    job = _Job(lambda: ran.append(1), trio.lowlevel.TrioToken.__new__(trio.lowlevel.TrioToken))
    assert job.withdraw() and job.fn is None  # what it held is freed at once
    job.run()
    assert ran == [] and not job.done.is_set()
    begun = _Job(lambda: 7, trio.lowlevel.TrioToken.__new__(trio.lowlevel.TrioToken))
    begun.begun = True
    assert not begun.withdraw()


@contextlib.contextmanager
def pinned(cpu: int) -> Iterator[None]:
    """This thread, and the threads and processes it starts, on ``cpu`` only."""
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, saved)


def burn(seconds: float) -> str:
    """``seconds`` of this thread's processor time; the thread's name."""
    started = time.thread_time()
    while time.thread_time() - started < seconds:
        pass
    return threading.current_thread().name


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE is Linux's")
async def test_on_a_core_with_no_time_to_spare_the_call_runs_at_ordinary_priority() -> None:
    """A busy process on the thread's only core: the idle-class thread gets next to no
    time, so the call is made again at ordinary priority after the patience, and for
    the backoff after it no call waits for the idle class at all."""
    idle = IdleTime(patience=0.3)
    cpu = max(os.sched_getaffinity(0))
    with pinned(cpu):
        worker = IdleThread("test-idle-busy")  # its thread starts on ``cpu``
        # Started, in the idle class, and served while the core is still free.
        assert await worker.run(threading.current_thread, idle) is not (
            threading.current_thread())
        assert worker.idle_class is True and idle.starvations == 0
        with busy_core(cpu), trio.fail_after(60):
            where = await worker.run(lambda: burn(0.1), idle)  # 100 ms of CPU
            assert where != "test-idle-busy" and idle.starvations == 1
            # No wait this time (it would count): straight to ordinary priority.
            assert await worker.run(lambda: burn(0.001), idle) != "test-idle-busy"
            assert idle.starvations == 1
