"""Free-page reporting held back while the bench runs, so that a broker's memory costs
every path the same.

On a virtual machine with a virtio-balloon that reports free pages (Firecracker's, as
on the bench machine), memory a process frees goes back to the host, and whoever next
touches that much fresh memory pays the host's page faults as its own CPU time. On
this machine a GiB touched again at once costs 0.41 s of CPU, and 1.0-1.5 s when the
freed memory was reported first. A bench round restarts its brokers (freeing what the
last round stored), then sends 256 MB through each path in turn: the paths that ran
before the report went out found their pages cheap, the one after it found them dear,
and its broker took up to twice the CPU for the same bytes (0.73-1.12 s against
0.50-0.70), so that path's throughput read up to a third lower. Which relay that was came down
to the round's order: it was the noise that made the throughput verdicts flip.

The guest kernel here lets a page wait before it is reported
(``/sys/module/page_reporting/parameters/min_free_ms``, 0 by default, at most 300 s).
``held_back`` sets that wait to its longest for the run, so that a repetition (the main
section's take about two minutes) reuses the pages the last one freed, and sets it back
after. It first touches and frees ``WARM_BYTES``, more than a round's brokers hold at
once, so that the first repetition, too, finds pages the host has backed. Where the
knob is missing or cannot be written (another machine, not root), nothing changes and
the report says so.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

KNOB = Path("/sys/module/page_reporting/parameters/min_free_ms")
HOLD_MS = 300_000  # the longest wait the kernel accepts for the knob
# More than a round's brokers hold at once (four of them, up to about 700 MB each).
WARM_BYTES = 4 << 30
_CHUNK = 64 << 20


def warm(size: int, chunk: int = _CHUNK) -> int:
    """Touch ``size`` bytes of fresh memory once, ``chunk`` at a time, then free them;
    how many were written."""
    zeros = bytes(min(size, chunk))
    written = 0
    with mmap.mmap(-1, size) as memory:
        for offset in range(0, size, len(zeros)):
            end = min(offset + len(zeros), size)
            memory[offset:end] = zeros[:end - offset]
            written += end - offset
    return written


@contextlib.contextmanager
def held_back(knob: Path = KNOB, hold_ms: int = HOLD_MS,
              warm_bytes: int = WARM_BYTES) -> Iterator[str]:
    """Hold back free-page reporting for the block; yields what was done, in words, for
    the report's header."""
    try:
        before = knob.read_text().strip()
    except OSError:
        yield "no free-page reporting to hold back on this machine"
        return
    try:
        knob.write_text(str(hold_ms))
    except OSError as exc:
        yield (f"free-page reporting left as it was (min_free_ms {before}: "
               f"{exc.strerror or type(exc).__name__})")
        return
    # Never more than a quarter of the memory free now (a smaller machine).
    warm_bytes = min(warm_bytes, os.sysconf("SC_AVPHYS_PAGES") * mmap.PAGESIZE // 4)
    try:
        warm(warm_bytes)
        yield (f"free-page reporting held back {hold_ms // 1000} s for the run "
               f"(min_free_ms {before} -> {hold_ms}, set back after), "
               f"{warm_bytes >> 20:,} MiB touched first; see "
               "tests/bench/page_reporting.py")
    finally:
        with contextlib.suppress(OSError):
            knob.write_text(before)
