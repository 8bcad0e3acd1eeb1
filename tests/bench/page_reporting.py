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
0.50-0.70), so that path's throughput read up to a third lower. Which relay that was
came down to the round's order: it was the noise that made the throughput verdicts
flip.

The guest kernel here has two knobs for it (``/sys/module/page_reporting/parameters``):
how long a freed page waits before it is reported (``min_free_ms``, 0 by default, at
most 300 s) and how much freed memory may wait at once (``max_waiting_mib``, 1,024 by
default; past it, the excess is reported at once: 3 GiB freed and touched again cost
2.4 s of CPU with 1,024 and 1.2-1.3 s with 8,192). A main-section repetition frees
about 3 GB when it restarts its brokers, and takes about two minutes. ``held_back``
sets both knobs for the run (``HOLD``) and sets them back after. It first touches and
frees ``WARM_BYTES``, more than a round's brokers hold at once, so that the first
repetition, too, finds pages the host has backed. Where the knobs are missing or
cannot be written (another machine, not root), nothing changes and the report says so.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

KNOBS = Path("/sys/module/page_reporting/parameters")
# Knob -> value for the run: the longest wait the kernel accepts, and more waiting
# memory than a run frees at once.
HOLD = {"min_free_ms": 300_000, "max_waiting_mib": 16_384}
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
def held_back(knobs: Path = KNOBS, hold: Mapping[str, int] = HOLD,
              warm_bytes: int = WARM_BYTES) -> Iterator[str]:
    """Hold back free-page reporting for the block; yields what was done, in words, for
    the report's header."""
    before: dict[str, str] = {}
    try:
        for name in hold:
            before[name] = (knobs / name).read_text().strip()
    except OSError:
        yield "no free-page reporting to hold back on this machine"
        return
    set_back = dict(before)
    try:
        for name, value in hold.items():
            try:
                (knobs / name).write_text(str(value))
            except OSError as exc:
                set_back.pop(name)
                yield (f"free-page reporting left as it was ({name} {before[name]}: "
                       f"{exc.strerror or type(exc).__name__})")
                return
        # Never more than a quarter of the memory free now (a smaller machine).
        warm_bytes = min(warm_bytes, os.sysconf("SC_AVPHYS_PAGES") * mmap.PAGESIZE // 4)
        warm(warm_bytes)
        changed = ", ".join(f"{name} {before[name]} -> {value}"
                            for name, value in hold.items())
        yield (f"free-page reporting held back for the run ({changed}, set back after), "
               f"{warm_bytes >> 20:,} MiB touched first; see tests/bench/page_reporting.py")
    finally:
        for name, value_before in set_back.items():
            with contextlib.suppress(OSError):
                (knobs / name).write_text(value_before)
