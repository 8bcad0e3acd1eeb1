"""OTLP payloads shaped like librdkafka's KIP-714 pushes, built with the protobuf classes."""

from __future__ import annotations

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1.resource_pb2 import Resource


def kv(key: str, value: str | int | float | bool) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def librdkafka_like_payload(points: int = 3, now_ns: int = 1_700_000_000_000_000_000) -> bytes:
    """A producer push: a monotonic sum, a gauge and a histogram, with node.id attributes."""
    md = metrics_pb2.MetricsData()
    rm = md.resource_metrics.add()
    rm.resource.CopyFrom(Resource(attributes=[
        kv("client_rack", "r1"), kv("transactional_id", "tx"),
    ]))
    sm = rm.scope_metrics.add()
    sm.scope.CopyFrom(InstrumentationScope(name="librdkafka", version="2.16.1"))

    m = sm.metrics.add(name="org.apache.kafka.producer.connection.creation.total",
                       description="The total number of connections established.")
    m.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    m.sum.is_monotonic = True
    for i in range(points):
        m.sum.data_points.add(as_int=10 + i, time_unix_nano=now_ns, start_time_unix_nano=1)

    g = sm.metrics.add(name="org.apache.kafka.producer.node.request.latency.avg", unit="ms")
    for node in range(points):
        g.gauge.data_points.add(as_double=1.5 * node, time_unix_nano=now_ns,
                                attributes=[kv("node.id", node)])

    h = sm.metrics.add(name="org.apache.kafka.producer.record.queue.time")
    h.histogram.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    h.histogram.data_points.add(count=6, sum=21.0, bucket_counts=[1, 2, 3],
                                explicit_bounds=[1.0, 5.0], time_unix_nano=now_ns, min=0.5,
                                max=9.0)
    return md.SerializeToString()
