"""The bounded, stepped OTLP decoder: same result as a whole-message parse, within limits."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from opentelemetry.proto.metrics.v1 import metrics_pb2

from kproxy.codecs import compression
from kproxy.codecs.otlp import model as otlp
from kproxy.codecs.otlp.decode import (
    BUILD_WORK,
    STEP_WORK,
    DecodeLimits,
    MetricsDecoder,
    OtlpLimitExceeded,
    decode_metrics_data,
)
from kproxy.policies.telemetry import state as t
from kproxy.policies.telemetry import subscriptions as subs
from kproxy.telemetry.pacing import LEAST_REST, REST_EVERY, Pacer

from ..hostile_pusher import bomb, varint
from ..otlp_samples import as_temporality, kv, librdkafka_like_payload, real_payloads


def reference(payload: bytes) -> list[otlp.ResourceMetrics]:
    """The whole message parsed by protobuf at once, then converted point by point."""
    md = metrics_pb2.MetricsData.FromString(payload)
    out = []
    for rm in md.resource_metrics:
        scopes = []
        for sm in rm.scope_metrics:
            metrics = []
            for m in sm.metrics:
                which = m.WhichOneof("data") or "gauge"
                data: Any = getattr(m, which)
                metric = otlp.Metric(m.name, m.description, m.unit, which)
                if which in ("sum", "histogram", "exponential_histogram"):
                    metric.temporality = otlp.TEMPORALITY[data.aggregation_temporality]
                if which == "sum":
                    metric.monotonic = data.is_monotonic
                converters: dict[str, Callable[[Any], Any]] = {
                    "gauge": otlp.number_point, "sum": otlp.number_point,
                    "histogram": otlp.histogram_point, "summary": otlp.summary_point}
                convert = converters.get(which)
                if convert is not None:
                    metric.points = [convert(p) for p in data.data_points]
                metrics.append(metric)
            scopes.append(otlp.ScopeMetrics(sm.scope.name, sm.scope.version, metrics))
        out.append(otlp.ResourceMetrics(otlp.attributes(rm.resource.attributes), scopes))
    return out


def _mixed_payload() -> bytes:
    md = metrics_pb2.MetricsData()
    for r in range(2):
        rm = md.resource_metrics.add()
        rm.resource.attributes.append(kv("r", r))
        sm = rm.scope_metrics.add()
        sm.scope.name, sm.scope.version = "s", "1"
        s = sm.metrics.add(name="summary", unit="s")
        s.summary.data_points.add(count=2, sum=3.0, attributes=[kv("a", "b")])
        s.summary.data_points[0].quantile_values.add(quantile=0.5, value=1.0)
        e = sm.metrics.add(name="exp")
        e.exponential_histogram.aggregation_temporality = as_temporality(1)
        e.exponential_histogram.data_points.add(count=1)
        d = sm.metrics.add(name="delta.sum")
        d.sum.aggregation_temporality, d.sum.is_monotonic = as_temporality(1), False
        d.sum.data_points.add(as_double=2.5, attributes=[kv("flag", True), kv("n", 1.5)])
        sm.metrics.add(name="empty")
    return md.SerializeToString()


@pytest.mark.parametrize("payload", [librdkafka_like_payload(points=5), _mixed_payload(),
                                     *real_payloads()])
def test_the_stepped_decode_equals_a_whole_message_parse(payload: bytes) -> None:
    assert decode_metrics_data(payload) == reference(payload)


def test_steps_are_small_and_the_decode_is_resumable() -> None:
    payload = librdkafka_like_payload(points=2_000)
    decoder = MetricsDecoder(payload)
    steps = sum(1 for _ in decoder.steps())
    points = sum(len(m.points) for m in decoder.result[0].scopes[0].metrics)
    assert points == 4_001
    # Every point built is BUILD_WORK units, every field walked one: a step holds
    # at most STEP_WORK units, so there are at least this many steps.
    assert steps >= points * BUILD_WORK // STEP_WORK
    assert decoder.result == reference(payload)


def _payload_with(**shape: int) -> bytes:
    md = metrics_pb2.MetricsData()
    sm = md.resource_metrics.add().scope_metrics.add()
    for m in range(shape.get("metrics", 1)):
        g = sm.metrics.add(name=f"m{m}")
        for p in range(shape.get("points", 1)):
            g.gauge.data_points.add(as_int=p, attributes=[
                kv(f"k{a}", a) for a in range(shape.get("attributes", 0))])
    if shape.get("buckets"):
        h = sm.metrics.add(name="h")
        h.histogram.data_points.add(bucket_counts=[1] * shape["buckets"],
                                    explicit_bounds=[1.0] * (shape["buckets"] - 1))
    if shape.get("big_point"):
        sm.metrics.add(name="big").gauge.data_points.add(
            as_int=1, attributes=[kv("blob", "x" * shape["big_point"])])
    data = md.SerializeToString()
    if shape.get("extra_fields"):
        # Empty schema_url fields in a ScopeMetrics: walked, never points.
        scope = b"\x1a\x00" * shape["extra_fields"]
        data += b"\x0a" + varint(len(scope) + 3) + b"\x12" + varint(len(scope)) + scope
    return data


LIMITS = DecodeLimits(max_points=100, max_metrics=10, max_fields=500, max_attributes=8,
                      max_point_bytes=4096, max_buckets=16)


@pytest.mark.parametrize(("shape", "limit"), [
    ({"points": 101}, "points"),
    ({"metrics": 11}, "metrics"),
    ({"attributes": 9}, "attributes"),
    ({"buckets": 17}, "buckets"),
    ({"big_point": 5000}, "point_bytes"),
    ({"extra_fields": 600}, "fields"),
])
def test_each_limit_is_enforced_and_named(shape: dict[str, int], limit: str) -> None:
    with pytest.raises(OtlpLimitExceeded) as exc:
        decode_metrics_data(_payload_with(**shape), LIMITS)
    assert exc.value.limit == limit


def test_at_the_limits_a_payload_decodes() -> None:
    payload = _payload_with(points=10, metrics=9, attributes=8, buckets=16)
    [rm] = decode_metrics_data(payload, LIMITS)
    assert sum(len(m.points) for m in rm.scopes[0].metrics) == 91


def test_a_compression_bomb_is_refused_before_any_point_is_built() -> None:
    """1.5 KB of zstd that expands to 15 MB of empty points: the points limit ends it."""
    packed = bomb()
    assert len(packed) < 4096
    raw = compression.decompress(4, packed, 16 * 1024 * 1024)
    decoder = MetricsDecoder(raw)
    with pytest.raises(OtlpLimitExceeded) as exc:
        for _ in decoder.steps():
            pass
    assert exc.value.limit == "points" and decoder.result == []
    assert decoder.points == DecodeLimits().max_points + 1


def test_garbage_is_a_codec_error_not_a_crash() -> None:
    from kproxy.codecs.errors import CodecError

    for bad in (b"\x0a\xff\xff\xff\xff\x0f", b"\x0b", b"\x0a\x05\x12\x03\x12\x01\xff",
                b"\x0a\x02\x12\x80"):
        with pytest.raises(CodecError):
            decode_metrics_data(bad)


def test_the_policy_names_the_limit_a_refused_push_passed() -> None:
    st = t.TelemetryState(subs.TelemetrySettings(max_bytes=1 << 20))
    now = 10**9
    got = st.get_subscriptions(uuid.UUID(int=0), {}, now)
    assert got.instance is not None
    inst = got.instance
    result = st.push(inst.uuid, inst.subscription_id, False, 4, bomb(), {},
                     now + 1)
    assert (result.error_code, result.limit) == (t.INVALID_RECORD, "points")
    st2 = t.TelemetryState(subs.TelemetrySettings(max_decompressed_bytes=1 << 20))
    got = st2.get_subscriptions(uuid.UUID(int=0), {}, now)
    assert got.instance is not None
    result = st2.push(got.instance.uuid, got.instance.subscription_id, False,
                      4, bomb(), {}, now + 1)
    assert (result.error_code, result.limit) == (t.INVALID_RECORD, "decompressed_bytes")


def _paced(share: float, burst: float, steps: int,
           step_s: float = 0.002) -> tuple[float, float]:
    """Work measured in thread time (``step_s`` a step); rests are sleeps on a mock clock.

    No mock time passes while working, so the bucket refills only while resting.
    """
    import time

    def work() -> Iterator[None]:
        for _ in range(steps):
            end = time.thread_time() + step_s
            while time.thread_time() < end:
                pass
            yield

    async def run() -> tuple[float, float]:
        pacer = Pacer(share, burst)
        start = trio.current_time()
        await pacer.steps(work())
        return trio.current_time() - start, pacer.busy_seconds

    return trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))


def test_sustained_work_is_held_to_its_share_of_the_time() -> None:
    rested, busy = _paced(0.25, 0.0, 5)
    assert busy >= 0.01
    assert rested == pytest.approx(busy / 0.25, rel=0.01, abs=0.002)


def test_occasional_work_within_the_burst_rests_only_the_least() -> None:
    # The least rest is a real sleep: the loop's thread blocks, so the express lane's
    # thread can take the interpreter (pacing.LEAST_REST), at least every REST_EVERY.
    rested, busy = _paced(0.25, 0.05, 5)  # steps longer than REST_EVERY
    assert busy >= 0.01
    assert rested == pytest.approx(5 * LEAST_REST)  # after each step (not the empty end)
    steps, step_s = 40, REST_EVERY / 4
    rested, busy = _paced(0.25, 0.05, steps, step_s)  # short steps: every few of them
    assert busy >= steps * step_s
    sleeps = round(rested / LEAST_REST)
    assert busy / REST_EVERY - 1 <= sleeps <= busy / REST_EVERY + 1, (sleeps, busy)


async def test_a_refused_bomb_is_answered_in_request_order_and_counted(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """Through the in-process proxy (FakeBroker upstream, named fake): a bomb pipelined
    between relayed requests is decoded off the request path, refused, counted, and its
    answer leaves between theirs, in request order; the connection then carries on."""
    from kproxy.codecs import api_keys
    from kproxy.codecs.peek import peek_correlation_id
    from kproxy.runtime.server import Proxy

    from ..fake_broker import FakeBroker
    from ..support import RawClient, encode_request, http_get, make_config, push_body

    fake = await FakeBroker(node_ids=[0]).start(nursery)
    proxy = Proxy(make_config(fake.bootstrap, node_id_range="0-0"))
    await nursery.start(lambda task_status: proxy.run(handle_signals=False,
                                                      task_status=task_status))
    client = await RawClient.connect(proxy.bootstrap_port or 0)
    got = (await client.request(api_keys.GET_TELEMETRY_SUBSCRIPTIONS, 0, 1,
                                {"client_instance_id": uuid.UUID(int=0)})).body
    metadata = {"topics": [], "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False}
    await client.send(
        encode_request(api_keys.METADATA, 12, 2, metadata)
        + encode_request(api_keys.PUSH_TELEMETRY, 0, 3, push_body(got, bomb(), 4))
        + encode_request(api_keys.METADATA, 12, 4, metadata))
    frames = [await client.read_frame(30) for _ in range(3)]
    assert [peek_correlation_id(f) for f in frames if f is not None] == [2, 3, 4]
    from kproxy.codecs.messages import decode_response

    assert frames[1] is not None
    assert decode_response(frames[1], api_keys.PUSH_TELEMETRY, 0).body["error_code"] == 87
    again = await client.request(api_keys.METADATA, 12, 5, metadata)
    assert again.header.correlation_id == 5
    _, _, text = await http_get(proxy.http_port or 0, "/metrics")
    assert b'kproxy_telemetry_pushes_over_limit_total{limit="points"} 1.0' in text
    proxy.shutdown()


def test_nested_attribute_values_are_bounded_in_depth_and_length() -> None:
    from kproxy.codecs.errors import CodecError

    def field(number: int, body: bytes) -> bytes:
        return varint(number << 3 | 2) + varint(len(body)) + body

    def payload(any_value: bytes) -> bytes:
        """Written directly: protobuf will not build messages nested past its limit."""
        point = field(7, field(1, b"a") + field(2, any_value))  # NumberDataPoint.attributes
        metric = field(1, b"n") + field(5, field(1, point))  # name, gauge.data_points
        return field(1, field(2, field(2, metric)))

    def nested(depth: int) -> bytes:
        value = field(1, b"leaf")  # AnyValue.string_value
        for _ in range(depth):  # AnyValue.kvlist_value > KeyValueList.values > KeyValue
            value = field(6, field(1, field(1, b"k") + field(2, value)))
        return value

    wide = field(5, b"".join(field(1, field(1, b"x" * 100)) for _ in range(100)))  # array
    for any_value in (nested(20), wide):
        [rm] = decode_metrics_data(payload(any_value))
        [value] = rm.scopes[0].metrics[0].points[0].attributes.values()
        assert isinstance(value, str) and 0 < len(value) <= otlp.MAX_COMPOSITE_CHARS
    with pytest.raises(CodecError):  # deeper than protobuf's recursion limit
        decode_metrics_data(payload(nested(200)))
