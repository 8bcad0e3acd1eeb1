"""Small OTLP payloads decoded in one protobuf call, with the stepped decoder's result.

The stepped decoder (``codecs.otlp.decode``) walks the levels above the data points
in Python so that no payload can cost more than its limits allow, and so that the
caller can pace the work. For the payloads clients actually send (librdkafka: ~1.5 KB
and ten points every push) that walk costs several times the whole push. Here a
payload that is small in bytes is parsed at once by protobuf (its work bounded by
those bytes), and accepted only when that provably gives what the stepped decoder
would give:

- **Canonical bytes.** Once unknown fields are dropped, the message serializes back
  to exactly the payload. Then every singular field occurs once, in field order,
  with no unknown fields or wire types, and one data kind per metric: the shapes
  where a field-by-field walk and protobuf's merge rules agree.
- **Within every limit.** Points, metrics, attributes and buckets are counted from
  the parsed message; fields walked and the size of any one message are bounded by
  the payload's size (every walked field takes at least two bytes, at each of the
  five levels walked), which is checked before parsing.
- **Few points.** At most ``max_points`` points are turned into objects here, so
  the work stays small enough to do on the event loop.

Anything else (too big, too many points, not canonical, unparsable, past a limit)
gives None: the stepped decoder then decides, with its errors and its limit names.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.metrics.v1 import metrics_pb2

from kproxy.codecs.otlp import model as otlp
from kproxy.codecs.otlp.decode import DecodeLimits

SMALL_BYTES = 16 * 1024  # decompressed payloads up to this size may be parsed at once
SMALL_POINTS = 128  # and up to this many data points built from them
_WALKED_LEVELS = 5  # MetricsData, ResourceMetrics, ScopeMetrics, Metric, the data kind
_CONVERT: dict[str, Any] = {
    "gauge": otlp.number_point, "sum": otlp.number_point,
    "histogram": otlp.histogram_point, "summary": otlp.summary_point,
    "exponential_histogram": None,  # counted, never built (as the stepped decoder does)
}
_BUCKETS = {"histogram": "bucket_counts", "summary": "quantile_values"}
_TEMPORAL = frozenset({"sum", "histogram", "exponential_histogram"})


def decode_small(raw: bytes, limits: DecodeLimits, max_bytes: int = SMALL_BYTES,
                 max_points: int = SMALL_POINTS) -> list[otlp.ResourceMetrics] | None:
    """What ``decode_metrics_data(raw, limits)`` returns, or None to leave it to that."""
    if len(raw) > min(max_bytes, limits.max_point_bytes,
                      2 * limits.max_fields // _WALKED_LEVELS):
        return None
    try:
        msg = metrics_pb2.MetricsData.FromString(raw)
        msg.DiscardUnknownFields()
        if msg.SerializeToString() != raw:
            return None
    except (DecodeError, RuntimeError, ValueError):
        return None
    try:
        return _Builder(limits, max_points).resources(msg)
    except _NotSmall:
        return None


class _NotSmall(Exception):
    """A limit (or ``max_points``) is passed: the stepped decoder decides."""


class _Builder:
    """One pass over the parsed message: counts against the limits as it converts."""

    def __init__(self, limits: DecodeLimits, max_points: int) -> None:
        self.limits = limits
        self.points_left = min(max_points, limits.max_points)
        self.metrics_left = limits.max_metrics

    def resources(self, msg: Any) -> list[otlp.ResourceMetrics]:
        out = []
        for rm in msg.resource_metrics:
            attrs = rm.resource.attributes
            self._attributes(attrs)
            scopes = []
            for sm in rm.scope_metrics:
                scope = sm.scope
                self._attributes(scope.attributes)
                metrics = sm.metrics
                self.metrics_left -= len(metrics)
                if self.metrics_left < 0:
                    raise _NotSmall
                scopes.append(otlp.ScopeMetrics(scope.name, scope.version,
                                                [self._metric(m) for m in metrics]))
            out.append(otlp.ResourceMetrics(otlp.attributes(attrs), scopes))
        return out

    def _attributes(self, attrs: Any) -> None:
        if len(attrs) > self.limits.max_attributes:
            raise _NotSmall

    def _metric(self, m: Any) -> otlp.Metric:
        which = m.WhichOneof("data")
        if which is None:  # no data: what the stepped decoder makes of it
            return otlp.Metric(m.name, m.description, m.unit, "gauge")
        data = getattr(m, which)
        points = data.data_points
        self.points_left -= len(points)
        if self.points_left < 0:
            raise _NotSmall
        temporality: otlp.Temporality = "unspecified"
        if which in _TEMPORAL:
            temporality = otlp.TEMPORALITY.get(data.aggregation_temporality, "unspecified")
        convert = _CONVERT[which]
        built = []
        if convert is not None:  # else neither attributes nor buckets are looked at
            max_attributes, max_buckets = self.limits.max_attributes, self.limits.max_buckets
            buckets = _BUCKETS.get(which)
            for p in points:
                if len(p.attributes) > max_attributes or (
                        buckets and len(getattr(p, buckets)) > max_buckets):
                    raise _NotSmall
                built.append(convert(p))
        return otlp.Metric(m.name, m.description, m.unit, which, temporality,
                           which == "sum" and data.is_monotonic, built)
