"""Decoding an OTLP ``MetricsData`` payload with bounded work, in small steps.

A push of a kilobyte can decompress into megabytes of tiny data points; parsing
that in one protobuf call holds the interpreter (and with it every connection)
for as long as it takes, and builds an object per point. Here the payload is
decoded in two passes, each of which can be suspended between steps:

1. **Walk**: the message levels above the data points (resource, scope, metric)
   are read from the protobuf wire format directly, noting where each data point
   lies without parsing it. Points, metrics, fields and sizes are counted as they
   are met; the first limit passed ends the decode (``OtlpLimitExceeded``), before
   any point has been built.
2. **Build**: each data point is parsed on its own (a message of at most
   ``max_point_bytes``) and turned into the ``otlp`` dataclasses.

``MetricsDecoder.steps()`` yields after every ``step_work`` units of work (a field
walked or a point built), so the caller decides how to interleave the decode with
everything else; no step is larger than one point's parse. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from kproxy.codecs.errors import CodecError
from kproxy.codecs.otlp import model as otlp


@dataclass(frozen=True)
class DecodeLimits:
    """What one push may cost to decode; each is checked before the work it bounds."""

    max_points: int = 10_000  # data points in the whole push
    max_metrics: int = 2_000  # metrics in the whole push
    max_fields: int = 50_000  # wire fields walked above the points (resource, scope, metric)
    max_attributes: int = 64  # attributes on one data point, resource or scope
    max_point_bytes: int = 64 * 1024  # one data point's encoding (also resource and scope)
    max_buckets: int = 1_024  # histogram buckets or summary quantiles of one point


DEFAULT_LIMITS = DecodeLimits()
# Units of work between two yields of MetricsDecoder.steps(): a wire field walked
# is one unit, a data point built BUILD_WORK (it costs about that many times more),
# so a step is well under a millisecond on a typical core.
STEP_WORK = 256
BUILD_WORK = 16


class OtlpLimitExceeded(CodecError):
    """The push asks for more decode work than ``DecodeLimits`` allow; ``limit`` names it."""

    def __init__(self, limit: str, reason: str) -> None:
        super().__init__(reason, what="OTLP payload")
        self.limit = limit


# Field numbers of the OTLP metrics protocol (opentelemetry/proto/metrics/v1).
_RESOURCE_METRICS = 1  # MetricsData
_RESOURCE, _SCOPE_METRICS = 1, 2  # ResourceMetrics
_SCOPE, _METRICS = 1, 2  # ScopeMetrics
_NAME, _DESCRIPTION, _UNIT = 1, 2, 3  # Metric
_DATA_KINDS: dict[int, otlp.MetricKind] = {5: "gauge", 7: "sum", 9: "histogram",
                                           10: "exponential_histogram", 11: "summary"}
_DATA_POINTS, _TEMPORALITY, _MONOTONIC = 1, 2, 3  # Gauge / Sum / Histogram / Summary

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
Field = tuple[int, int, int, int]  # field number, wire type, value or start, end


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise CodecError("truncated varint", what="OTLP payload", offset=pos)
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise CodecError("varint longer than 10 bytes", what="OTLP payload", offset=pos)


def wire_fields(buf: bytes, pos: int, end: int) -> Iterator[Field]:
    """The fields of one message in ``buf[pos:end]``; LEN fields as (start, end)."""
    while pos < end:
        at = pos
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise CodecError("field number 0", what="OTLP payload", offset=at)
        if wire == _VARINT:
            value, pos = _varint(buf, pos, end)
            yield number, wire, value, pos
        elif wire == _LEN:
            size, pos = _varint(buf, pos, end)
            if pos + size > end:
                raise CodecError("field runs past its message", what="OTLP payload", offset=at)
            yield number, wire, pos, pos + size
            pos += size
        elif wire in (_I64, _I32):
            pos += 8 if wire == _I64 else 4
            if pos > end:
                raise CodecError("truncated fixed field", what="OTLP payload", offset=at)
            yield number, wire, 0, pos
        else:  # groups (3, 4) do not occur in OTLP; anything else is not protobuf
            raise CodecError(f"unsupported wire type {wire}", what="OTLP payload", offset=at)


@dataclass
class _PlannedMetric:
    name: str
    description: str
    unit: str
    kind: otlp.MetricKind
    temporality: otlp.Temporality
    monotonic: bool
    points: list[tuple[int, int]]  # where each data point lies in the payload


@dataclass
class _PlannedScope:
    name: str
    version: str
    metrics: list[_PlannedMetric]


@dataclass
class _PlannedResource:
    attributes: dict[str, otlp.AttrValue]
    scopes: list[_PlannedScope]


class MetricsDecoder:
    """One payload's decode; drive ``steps()`` to the end, then read ``result``."""

    def __init__(self, payload: bytes | memoryview, limits: DecodeLimits = DEFAULT_LIMITS,
                 step_work: int = STEP_WORK) -> None:
        self.buf = bytes(payload)
        self.limits = limits
        self.step_work = step_work
        self.result: list[otlp.ResourceMetrics] = []
        self.points = self.metrics = self.fields = 0
        self._work = 0

    def steps(self) -> Iterator[None]:
        """Decode; yields between steps; raises ``CodecError`` (or its ``OtlpLimitExceeded``)."""
        plan: list[_PlannedResource] = []
        try:
            for start, end in self._len_fields(0, len(self.buf), _RESOURCE_METRICS):
                plan.append(_PlannedResource({}, []))
                yield from self._walk_resource(start, end, plan[-1])
            for resource in plan:
                scopes = []
                for scope in resource.scopes:
                    metrics = []
                    for planned in scope.metrics:
                        metric = otlp.Metric(planned.name, planned.description, planned.unit,
                                             planned.kind, planned.temporality,
                                             planned.monotonic)
                        yield from self._build_points(planned, metric.points)
                        metrics.append(metric)
                    scopes.append(otlp.ScopeMetrics(scope.name, scope.version, metrics))
                self.result.append(otlp.ResourceMetrics(resource.attributes, scopes))
        except (DecodeError, RuntimeError, UnicodeDecodeError) as exc:
            raise CodecError(f"not an OTLP MetricsData message ({exc})",
                             what="OTLP payload") from None

    # ---------------------------------------------------------------- walk

    def _tick(self, weight: int = 1) -> bool:
        self._work += weight
        if self._work >= self.step_work:
            self._work = 0
            return True
        return False

    def _walked(self, fields: Iterator[Field]) -> Iterator[Field]:
        for field in fields:
            self.fields += 1
            if self.fields > self.limits.max_fields:
                raise OtlpLimitExceeded("fields", f"more than {self.limits.max_fields} "
                                        "fields above the data points")
            yield field

    def _len_fields(self, start: int, end: int, number: int) -> Iterator[tuple[int, int]]:
        for n, wire, a, b in self._walked(wire_fields(self.buf, start, end)):
            if n == number and wire == _LEN:
                yield a, b

    def _walk_resource(self, start: int, end: int, out: _PlannedResource) -> Iterator[None]:
        for n, wire, a, b in self._walked(wire_fields(self.buf, start, end)):
            if wire != _LEN:
                continue
            if n == _RESOURCE:
                resource = self._parse(Resource, a, b, "resource")
                self._check_attributes(len(resource.attributes), "resource")
                out.attributes.update(otlp.attributes(resource.attributes))
            elif n == _SCOPE_METRICS:
                scope = _PlannedScope("", "", [])
                out.scopes.append(scope)
                yield from self._walk_scope(a, b, scope)
            if self._tick():
                yield

    def _walk_scope(self, start: int, end: int, out: _PlannedScope) -> Iterator[None]:
        for n, wire, a, b in self._walked(wire_fields(self.buf, start, end)):
            if wire != _LEN:
                continue
            if n == _SCOPE:
                scope = self._parse(InstrumentationScope, a, b, "scope")
                self._check_attributes(len(scope.attributes), "scope")
                out.name, out.version = scope.name, scope.version
            elif n == _METRICS:
                self.metrics += 1
                if self.metrics > self.limits.max_metrics:
                    raise OtlpLimitExceeded("metrics", f"more than {self.limits.max_metrics} "
                                            "metrics in one push")
                metric = _PlannedMetric("", "", "", "gauge", "unspecified", False, [])
                out.metrics.append(metric)
                yield from self._walk_metric(a, b, metric)
            if self._tick():
                yield

    def _walk_metric(self, start: int, end: int, out: _PlannedMetric) -> Iterator[None]:
        buf = self.buf
        for n, wire, a, b in self._walked(wire_fields(buf, start, end)):
            if wire != _LEN:
                continue
            if n == _NAME:
                out.name = buf[a:b].decode()
            elif n == _DESCRIPTION:
                out.description = buf[a:b].decode()
            elif n == _UNIT:
                out.unit = buf[a:b].decode()
            elif n in _DATA_KINDS:
                kind = _DATA_KINDS[n]
                if kind != out.kind or not out.points:  # a oneof: the last kind wins
                    out.points = []
                out.kind, out.temporality, out.monotonic = kind, "unspecified", False
                yield from self._walk_data(a, b, out)
            if self._tick():
                yield

    def _walk_data(self, start: int, end: int, out: _PlannedMetric) -> Iterator[None]:
        limits = self.limits
        for n, wire, a, b in self._walked(wire_fields(self.buf, start, end)):
            if n == _DATA_POINTS and wire == _LEN:
                self.points += 1
                if self.points > limits.max_points:
                    raise OtlpLimitExceeded("points", f"more than {limits.max_points} data "
                                            "points in one push")
                if b - a > limits.max_point_bytes:
                    raise OtlpLimitExceeded("point_bytes", f"a data point of {b - a} bytes "
                                            f"(limit {limits.max_point_bytes})")
                out.points.append((a, b))
            elif n == _TEMPORALITY and wire == _VARINT:
                out.temporality = otlp.TEMPORALITY.get(a, "unspecified")
            elif n == _MONOTONIC and wire == _VARINT:
                out.monotonic = bool(a)
            if self._tick():
                yield

    # ---------------------------------------------------------------- build

    def _parse(self, cls: Any, start: int, end: int, what: str) -> Any:
        if end - start > self.limits.max_point_bytes:
            raise OtlpLimitExceeded("point_bytes", f"a {what} of {end - start} bytes "
                                    f"(limit {self.limits.max_point_bytes})")
        return cls.FromString(self.buf[start:end])

    def _check_attributes(self, n: int, what: str) -> None:
        if n > self.limits.max_attributes:
            raise OtlpLimitExceeded("attributes", f"a {what} with {n} attributes (limit "
                                    f"{self.limits.max_attributes})")

    def _build_points(self, planned: _PlannedMetric, out: list[otlp.Point]) -> Iterator[None]:
        build = _BUILDERS.get(planned.kind)
        if build is None:  # exponential histograms: counted by the store, not exported
            planned.points.clear()
            return
        cls, convert = build
        for start, end in planned.points:
            point = self._parse(cls, start, end, "data point")
            self._check_attributes(len(point.attributes), "data point")
            buckets = max(len(getattr(point, "bucket_counts", ())),
                          len(getattr(point, "quantile_values", ())))
            if buckets > self.limits.max_buckets:
                raise OtlpLimitExceeded("buckets", f"a data point with {buckets} buckets "
                                        f"(limit {self.limits.max_buckets})")
            out.append(convert(point))
            if self._tick(BUILD_WORK):
                yield


_BUILDERS: dict[str, tuple[Any, Callable[[Any], otlp.Point]]] = {
    "gauge": (metrics_pb2.NumberDataPoint, otlp.number_point),
    "sum": (metrics_pb2.NumberDataPoint, otlp.number_point),
    "histogram": (metrics_pb2.HistogramDataPoint, otlp.histogram_point),
    "summary": (metrics_pb2.SummaryDataPoint, otlp.summary_point),
}


def decode_metrics_data(payload: bytes | memoryview,
                        limits: DecodeLimits = DEFAULT_LIMITS) -> list[otlp.ResourceMetrics]:
    """The whole decode in one go (tests, tools, the archive's reader)."""
    decoder = MetricsDecoder(payload, limits)
    for _ in decoder.steps():
        pass
    return decoder.result
