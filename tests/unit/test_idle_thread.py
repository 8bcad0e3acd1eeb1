"""The idle-class thread that telemetry decompression runs on."""

from __future__ import annotations

import os
import sys
import threading

import pytest
import trio

from kproxy.telemetry.idle_thread import IdleThread


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
