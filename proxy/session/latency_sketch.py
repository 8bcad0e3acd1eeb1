"""A small per-connection latency sketch, for the status page's p99.

Log-linear buckets (four per power of two of microseconds, so a quantile is known within
25%), in two rotating windows of ``WINDOW`` seconds: a quantile covers the last one to
two windows, not the connection's whole life. A window counts only the buckets that saw
a value (a dict, from the connection's first response): an idle connection that got a
few answers keeps a couple of hundred bytes, not 120 counters. Recording one value is a
few integer operations.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

BUCKETS = 120  # the last one holds everything from about 36 minutes up
WINDOW = 60.0


def bucket_of(seconds: float) -> int:
    us = int(seconds * 1_000_000)
    if us < 8:
        return max(us, 0)
    bits = us.bit_length()
    return min((bits - 2) * 4 + ((us >> (bits - 3)) & 3), BUCKETS - 1)


def upper_bound(bucket: int) -> float:
    """The largest value (seconds) bucket ``bucket`` holds; the estimate reported for it."""
    if bucket < 8:
        return (bucket + 1) / 1_000_000
    bits, sub = bucket // 4 + 2, bucket % 4
    return ((5 + sub) << (bits - 3)) / 1_000_000


class LatencySketch:
    __slots__ = ("_cur", "_prev", "_rotate_at")

    def __init__(self) -> None:
        self._cur: dict[int, int] | None = None  # bucket -> count
        self._prev: dict[int, int] | None = None
        self._rotate_at = 0.0

    def observe(self, seconds: float, now: float) -> None:
        """Record one latency; ``now`` is a monotonic time in seconds."""
        if now >= self._rotate_at:
            # One window passed: the current one becomes the previous; after two, both go.
            self._prev = self._cur if now < self._rotate_at + WINDOW else None
            self._cur = {}
            self._rotate_at = now + WINDOW
        cur = self._cur
        assert cur is not None
        us = int(seconds * 1_000_000)  # bucket_of, inlined: this runs for every response
        if us < 8:
            bucket = max(us, 0)
        else:
            bits = us.bit_length()
            bucket = min((bits - 2) * 4 + ((us >> (bits - 3)) & 3), BUCKETS - 1)
        cur[bucket] = cur.get(bucket, 0) + 1

    def counts(self, now: float) -> list[int] | None:
        """Bucket counts over the recent windows, or None if there is nothing recent."""
        if self._cur is None or now >= self._rotate_at + WINDOW:
            return None
        windows = [self._cur]
        if now < self._rotate_at and self._prev is not None:  # else only the current one
            windows.append(self._prev)
        out = [0] * BUCKETS
        for window in windows:
            for bucket, n in window.items():
                out[bucket] += n
        return out


def merge(counts: Iterable[list[int] | None]) -> list[int] | None:
    present = [c for c in counts if c is not None]
    if not present:
        return None
    return [sum(column) for column in zip(*present, strict=True)]


def quantile(counts: list[int] | None, q: float) -> float | None:
    """The value (seconds) at quantile ``q`` (upper bucket bound), None with no data."""
    if not counts:
        return None
    n = sum(counts)
    if n == 0:
        return None
    rank = max(1, math.ceil(q * n))
    seen = 0
    for i, c in enumerate(counts):
        seen += c
        if seen >= rank:
            return upper_bound(i)
    return upper_bound(BUCKETS - 1)
