"""The heap as start-up leaves it: frozen, and on 2 MB pages.

``settle_heap`` runs once a worker has imported and configured everything, before its
event loop starts. It freezes what start-up built (the garbage collector walks it only
in ``commands.collector``'s whole-heap walks) and puts the memory holding it on huge
pages where the kernel can.

Huge pages: fewer translations for the memory every request reads.

What a request's path reads again and again (code objects, module and class
dictionaries, the objects frozen at start-up) was allocated while the proxy imported and
configured itself, scattered over the interpreter's heap in 4 KB pages, each needing a
translation of its own. On a virtual machine a translation missing from the TLB costs a
walk of two page tables, and some hosts charge far more for a page left untouched a
while: on the bench machine, reading one byte of a 4 KB page again after 1 s cost
0.5-9 us against 0.04-0.1 us at once, and under 0.2 us when the memory was on 2 MB pages
(docs/benchmarks.md, "The machine charges for memory left untouched a while").

So once start-up is done the proxy asks the kernel (``MADV_COLLAPSE``, Linux 6.1 and
later) to rebuild each 2 MB-aligned stretch of its private anonymous memory that is at
least half resident as one huge page. Best effort: a kernel that refuses (too old, no
transparent huge pages, no free 2 MB block) leaves the proxy as it was, and it runs as
before. Bounded: a stretch less than half used is left alone, so the process grows by
less than 1 MB per stretch collapsed, and only at start-up; memory allocated later
stays on ordinary pages (the mappings are not marked ``MADV_HUGEPAGE``).
"""

from __future__ import annotations

import ctypes
import errno
import gc
import logging
import os
import sys
from dataclasses import dataclass
from typing import BinaryIO

log = logging.getLogger("kproxy")

HUGE = 2 << 20  # x86-64 and arm64 (4 KB base pages): one PMD entry
PAGE = 4096
MADV_COLLAPSE = 25  # linux/mman.h, since 6.1
_PRESENT = 1 << 63  # /proc/self/pagemap: the page is in memory
_SWAPPED = 1 << 62
LEAST_RESIDENT = HUGE // PAGE // 2  # pages of a stretch that must be in memory


@dataclass
class Collapse:
    """What ``collapse_heap`` did: 2 MB stretches asked, collapsed, and the first
    refusal's errno (0: none)."""

    asked: int = 0
    collapsed: int = 0
    refused_errno: int = 0

    @property
    def collapsed_bytes(self) -> int:
        return self.collapsed * HUGE


def collapse_heap() -> Collapse:
    """Collapse this process's mostly resident anonymous stretches into huge pages."""
    done = Collapse()
    if not sys.platform.startswith("linux") or os.sysconf("SC_PAGE_SIZE") != PAGE:
        return done
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        madvise.restype = ctypes.c_int
        stretches = eligible_stretches()
    except (OSError, AttributeError):  # no pagemap (a locked-down /proc), no libc
        return done
    for start in stretches:
        done.asked += 1
        if madvise(start, HUGE, MADV_COLLAPSE) == 0:
            done.collapsed += 1
            continue
        # EINVAL: a kernel before 6.1, or a mapping that refuses huge pages (a thread's
        # stack); the others are still asked (a few dozen calls at most, once).
        done.refused_errno = done.refused_errno or ctypes.get_errno()
    return done


def eligible_stretches() -> list[int]:
    """Start addresses of this process's anonymous stretches at least half resident."""
    with open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb") as pagemap:
        return [s for s in _anonymous_stretches(maps.read())
                if _resident_pages(pagemap, s) >= LEAST_RESIDENT]


def _anonymous_stretches(maps: str) -> list[int]:
    """Start addresses of the 2 MB-aligned stretches inside private, writable,
    anonymous mappings (the brk heap and the allocators' ``mmap`` arenas)."""
    out: list[int] = []
    for line in maps.splitlines():
        fields = line.split()
        name = fields[5] if len(fields) > 5 else ""
        if fields[1] != "rw-p" or name not in ("", "[heap]"):
            continue
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        start = (lo + HUGE - 1) & ~(HUGE - 1)
        out.extend(range(start, hi - HUGE + 1, HUGE))
    return out


def _resident_pages(pagemap: BinaryIO, start: int) -> int:
    """Pages of the stretch at ``start`` in memory (or swapped out), from pagemap."""
    pagemap.seek(start // PAGE * 8)
    raw = pagemap.read(HUGE // PAGE * 8)
    entries = memoryview(raw).cast("Q")
    return sum(1 for e in entries if e & (_PRESENT | _SWAPPED))


def settle_heap(huge_pages: bool) -> None:
    """Move everything built at start-up out of the garbage collector's reach, and
    (``huge_pages``) onto 2 MB pages.

    The modules, schemas and registries never die, yet a full collection walks all of
    them (about 8 ms, a latency spike for every request in flight). Frozen, a full
    collection only visits what the running proxy allocated since (and, with
    ``commands.collector`` on, the whole heap once per ``gc_sweep_interval``).
    """
    gc.collect()
    gc.freeze()
    if huge_pages:
        settle_on_huge_pages()


def settle_on_huge_pages() -> None:
    """``collapse_heap``, and a line in the log saying what it did."""
    done = collapse_heap()
    if done.collapsed:
        log.info("start-up heap on huge pages", extra={"fields": {
            "collapsed_mb": done.collapsed_bytes >> 20, "stretches_asked": done.asked,
            "refused": done.asked - done.collapsed}})
    elif done.asked:
        log.info("start-up heap left on ordinary pages: the kernel refused huge pages",
                 extra={"fields": {"errno": errno.errorcode.get(
                     done.refused_errno, str(done.refused_errno))}})
