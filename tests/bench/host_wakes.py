"""What waking up costs a process on this machine, to read the CPU rows by.

A relay's CPU per GB counts its wake-ups: each time a socket has bytes, the process runs
from its wait to its next. Where touching memory after a pause is dear (some virtual
machines: the test machine's kernel command line names a nested, page-table-based
hypervisor), a wake-up costs more the longer the pause and the more code and data it
touches, and a relay in an interpreter touches far more than haproxy's loop in C. The
probe: a process that does nothing but sleep and wake, as plain Python (``time.sleep``)
and as trio (``trio.sleep``, kproxy's loop), at a short pause and a long one; its CPU
time over a window, per wake-up. And the mechanism itself (``page_touch``): what reading
one byte of each page of a buffer costs, again at once and again after a pause.
"""

from __future__ import annotations

import mmap
import statistics
import subprocess
import sys
import time

from bench_measure import process_cpu_seconds

PAUSES_S = (0.01, 1.0)
# Each runner loops on its sleep; the pause is its first argument.
RUNNERS = {
    "python": "import sys, time\nwhile True:\n    time.sleep(float(sys.argv[1]))\n",
    "trio": ("import sys, trio\nasync def main():\n    while True:\n"
             "        await trio.sleep(float(sys.argv[1]))\ntrio.run(main)\n"),
}
SETTLE_S = 1.0  # imported and looping before the window opens


def measure(window_s: float = 5.0, least_wakes: int = 8) -> dict[str, dict[str, float]]:
    """Per runner and pause (seconds, as text): CPU microseconds per wake-up over a
    window of ``window_s``, or of ``least_wakes`` pauses if that is longer."""
    out: dict[str, dict[str, float]] = {}
    for runner, code in RUNNERS.items():
        for pause in PAUSES_S:
            proc = subprocess.Popen([sys.executable, "-c", code, str(pause)])
            try:
                time.sleep(SETTLE_S)
                cpu0, t0 = process_cpu_seconds(proc.pid), time.monotonic()
                time.sleep(max(window_s, least_wakes * pause))
                cpu1, t1 = process_cpu_seconds(proc.pid), time.monotonic()
            finally:
                proc.kill()
                proc.wait()
            wakes = (t1 - t0) / pause
            out.setdefault(runner, {})[str(pause)] = (cpu1 - cpu0) / wakes * 1e6
    return out


TOUCH_PAGES = 4096  # 16 MB of 4 KB pages, about a third of an idle kproxy's RSS
TOUCH_PAUSES_S = (0.0, 1.0)


def page_touch(repeats: int = 3) -> dict[str, float]:
    """Per pause (seconds, as text): CPU nanoseconds per page to read one byte of each
    of ``TOUCH_PAGES`` pages that were all touched just before the pause; the median
    of ``repeats``."""
    page = mmap.PAGESIZE
    buf = mmap.mmap(-1, TOUCH_PAGES * page)
    try:
        for at in range(0, len(buf), page):
            buf[at] = 1

        def touch() -> float:
            t0, total = time.thread_time(), 0
            for at in range(0, len(buf), page):
                total += buf[at]
            return (time.thread_time() - t0) / TOUCH_PAGES * 1e9

        out: dict[str, float] = {}
        for pause in TOUCH_PAUSES_S:
            runs = []
            for _ in range(repeats):
                touch()
                time.sleep(pause)
                runs.append(touch())
            out[str(pause)] = statistics.median(runs)
        return out
    finally:
        buf.close()


def describe_pages(pages: dict[str, float] | None) -> str:
    """One sentence of ``page_touch``'s figures, or "" when there are none."""
    if not pages:
        return ""
    each = ", ".join(f"{ns:,.0f} ns {'at once' if not float(p) else 'after ' + _pause(float(p))}"
                     for p, ns in pages.items())
    return ("What reading a page costs again (one byte of each of "
            f"{TOUCH_PAGES:,} pages touched just before; CPU per page): {each}.")


def describe(wakes: dict[str, dict[str, float]] | None) -> str:
    """One sentence of the probe's figures, or "" when there are none."""
    if not wakes:
        return ""
    parts = []
    for runner, by_pause in wakes.items():
        each = ", ".join(f"{us:,.0f} us at {_pause(float(p))}" for p, us in by_pause.items())
        parts.append(f"{runner} {each}")
    return ("What a wake-up costs on this machine (a process that only sleeps and wakes, "
            "its CPU per wake-up; `tests/bench/host_wakes.py`): " + "; ".join(parts) + ".")


def _pause(seconds: float) -> str:
    return f"{seconds:g} s" if seconds >= 1 else f"{seconds * 1000:g} ms"
