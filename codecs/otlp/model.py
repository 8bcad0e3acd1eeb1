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

TEMPORALITY: dict[int, Temporality] = {0: "unspecified", 1: "delta", 2: "cumulative"}


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
    """Parse a serialized OTLP ``MetricsData`` message, within the default decode limits."""
    from kproxy.codecs.otlp.decode import decode_metrics_data as bounded_decode

    return bounded_decode(payload)


def attributes(kvs: Iterable[KeyValue]) -> dict[str, AttrValue]:
    if not kvs:  # most points have none: no comprehension to set up
        return {}
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
    # Arrays and kvlists: rare in client metrics; kept readable, and short.
    return str(v).strip()[:MAX_COMPOSITE_CHARS]


MAX_COMPOSITE_CHARS = 256  # an array or kvlist attribute value, rendered as text


def number_point(p: metrics_pb2.NumberDataPoint) -> NumberPoint:
    value: float | int = p.as_int if p.WhichOneof("value") == "as_int" else p.as_double
    return NumberPoint(attributes(p.attributes), p.start_time_unix_nano, p.time_unix_nano, value)


def histogram_point(p: metrics_pb2.HistogramDataPoint) -> HistogramPoint:
    return HistogramPoint(
        attributes(p.attributes), p.start_time_unix_nano, p.time_unix_nano, p.count,
        p.sum if p.HasField("sum") else None, list(p.bucket_counts), list(p.explicit_bounds),
        p.min if p.HasField("min") else None, p.max if p.HasField("max") else None)


def summary_point(p: metrics_pb2.SummaryDataPoint) -> SummaryPoint:
    return SummaryPoint(attributes(p.attributes), p.start_time_unix_nano, p.time_unix_nano,
                        p.count, p.sum, [(q.quantile, q.value) for q in p.quantile_values])


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
