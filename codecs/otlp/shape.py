"""The values in a small push, found by position when it is shaped like one before.

A client pushes the same metrics with the same attributes again and again; what
changes from one push to the next are the numbers of its data points: their
timestamps and values. In canonical protobuf form (the only form
``codecs.otlp.small`` accepts) those numbers of a gauge or sum point are
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
from kproxy.codecs.otlp import model as otlp
from kproxy.codecs.otlp.decode import DecodeLimits, wire_fields

_LEN, _I64 = 2, 1
_NUMBER_DATA = frozenset({5, 7})  # Metric.gauge, Metric.sum: their points are NumberDataPoints
_OTHER_DATA = frozenset({9, 11})  # histogram, summary: numbers outside fixed fields
# NumberDataPoint's fixed-width fields: the timestamps (read by nobody here) and the
# value, as_double or as_int, a oneof (so a point that has one has it at every push).
_TIMESTAMPS = frozenset({2, 3})
_VALUE_CODES = {4: "d", 6: "q"}
_NUMBER_KINDS = frozenset({"gauge", "sum"})
_TIMESTAMP = struct.Struct("<Q")


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

    @property
    def held_bytes(self) -> int:
        """Estimated bytes it keeps: the absent points' indexes, the digest, and its two
        struct formats, counted as its own (clients of one kind share them while the
        compiled structs are cached, but a client with a layout of its own does not)."""
        return 8 * len(self._absent) + 16 + len(self._around) + len(self._values)

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
    layout = _layout(raw)
    return None if layout is None else Shape(raw, *_flat(layout))


# Where one point's numbers lie: its start time, its time (offsets, -1 when not set)
# and its value (offset and struct code, None when not set).
_PointAt = tuple[int, int, tuple[int, str] | None]


def _layout(raw: bytes) -> list[_PointAt] | None:
    """Where each gauge and sum point's numbers lie, in payload order."""
    points: list[_PointAt] = []
    try:
        for rm in _submessages(raw, 0, len(raw), 1):  # MetricsData.resource_metrics
            for sm in _submessages(raw, *rm, 2):  # ResourceMetrics.scope_metrics
                for m in _submessages(raw, *sm, 2):  # ScopeMetrics.metrics
                    for n, wire, a, b in wire_fields(raw, *m):
                        if wire != _LEN or not (n in _NUMBER_DATA or n in _OTHER_DATA):
                            continue
                        data = _submessages(raw, a, b, 1)  # <kind>.data_points
                        if n in _OTHER_DATA and data:
                            return None
                        points.extend(_point(raw, *p) for p in data)
    except CodecError:
        return None
    return points


def _flat(points: list[_PointAt]) -> tuple[list[int], list[tuple[int, str] | None]]:
    """Every number's offset, in order; each point's value."""
    numbers = sorted(at for start, time, value in points
                     for at in (start, time, value[0] if value else -1) if at >= 0)
    return numbers, [value for _, _, value in points]


def _submessages(raw: bytes, start: int, end: int, number: int) -> list[tuple[int, int]]:
    return [(a, b) for n, wire, a, b in wire_fields(raw, start, end)
            if n == number and wire == _LEN]


def _point(raw: bytes, start: int, end: int) -> _PointAt:
    times, value = [-1, -1], None
    for n, wire, _, b in wire_fields(raw, start, end):
        if wire == _I64 and n in _TIMESTAMPS:
            times[n - 2] = b - 8
        elif wire == _I64 and n in _VALUE_CODES:
            value = (b - 8, _VALUE_CODES[n])
    return times[0], times[1], value


class _Exemplar:
    """A payload decoded once, and where each of its points' numbers lie."""

    __slots__ = ("decoded", "limits", "points", "shape")

    def __init__(self, shape: Shape, decoded: list[otlp.ResourceMetrics],
                 limits: DecodeLimits, points: list[_PointAt]) -> None:
        self.shape, self.decoded, self.limits = shape, decoded, limits
        self.points = tuple(points)

    def decode(self, raw: bytes) -> list[otlp.ResourceMetrics]:
        """What decoding ``raw`` (of this shape) gives: the exemplar with ``raw``'s numbers."""
        points = iter(self.points)

        def timestamp(at: int) -> int:
            return int(_TIMESTAMP.unpack_from(raw, at)[0]) if at >= 0 else 0

        def rebuilt(p: otlp.Point) -> otlp.Point:
            start, time, value = next(points)
            number = _compiled("<" + value[1]).unpack_from(raw, value[0])[0] if value else 0.0
            return otlp.NumberPoint(dict(p.attributes), timestamp(start), timestamp(time),
                                    number)

        return [otlp.ResourceMetrics(dict(rm.attributes), [otlp.ScopeMetrics(
            sm.name, sm.version, [otlp.Metric(
                m.name, m.description, m.unit, m.kind, m.temporality, m.monotonic,
                [rebuilt(p) for p in m.points] if m.kind in _NUMBER_KINDS else [])
                for m in sm.metrics]) for sm in rm.scopes]) for rm in self.decoded]


class RecentShapes:
    """The last payload decoded at each payload size, for up to ``limit`` sizes.

    Clients of one kind push payloads of one shape, so a new client's first push
    usually has a shape seen already: its decode is then the one seen, with its own
    numbers (read by position), at a fraction of the cost of a decode.
    """

    def __init__(self, limit: int = 256) -> None:
        self.limit = limit
        self._by_size: dict[int, _Exemplar] = {}

    def decode(self, raw: bytes,
               limits: DecodeLimits) -> tuple[Shape, list[otlp.ResourceMetrics]] | None:
        """The shape and decode of a payload shaped like one seen under ``limits``."""
        known = self._by_size.get(len(raw))
        if known is None or known.limits != limits or known.shape.values(raw) is None:
            return None
        return known.shape, known.decode(raw)

    def note(self, raw: bytes, decoded: list[otlp.ResourceMetrics],
             limits: DecodeLimits) -> Shape | None:
        """The shape of ``raw``, canonical and decoded under ``limits`` (``decode_small``);
        kept for the clients that push alike."""
        layout = _layout(raw)
        if layout is None:
            return None
        shape = Shape(raw, *_flat(layout))
        self._by_size.pop(len(raw), None)
        self._by_size[len(raw)] = _Exemplar(shape, decoded, limits, layout)
        if len(self._by_size) > self.limit:
            del self._by_size[next(iter(self._by_size))]
        return shape
