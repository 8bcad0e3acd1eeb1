"""The small-push decoders: what they accept decodes exactly as the stepped decoder does.

``decode_small`` (one protobuf parse) and ``Shape.values`` (a repeat read by position)
must never change a result: each either gives what ``decode_metrics_data`` gives or
declines (None), for random canonical payloads, mutated real ones and payloads at and
past every limit.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.metrics.v1 import metrics_pb2

from kproxy.codecs.errors import CodecError
from kproxy.codecs.otlp import model as otlp
from kproxy.codecs.otlp import shape as otlp_shape
from kproxy.codecs.otlp.decode import DEFAULT_LIMITS, DecodeLimits, decode_metrics_data
from kproxy.codecs.otlp.shape import RecentShapes, shape_of
from kproxy.codecs.otlp.small import SMALL_POINTS, decode_small

from ..hostile_pusher import varint
from ..otlp_samples import (
    as_temporality,
    kv,
    librdkafka_like_payload,
    number_values,
    random_metrics_data,
    real_payloads,
)

TIGHT = DecodeLimits(max_points=6, max_metrics=4, max_fields=500, max_attributes=2,
                     max_point_bytes=4096, max_buckets=3)
MANY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def stepped(raw: bytes, limits: DecodeLimits) -> list[otlp.ResourceMetrics] | None:
    try:
        return decode_metrics_data(raw, limits)
    except CodecError:
        return None


def assert_same_or_declined(raw: bytes, limits: DecodeLimits) -> bool:
    """decode_small agrees with the stepped decoder, or declines; whether it accepted."""
    fast = decode_small(raw, limits, max_points=limits.max_points)
    if fast is not None:
        assert fast == stepped(raw, limits)
    return fast is not None


@MANY
@given(st.randoms(use_true_random=False), st.sampled_from([DEFAULT_LIMITS, TIGHT]))
def test_random_payloads_decode_as_the_stepped_decoder_does(rnd: random.Random,
                                                            limits: DecodeLimits) -> None:
    raw = random_metrics_data(rnd)
    accepted = assert_same_or_declined(raw, limits)
    if limits is DEFAULT_LIMITS:  # small, canonical, within every limit: never declined
        assert accepted


@MANY
@given(st.sampled_from([*real_payloads(), librdkafka_like_payload(5)]), st.data())
def test_mutated_payloads_decode_as_the_stepped_decoder_does(raw: bytes,
                                                             data: st.DataObject) -> None:
    edits = data.draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(0, 255),
                                         st.sampled_from(["set", "insert", "delete"])),
                               min_size=1, max_size=4))
    buf = bytearray(raw)
    for at, byte, how in edits:
        at = min(at, len(buf) - 1)
        if how == "set":
            buf[at] = byte
        elif how == "insert":
            buf.insert(at, byte)
        else:
            del buf[at]
    assert_same_or_declined(bytes(buf), data.draw(st.sampled_from([DEFAULT_LIMITS, TIGHT])))


def test_real_pushes_are_accepted() -> None:
    for raw in real_payloads():
        assert decode_small(raw, DEFAULT_LIMITS) == decode_metrics_data(raw)


def field(number: int, body: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(body)) + body


def _gauges(points: int, attributes: int = 0) -> bytes:
    md = metrics_pb2.MetricsData()
    g = md.resource_metrics.add().scope_metrics.add().metrics.add(name="g")
    for p in range(points):
        g.gauge.data_points.add(as_int=p, attributes=[kv(f"k{a}", a)
                                                      for a in range(attributes)])
    return md.SerializeToString()


def test_what_is_declined() -> None:
    raw = librdkafka_like_payload(3)
    assert decode_small(raw, DEFAULT_LIMITS) is not None
    assert decode_small(raw + raw, DEFAULT_LIMITS) is not None  # two resources: canonical
    # Not canonical: a resource written twice in one ResourceMetrics (protobuf merges them).
    resource = field(1, kv("a", "b").SerializeToString())
    twice = field(1, field(1, resource) + field(1, resource))
    assert stepped(twice, DEFAULT_LIMITS) is not None
    assert decode_small(twice, DEFAULT_LIMITS) is None
    # An unknown field: dropped by protobuf, so the bytes no longer match.
    assert decode_small(raw + b"\x78\x01", DEFAULT_LIMITS) is None
    assert decode_small(b"\xff", DEFAULT_LIMITS) is None  # not protobuf at all
    assert decode_small(raw, DEFAULT_LIMITS, max_bytes=len(raw) - 1) is None  # too big
    assert decode_small(_gauges(SMALL_POINTS + 1), DEFAULT_LIMITS) is None  # too many points
    assert decode_small(_gauges(SMALL_POINTS), DEFAULT_LIMITS) is not None
    assert decode_small(_gauges(7), TIGHT, max_points=100) is None  # past max_points
    assert decode_small(_gauges(1, attributes=3), TIGHT) is None  # past max_attributes


# ---------------------------------------------------------------------------- shapes


def _with_values(values: list[int | float], attribute: str = "a") -> bytes:
    md = metrics_pb2.MetricsData()
    sm = md.resource_metrics.add().scope_metrics.add()
    s = sm.metrics.add(name="s")
    s.sum.aggregation_temporality, s.sum.is_monotonic = as_temporality(1), True
    g = sm.metrics.add(name="g")
    for i, value in enumerate(values):
        data = s.sum if i % 2 else g.gauge
        p = data.data_points.add(time_unix_nano=10**18 + i, start_time_unix_nano=7 + i,
                                 attributes=[kv("k", attribute)])
        if isinstance(value, int):
            p.as_int = value
        else:
            p.as_double = value
    return md.SerializeToString()


def point_values(raw: bytes) -> list[int | float]:
    return [p.value for rm in decode_metrics_data(raw) for sm in rm.scopes
            for m in sm.metrics for p in m.points if isinstance(p, otlp.NumberPoint)]


def test_a_repeat_is_read_by_position() -> None:
    first = _with_values([1, 2.5, -3, 4.0])
    shape = shape_of(first)
    assert shape is not None
    assert shape.values(first) == point_values(first)
    again = _with_values([10**15, -0.0, 2**62, 1e300])  # new numbers, same shape
    assert shape.values(again) == point_values(again) != shape.values(first)
    # The timestamps change at every push: they are numbers, not shape.
    md = metrics_pb2.MetricsData.FromString(again)
    md.resource_metrics[0].scope_metrics[0].metrics[1].gauge.data_points[0].time_unix_nano = 5
    assert shape.values(md.SerializeToString()) == point_values(again)


def test_anything_else_is_another_shape() -> None:
    shape = shape_of(_with_values([1, 2.5]))
    assert shape is not None
    assert shape.values(_with_values([1.0, 2.5])) is None  # as_double where as_int was
    assert shape.values(_with_values([1, 2.5], attribute="b")) is None  # an attribute
    assert shape.values(_with_values([1, 2.5, 3])) is None  # one point more


def test_a_point_without_a_value_reads_as_protobuf_does() -> None:
    md = metrics_pb2.MetricsData()
    g = md.resource_metrics.add().scope_metrics.add().metrics.add(name="g")
    g.gauge.data_points.add(time_unix_nano=1, as_int=4)
    g.gauge.data_points.add(time_unix_nano=2)
    g.gauge.data_points.add(time_unix_nano=3, as_double=0.5)
    raw = md.SerializeToString()
    shape = shape_of(raw)
    assert shape is not None and shape.values(raw) == point_values(raw) == [4, 0.0, 0.5]


def test_points_with_numbers_elsewhere_have_no_shape() -> None:
    assert shape_of(librdkafka_like_payload(2)) is None  # it holds a histogram point
    assert shape_of(real_payloads()[0]) is not None


@MANY
@given(st.randoms(use_true_random=False))
def test_random_repeats_read_what_a_decode_reads(rnd: random.Random) -> None:
    raw = random_metrics_data(rnd)
    shape = shape_of(raw)
    if shape is None:
        return
    values = shape.values(raw)
    # gauges and sums only: they are all there
    assert values == number_values(decode_metrics_data(raw))


def test_recent_shapes_are_shared_by_clients_that_push_alike() -> None:
    recent = RecentShapes(limit=2)
    a, b = _with_values([1, 2.5]), _with_values([3, -4.0])
    assert recent.decode(a, DEFAULT_LIMITS) is None  # nothing seen yet
    shape = recent.note(a, decode_metrics_data(a), DEFAULT_LIMITS)
    assert shape is not None
    got = recent.decode(b, DEFAULT_LIMITS)
    assert got is not None and got[0] is shape and got[1] == decode_metrics_data(b)
    assert recent.decode(b, TIGHT) is None  # decoded under other limits: not reused
    assert recent.decode(_with_values([3, -4.0], attribute="x"), DEFAULT_LIMITS) is None
    recent.note(_with_values([1]), decode_metrics_data(_with_values([1])), DEFAULT_LIMITS)
    recent.note(_with_values([1, 2, 3]), decode_metrics_data(_with_values([1, 2, 3])),
                DEFAULT_LIMITS)
    assert recent.decode(b, DEFAULT_LIMITS) is None  # the oldest size went first


@MANY
@given(st.randoms(use_true_random=False), st.data())
def test_a_shape_seen_decodes_others_as_a_decode_does(rnd: random.Random,
                                                      data: st.DataObject) -> None:
    raw = random_metrics_data(rnd)
    layout = otlp_shape._layout(raw)  # where the numbers lie: rewritten below
    if layout is None or decode_small(raw, DEFAULT_LIMITS) is None:
        return
    recent = RecentShapes()
    assert recent.note(raw, decode_metrics_data(raw), DEFAULT_LIMITS) is not None
    other = bytearray(raw)
    for at in otlp_shape._flat(layout)[0]:
        other[at : at + 8] = data.draw(st.binary(min_size=8, max_size=8))
    got = recent.decode(bytes(other), DEFAULT_LIMITS)
    # Compared as text: any eight bytes are a double, NaN too (which equals nothing).
    assert got is not None and repr(got[1]) == repr(decode_metrics_data(bytes(other)))


@pytest.mark.parametrize("raw", real_payloads()[:1])
def test_real_pushes_have_a_shape(raw: bytes) -> None:
    shape = shape_of(raw)
    assert shape is not None and shape.values(raw) == point_values(raw)
