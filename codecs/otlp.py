"""OTLP ``MetricsData`` (the KIP-714 push payload) decoded into plain Python objects.

The policies and the exporter work on these dataclasses rather than on protobuf
messages, so that they never depend on the generated code and stay easy to test.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from google.protobuf.message import DecodeError
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

from kproxy.codecs.errors import CodecError

AttrValue = str | int | float | bool
Temporality = Literal["unspecified", "delta", "cumulative"]
MetricKind = Literal["gauge", "sum", "histogram", "exponential_histogram", "summary"]

_TEMPORALITY: dict[int, Temporality] = {0: "unspecified", 1: "delta", 2: "cumulative"}


@dataclass(slots=True)
class NumberPoint:
    attributes: dict[str, AttrValue]
    start_time_unix_nano: int
    time_unix_nano: int
    value: float | int


@dataclass(slots=True)
class HistogramPoint:
    attributes: dict[str, AttrValue]
    start_time_unix_nano: int
    time_unix_nano: int
    count: int
    sum: float | None
    bucket_counts: list[int]
    explicit_bounds: list[float]
    min: float | None = None
    max: float | None = None


@dataclass(slots=True)
class SummaryPoint:
    attributes: dict[str, AttrValue]
    start_time_unix_nano: int
    time_unix_nano: int
    count: int
    sum: float
    quantiles: list[tuple[float, float]]


Point = NumberPoint | HistogramPoint | SummaryPoint


@dataclass(slots=True)
class Metric:
    name: str
    description: str
    unit: str
    kind: MetricKind
    temporality: Temporality = "unspecified"
    monotonic: bool = False
    points: list[Point] = field(default_factory=list)


@dataclass(slots=True)
class ScopeMetrics:
    name: str
    version: str
    metrics: list[Metric]


@dataclass(slots=True)
class ResourceMetrics:
    attributes: dict[str, AttrValue]
    scopes: list[ScopeMetrics]


def decode_metrics_data(payload: bytes | memoryview) -> list[ResourceMetrics]:
    """Parse a serialized OTLP ``MetricsData`` message."""
    msg = metrics_pb2.MetricsData()
    try:
        msg.ParseFromString(bytes(payload))
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise CodecError(f"not an OTLP MetricsData message ({exc})", what="OTLP payload") from None
    return [
        ResourceMetrics(
            attributes=attributes(rm.resource.attributes),
            scopes=[
                ScopeMetrics(sm.scope.name, sm.scope.version, [_metric(m) for m in sm.metrics])
                for sm in rm.scope_metrics
            ],
        )
        for rm in msg.resource_metrics
    ]


def attributes(kvs: Iterable[KeyValue]) -> dict[str, AttrValue]:
    return {kv.key: _any_value(kv.value) for kv in kvs}


def _any_value(v: AnyValue) -> AttrValue:
    which = v.WhichOneof("value")
    if which == "string_value":
        return v.string_value
    if which == "int_value":
        return v.int_value
    if which == "double_value":
        return v.double_value
    if which == "bool_value":
        return v.bool_value
    if which == "bytes_value":
        return v.bytes_value.hex()
    if which is None:
        return ""
    return str(v).strip()  # arrays and kvlists: rare in client metrics; keep them readable


def _number(p: metrics_pb2.NumberDataPoint) -> NumberPoint:
    value: float | int = p.as_int if p.WhichOneof("value") == "as_int" else p.as_double
    return NumberPoint(attributes(p.attributes), p.start_time_unix_nano, p.time_unix_nano, value)


def _metric(m: metrics_pb2.Metric) -> Metric:
    which = m.WhichOneof("data")
    out = Metric(m.name, m.description, m.unit, "gauge")
    if which == "gauge":
        out.points = [_number(p) for p in m.gauge.data_points]
    elif which == "sum":
        out.kind = "sum"
        out.temporality = _TEMPORALITY.get(m.sum.aggregation_temporality, "unspecified")
        out.monotonic = m.sum.is_monotonic
        out.points = [_number(p) for p in m.sum.data_points]
    elif which == "histogram":
        out.kind = "histogram"
        out.temporality = _TEMPORALITY.get(m.histogram.aggregation_temporality, "unspecified")
        out.points = [
            HistogramPoint(
                attributes(p.attributes), p.start_time_unix_nano, p.time_unix_nano, p.count,
                p.sum if p.HasField("sum") else None, list(p.bucket_counts),
                list(p.explicit_bounds),
                p.min if p.HasField("min") else None, p.max if p.HasField("max") else None,
            )
            for p in m.histogram.data_points
        ]
    elif which == "exponential_histogram":
        out.kind = "exponential_histogram"
        out.temporality = _TEMPORALITY.get(
            m.exponential_histogram.aggregation_temporality, "unspecified")
    elif which == "summary":
        out.kind = "summary"
        out.points = [
            SummaryPoint(attributes(p.attributes), p.start_time_unix_nano, p.time_unix_nano,
                         p.count, p.sum, [(q.quantile, q.value) for q in p.quantile_values])
            for p in m.summary.data_points
        ]
    return out


def to_otlp_json(payload: bytes | memoryview, resource_attributes: dict[str, str]) -> str:
    """One line of OTLP JSON (the OpenTelemetry file-exporter format) for a push.

    The proxy's knowledge of the client is added as resource attributes, so a reader of
    the archive needs nothing but the line.
    """
    from google.protobuf.json_format import MessageToJson

    msg = metrics_pb2.MetricsData()
    try:
        msg.ParseFromString(bytes(payload))
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise CodecError(f"not an OTLP MetricsData message ({exc})", what="OTLP payload") from None
    for rm in msg.resource_metrics:
        known = {kv.key for kv in rm.resource.attributes}
        for key, value in resource_attributes.items():
            if key not in known:
                rm.resource.attributes.add(key=key, value=AnyValue(string_value=value))
    return MessageToJson(msg, indent=None, preserving_proto_field_name=False)
