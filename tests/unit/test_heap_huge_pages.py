"""The start-up heap on huge pages (``kproxy.commands.heap``), in this process.

Which stretches are asked is checked on a written ``/proc/self/maps``; what the kernel
does with them on real memory of this process: a mapping filled at start-up is
collapsed, one mostly untouched is left alone (collapsing it would make the process
grow by the pages nobody used).
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Iterator

import pytest

from kproxy.commands import heap
from kproxy.commands.heap import HUGE, PAGE, collapse_heap

from ..support import kernel_collapses

MAPS = """\
5586a0000000-5586a0a00000 rw-p 00000000 00:00 0                          [heap]
7f0000100000-7f0000700000 rw-p 00000000 00:00 0
7f0000700000-7f0000900000 r--p 00000000 00:00 0
7f0000a00000-7f0000c00000 rw-p 00001000 08:01 42                         /usr/lib/libpython3.11.so
7f0000c00000-7f0000d00000 rw-p 00000000 00:00 0
7ffd00000000-7ffd00800000 rw-p 00000000 00:00 0                          [stack]
"""


def test_only_aligned_stretches_of_private_writable_anonymous_memory_are_asked() -> None:
    got = heap._anonymous_stretches(MAPS)
    brk = [0x5586A0000000 + i * HUGE for i in range(5)]  # 10 MB, aligned at both ends
    anon = [0x7F0000200000, 0x7F0000400000]  # 6 MB from 1 MB in: two whole stretches
    # Not asked: read-only, file-backed, the stack, and a 1 MB mapping (no whole stretch).
    assert got == brk + anon


@pytest.fixture
def private_memory() -> Iterator[mmap.mmap]:
    """Three stretches' worth of private anonymous memory (so two whole aligned ones)."""
    buf = mmap.mmap(-1, 3 * HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        yield buf
    finally:
        buf.close()


def address_of(buf: mmap.mmap) -> int:
    ref = ctypes.c_char.from_buffer(buf)
    try:
        return ctypes.addressof(ref)
    finally:
        del ref  # an exported buffer would keep the mapping from closing


def whole_stretches(buf: mmap.mmap) -> list[int]:
    """The 2 MB-aligned stretches wholly inside ``buf``."""
    lo = address_of(buf)
    first = (lo + HUGE - 1) & ~(HUGE - 1)
    return list(range(first, lo + len(buf) - HUGE + 1, HUGE))


def huge_kb_of(buf: mmap.mmap) -> int:
    """AnonHugePages of the mapping holding ``buf`` (with any neighbour the kernel
    merged it with), from /proc/self/smaps."""
    address = address_of(buf)
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                inside = lo <= address < hi
            elif inside and fields[0] == "AnonHugePages:":
                return int(fields[1])
    raise AssertionError("the mapping is not in /proc/self/smaps")


def test_filled_memory_is_collapsed_or_the_refusal_reported(
        private_memory: mmap.mmap) -> None:
    for at in range(0, len(private_memory), PAGE):
        private_memory[at] = 1
    mine = whole_stretches(private_memory)
    assert len(mine) >= 2  # 3 when the kernel aligned the mapping
    assert set(mine) <= set(heap.eligible_stretches())
    done = collapse_heap()
    assert done.asked >= 2
    if kernel_collapses():
        assert done.collapsed >= 2 and done.collapsed_bytes == done.collapsed * HUGE
        assert huge_kb_of(private_memory) >= 2 * HUGE // 1024
    else:  # an older kernel: refused, and said why
        assert done.collapsed == 0 and done.refused_errno != 0
    assert all(private_memory[at] == 1 for at in range(0, len(private_memory), PAGE))


def test_mostly_untouched_memory_is_not_asked(private_memory: mmap.mmap) -> None:
    for at in range(0, len(private_memory), 4 * PAGE):  # a quarter of its pages
        private_memory[at] = 1
    mine = whole_stretches(private_memory)
    assert len(mine) >= 2  # 3 when the kernel aligned the mapping
    assert not set(mine) & set(heap.eligible_stretches())
