"""The values in a small push, found by position when it is shaped like one before.

A client pushes the same metrics with the same attributes again and again; what
changes from one push to the next are the numbers of its data points: their
timestamps and values. In canonical protobuf form (the only form
``codecs.otlp_small`` accepts) those numbers of a gauge or sum point are
fixed-width fields, eight bytes after a one-byte tag; everything else is the
payload's *shape*. ``shape_of`` walks a canonical payload once and notes where the
numbers of each such point lie. ``Shape.values`` then reads another payload's
point values with one unpack, if that payload has the same length and the same
bytes outside those numbers (compared by digest, see ``Shape``). A parser reads
an eight-byte field's bytes as its value whatever they are, so that payload is
canonical too, and decodes to the same metrics and points with only those
numbers changed.

A payload whose histogram or summary points carry numbers elsewhere (packed
buckets, quantiles) has no shape here; it is decoded in full every time.
"""

from __future__ import annotations

import functools
import hashlib
import struct

from kproxy.codecs.errors import CodecError
from kproxy.codecs.otlp_decode import wire_fields

_LEN, _I64 = 2, 1
_NUMBER_DATA = frozenset({5, 7})  # Metric.gauge, Metric.sum: their points are NumberDataPoints
_OTHER_DATA = frozenset({9, 11})  # histogram, summary: numbers outside fixed fields
# NumberDataPoint's fixed-width fields: the timestamps (read by nobody here) and the
# value, as_double or as_int, a oneof (so a point that has one has it at every push).
_TIMESTAMPS = frozenset({2, 3})
_VALUE_CODES = {4: "d", 6: "q"}


class Shape:
    """Where a canonical payload's numbers lie, and a digest of everything else.

    Kept per client instance, so it is small: two struct formats (clients of one
    kind share them) and a 128-bit digest of the bytes around the numbers, which two
    different shapes never share in practice.
    """

    __slots__ = ("_absent", "_around", "_digest", "_values", "size")

    def __init__(self, raw: bytes, numbers: list[int],
                 values: list[tuple[int, str] | None]) -> None:
        self.size = len(raw)
        around, pos = ["<"], 0
        for at in numbers:  # the bytes between numbers, as strings; the numbers skipped
            around.append(f"{at - pos}s8x")
            pos = at + 8
        around.append(f"{len(raw) - pos}s")
        self._around = _compiled("".join(around)).format  # shared while cached
        fmt, pos = ["<"], 0
        for value in values:  # every point's value that is set, in order
            if value is not None:
                at, code = value
                fmt.append(f"{at - pos}x{code}")
                pos = at + 8
        self._values = _compiled("".join(fmt)).format
        # Points with no value set (protobuf reads 0.0), by index.
        self._absent = tuple(i for i, value in enumerate(values) if value is None)
        self._digest = self._digest_around(raw)

    def values(self, raw: bytes) -> list[int | float] | None:
        """Each gauge and sum point's value in ``raw``, if ``raw`` has this shape."""
        if len(raw) != self.size or self._digest_around(raw) != self._digest:
            return None
        got: list[int | float] = list(_compiled(self._values).unpack_from(raw))
        for i in self._absent:
            got.insert(i, 0.0)
        return got

    def _digest_around(self, raw: bytes) -> bytes:
        around = b"".join(_compiled(self._around).unpack_from(raw))
        return hashlib.blake2b(around, digest_size=16).digest()


@functools.lru_cache(maxsize=1024)  # clients of one kind share their layout
def _compiled(fmt: str) -> struct.Struct:
    return struct.Struct(fmt)


def shape_of(raw: bytes) -> Shape | None:
    """The shape of a canonical payload; None if its numbers are not all fixed fields."""
    numbers: list[int] = []
    values: list[tuple[int, str] | None] = []
    try:
        for rm in _submessages(raw, 0, len(raw), 1):  # MetricsData.resource_metrics
            for sm in _submessages(raw, *rm, 2):  # ResourceMetrics.scope_metrics
                for m in _submessages(raw, *sm, 2):  # ScopeMetrics.metrics
                    for n, wire, a, b in wire_fields(raw, *m):
                        if wire != _LEN or not (n in _NUMBER_DATA or n in _OTHER_DATA):
                            continue
                        points = _submessages(raw, a, b, 1)  # <kind>.data_points
                        if n in _OTHER_DATA and points:
                            return None
                        values.extend(_point(raw, *p, numbers) for p in points)
    except CodecError:
        return None
    return Shape(raw, numbers, values)


def _submessages(raw: bytes, start: int, end: int, number: int) -> list[tuple[int, int]]:
    return [(a, b) for n, wire, a, b in wire_fields(raw, start, end)
            if n == number and wire == _LEN]


def _point(raw: bytes, start: int, end: int, numbers: list[int]) -> tuple[int, str] | None:
    """Notes the point's numbers; where its value lies and how it reads, if it has one."""
    value = None
    for n, wire, _, b in wire_fields(raw, start, end):
        if wire == _I64 and (n in _TIMESTAMPS or n in _VALUE_CODES):
            numbers.append(b - 8)
            if n in _VALUE_CODES:
                value = (b - 8, _VALUE_CODES[n])
    return value


class RecentShapes:
    """The last shape seen at each payload size, for up to ``limit`` sizes.

    Clients of one kind push payloads of one shape, so a new client's first push
    usually has a shape seen already: checking it costs far less than a walk.
    """

    def __init__(self, limit: int = 256) -> None:
        self.limit = limit
        self._by_size: dict[int, Shape] = {}

    def of(self, raw: bytes) -> Shape | None:
        """The shape of a canonical payload (see ``shape_of``)."""
        known = self._by_size.get(len(raw))
        if known is not None and known.values(raw) is not None:
            return known
        shape = shape_of(raw)
        if shape is not None:
            self._by_size.pop(len(raw), None)
            self._by_size[len(raw)] = shape
            if len(self._by_size) > self.limit:
                del self._by_size[next(iter(self._by_size))]
        return shape
