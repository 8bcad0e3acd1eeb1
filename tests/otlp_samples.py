"""OTLP payloads shaped like librdkafka's KIP-714 pushes, built with the protobuf classes."""

from __future__ import annotations

import json
import random
from pathlib import Path

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from kproxy.codecs.otlp.model import NumberPoint, ResourceMetrics


def as_temporality(value: int) -> metrics_pb2.AggregationTemporality.ValueType:
    """An aggregation temporality from its number (1 delta, 2 cumulative)."""
    return metrics_pb2.AggregationTemporality.ValueType(value)


def number_values(data: list[ResourceMetrics]) -> list[int | float]:
    """Every point's value, in order, from decoded data that holds gauges and sums only."""
    points = [p for rm in data for sm in rm.scopes for m in sm.metrics for p in m.points]
    assert all(isinstance(p, NumberPoint) for p in points), "not only gauges and sums"
    return [p.value for p in points if isinstance(p, NumberPoint)]


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


def random_metrics_data(rnd: random.Random) -> bytes:
    """A MetricsData of every shape the protocol allows: every data kind, attribute value
    type (nested ones too), temporality (an unknown one as well), present and absent
    values, some with empty parts. The payloads are canonical (protobuf wrote them)."""
    md = metrics_pb2.MetricsData()
    for _ in range(rnd.randint(0, 2)):
        rm = md.resource_metrics.add()
        if rnd.random() < 0.7:
            rm.resource.attributes.extend(_random_attributes(rnd))
        if rnd.random() < 0.2:
            rm.schema_url = "https://example.com/schema"
        for _ in range(rnd.randint(0, 2)):
            sm = rm.scope_metrics.add()
            if rnd.random() < 0.7:
                sm.scope.name, sm.scope.version = rnd.choice(["", "s"]), rnd.choice(["", "1"])
            if rnd.random() < 0.2:
                sm.scope.attributes.extend(_random_attributes(rnd))
            for _ in range(rnd.randint(0, 4)):
                _random_metric(rnd, sm.metrics.add(name=rnd.choice(["", "m", "m.x"]),
                                                   description=rnd.choice(["", "d"]),
                                                   unit=rnd.choice(["", "ms"])))
    return md.SerializeToString()


def _random_metric(rnd: random.Random, m: metrics_pb2.Metric) -> None:
    kind = rnd.choice(["gauge", "sum", "histogram", "exponential_histogram", "summary", None])
    if kind is None:
        return
    data = getattr(m, kind)
    if kind in ("sum", "histogram", "exponential_histogram"):
        data.aggregation_temporality = rnd.choice([0, 1, 2, 5])
    if kind == "sum":
        data.is_monotonic = rnd.random() < 0.5
    data.SetInParent()
    for _ in range(rnd.randint(0, 3)):
        p = data.data_points.add()
        p.attributes.extend(_random_attributes(rnd))
        p.start_time_unix_nano = rnd.choice([0, 1, 2**63])
        p.time_unix_nano = rnd.randint(0, 2**64 - 1)
        if kind in ("gauge", "sum"):
            which = rnd.random()
            if which < 0.4:
                p.as_int = rnd.randint(-(2**63), 2**63 - 1)
            elif which < 0.8:
                p.as_double = rnd.random() * 1e6
            p.flags = rnd.choice([0, 1])
        elif kind == "histogram":
            p.count = rnd.randint(0, 100)
            if rnd.random() < 0.5:
                p.sum = rnd.random()
            p.bucket_counts.extend(rnd.randint(0, 9) for _ in range(rnd.randint(0, 4)))
            p.explicit_bounds.extend(rnd.random() for _ in range(rnd.randint(0, 4)))
            if rnd.random() < 0.5:
                p.min, p.max = 1.0, 2.0
        elif kind == "summary":
            p.count, p.sum = 3, 1.5
            for _ in range(rnd.randint(0, 3)):
                p.quantile_values.add(quantile=rnd.random(), value=rnd.random())
        else:
            p.count, p.scale = 1, 2
            p.positive.bucket_counts.extend([1, 2])


def _random_attributes(rnd: random.Random) -> list[KeyValue]:
    return [KeyValue(key=rnd.choice(["a", "b", "node.id", "c d"]), value=_random_value(rnd, 0))
            for _ in range(rnd.randint(0, 3))]


def _random_value(rnd: random.Random, depth: int) -> AnyValue:
    which = rnd.randrange(7 if depth < 2 else 5)
    if which == 0:
        return AnyValue(string_value=rnd.choice(["", "x", "héllo", "a" * 30]))
    if which == 1:
        return AnyValue(int_value=rnd.randint(-(2**63), 2**63 - 1))
    if which == 2:
        return AnyValue(double_value=rnd.random() * 1e6)
    if which == 3:
        return AnyValue(bool_value=rnd.random() < 0.5)
    if which == 4:
        return AnyValue(bytes_value=rnd.randbytes(3))
    value = AnyValue()
    if which == 5:
        value.array_value.values.extend(_random_value(rnd, depth + 1)
                                        for _ in range(rnd.randint(0, 2)))
    else:
        value.kvlist_value.values.extend(KeyValue(key="k", value=_random_value(rnd, depth + 1))
                                         for _ in range(rnd.randint(0, 2)))
    return value


def real_payloads() -> list[bytes]:
    """The decompressed OTLP payloads of the PushTelemetry requests librdkafka sent in
    the captured vectors (tests/vectors/librdkafka-telemetry.jsonl)."""
    from kproxy.codecs import compression
    from kproxy.codecs.messages import decode_request

    path = Path(__file__).parent / "vectors" / "librdkafka-telemetry.jsonl"
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["api_key"] == 72 and row["direction"] == "request":
            body = decode_request(bytes.fromhex(row["hex"])).body
            out.append(compression.decompress(body["compression_type"], body["metrics"],
                                              1 << 24))
    return out
