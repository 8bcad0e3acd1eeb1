"""Small pushes answered at once, and repeats of a client's last push shape.

Whatever path a push takes (decoded at once, updated from its values alone, or paced
in steps), the series it leaves must be those a full decode and ingest of every push
leaves; and the answer's bytes must be what the codec encodes.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable
from typing import cast

import pytest
import trio
from opentelemetry.proto.metrics.v1 import metrics_pb2

from kproxy.codecs import api_keys, compression
from kproxy.codecs.messages import encode_response_parts
from kproxy.codecs.otlp import model as otlp
from kproxy.codecs.otlp.decode import DecodeLimits, decode_metrics_data
from kproxy.codecs.otlp.small import SMALL_POINTS, decode_small
from kproxy.codecs.peek import peek_request
from kproxy.metrics.proxy_metrics import ProxyMetrics
from kproxy.policies.connection import ClientInfo, ConnectionState
from kproxy.policies.telemetry import state as policy
from kproxy.policies.telemetry.store import MetricsStore
from kproxy.telemetry import service as telemetry
from kproxy.telemetry.service import TelemetryService

from ..otlp_samples import as_temporality, kv, number_values
from ..support import encode_request, make_config

ID = uuid.UUID(int=7)
LABELS = {"client_instance_id": str(ID), "client_id": "app"}


def payload(values: list[float], temporality: int = 2, nodes: int = 2,
            extra_metric: bool = False) -> bytes:
    """A sum and a gauge with node.id points, as librdkafka pushes them."""
    md = metrics_pb2.MetricsData()
    sm = md.resource_metrics.add().scope_metrics.add()
    sm.scope.name = "rdkafka"
    s = sm.metrics.add(name="requests")
    s.sum.aggregation_temporality, s.sum.is_monotonic = as_temporality(temporality), True
    g = sm.metrics.add(name="latency")
    for node in range(nodes):
        s.sum.data_points.add(as_int=int(values[0]) + node, time_unix_nano=10**18,
                              attributes=[kv("node.id", node)])
        g.gauge.data_points.add(as_double=values[1] * node, time_unix_nano=10**18,
                                attributes=[kv("node.id", node)])
    if extra_metric:
        sm.metrics.add(name="extra").gauge.data_points.add(as_int=1)
    return md.SerializeToString()


def series_values(store: MetricsStore) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(fam.name, labels): series.value for fam, rows in store.snapshot()
            for labels, series in rows}


# ------------------------------------------------------------------------------ store


def test_landing_a_repeat_is_ingesting_it() -> None:
    for delta, temporality in ((False, 2), (True, 1), (True, 2)):
        landed, full = MetricsStore(), MetricsStore()
        first = decode_metrics_data(payload([3, 1.5], temporality))
        stats, landing = landed.ingest_noting(ID, LABELS, first, delta)
        assert landing is not None and stats == full.ingest(ID, LABELS, first, delta)
        for values in ([5, 2.5], [9, 0.25]):
            raw = payload(values, temporality)
            again = decode_metrics_data(raw)
            numbers = number_values(again)
            assert landed.land(ID, landing, numbers, delta) == full.ingest(ID, LABELS, again,
                                                                           delta)
        assert series_values(landed) == series_values(full)


def test_points_kept_out_by_the_series_cap_are_kept_out_again_while_it_holds() -> None:
    landed, full = MetricsStore(max_series=3), MetricsStore(max_series=3)
    first = decode_metrics_data(payload([1, 1.0]))
    stats, landing = landed.ingest_noting(ID, LABELS, first, False)
    assert stats.dropped_by_cap == 1 and stats == full.ingest(ID, LABELS, first, False)
    assert landing is not None and len(landing.capped) == 1  # four points, three series
    again = decode_metrics_data(payload([2, 2.0]))
    numbers = number_values(again)
    assert landed.land(ID, landing, numbers, False) == full.ingest(ID, LABELS, again, False)
    assert series_values(landed) == series_values(full)
    landed.max_series = 4  # room now: the point would get its series, so no replay
    assert landed.land(ID, landing, numbers, False) is None


def test_no_landing_when_a_point_went_nowhere_and_none_once_forgotten() -> None:
    small = MetricsStore(max_series_bytes=1500)
    stats, landing = small.ingest_noting(ID, LABELS, decode_metrics_data(payload([1, 1])),
                                         False)
    assert stats.dropped_by_bytes and landing is None  # the byte bound: not replayed
    store = MetricsStore()
    _, landing = store.ingest_noting(ID, LABELS, decode_metrics_data(payload([1, 1])), False)
    assert landing is not None
    store.forget(ID)
    assert store.land(ID, landing, [1, 2, 3, 4], False) is None


# ---------------------------------------------------------------------------- service


class Conn:
    """What the telemetry handlers read of a connection."""

    info = ClientInfo("127.0.0.1", 5000, "app", "librdkafka", "2.5.0")
    telemetry_held_until = 0

    def log_fields(self) -> dict[str, object]:
        return {}


class Pusher:
    """One client instance pushing through a TelemetryService, on a clock of its own."""

    def __init__(self) -> None:
        cfg = make_config("127.0.0.1:1", telemetry_default_interval_ms=100)
        self.now = 1_000_000
        self.service = TelemetryService(cfg.telemetry, ProxyMetrics(),
                                        clock_ms=lambda: self.now)
        self.conn = Conn()
        attributes = self.service.attributes(cast(ConnectionState, self.conn))
        got = self.service.state.get_subscriptions(uuid.UUID(int=0), attributes, self.now)
        assert got.instance is not None
        self.instance = got.instance
        self.corr = 0

    def push(self, raw: bytes, compression_type: int = 4) -> bytes | Awaitable[bytes]:
        self.now += 1000
        self.corr += 1
        frame = memoryview(encode_request(api_keys.PUSH_TELEMETRY, 0, self.corr, {
            "client_instance_id": self.instance.uuid,
            "subscription_id": self.instance.subscription_id, "terminating": False,
            "compression_type": compression_type,
            "metrics": compression.compress(compression_type, raw)})[4:])
        return self.service.handle_push(cast(ConnectionState, self.conn), peek_request(frame),
                                        frame)


def reference_store(pushes: list[bytes], inst: policy.ClientInstance) -> MetricsStore:
    """What a full decode and ingest of every push leaves."""
    store = MetricsStore()
    for raw in pushes:
        store.ingest(inst.instance_id, inst.attrs, decode_metrics_data(raw), False)
    return store


def assert_instance_bytes_counted(state: policy.TelemetryState) -> None:
    """What the instance memory bound counts includes each instance's last push."""
    assert state.instance_bytes == sum(i.size for i in state.instances.values())
    for inst in state.instances.values():
        attrs = sum(len(k) + len(v) for k, v in inst.attrs.items())
        assert inst.size > policy.INSTANCE_OVERHEAD + attrs if inst.last_push else (
            inst.size == policy.INSTANCE_OVERHEAD + attrs)


def test_pushes_small_and_repeated_leave_what_full_decodes_leave(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pusher = Pusher()
    decoded = []

    def counted(raw: bytes, limits: DecodeLimits) -> list[otlp.ResourceMetrics] | None:
        decoded.append(raw)
        return decode_small(raw, limits)

    monkeypatch.setattr(telemetry, "decode_small", counted)
    pushes = [payload([1, 1.0]), payload([2, 2.0]), payload([3, 0.5]),
              payload([4, 1.0], extra_metric=True), payload([5, 3.0], extra_metric=True),
              payload([6, 1.0], nodes=3)]
    for raw in pushes:
        answer = pusher.push(raw)
        assert isinstance(answer, bytes)  # small: answered at once
        assert pusher.instance.last_push is not None  # its shape noted for the next one
        assert_instance_bytes_counted(pusher.service.state)
    # Decoded: the first push and each change of shape; the repeats were not.
    assert decoded == [pushes[0], pushes[3], pushes[5]]
    assert series_values(pusher.service.store) == series_values(
        reference_store(pushes, pusher.instance))


def test_the_answer_is_what_the_codec_encodes() -> None:
    pusher = Pusher()
    for corr in (1, 2):
        answer = pusher.push(payload([corr, 1.0]))
        assert answer == encode_response_parts(api_keys.PUSH_TELEMETRY, 0, corr,
                                               {"throttle_time_ms": 0, "error_code": 0})
    pusher.now -= 1000  # too early: refused, and answered so
    assert pusher.push(payload([3, 1.0])) == encode_response_parts(
        api_keys.PUSH_TELEMETRY, 0, 3,
        {"throttle_time_ms": 0, "error_code": policy.THROTTLING_QUOTA_EXCEEDED})


def test_big_pushes_are_paced_and_a_clients_next_push_waits_behind_them() -> None:
    pusher = Pusher()
    assert isinstance(pusher.push(payload([0, 1.0])), bytes)
    assert pusher.instance.last_push is not None
    big = payload([1, 1.0], nodes=SMALL_POINTS)  # 2 x SMALL_POINTS points
    paced = pusher.push(big)
    assert not isinstance(paced, bytes) and pusher.instance.paced == 1
    assert pusher.instance.last_push is None  # its series change other than by a repeat
    assert_instance_bytes_counted(pusher.service.state)
    behind = pusher.push(payload([2, 2.0]))  # small, but its client has one being paced
    assert not isinstance(behind, bytes)

    async def answer_in_order() -> None:
        assert isinstance(await paced, bytes)
        assert isinstance(await behind, bytes)

    trio.run(answer_in_order)
    assert pusher.instance.paced == 0
    assert isinstance(pusher.push(payload([3, 1.0])), bytes)
    assert series_values(pusher.service.store) == series_values(
        reference_store([payload([0, 1.0]), big, payload([2, 2.0]), payload([3, 1.0])],
                        pusher.instance))


def test_small_pushes_take_from_the_pacers_bucket_and_are_paced_once_it_is_empty() -> None:
    """Decoded at once, a small push costs the bucket paced work rests by; with the
    bucket empty (small pushes back to back), the next is paced like a big one, and
    answered the same."""
    pusher = Pusher()
    pacer = pusher.service.pacer
    clock = [100.0]
    pacer.clock = lambda: clock[0]  # as the proxy sets it: callable from any thread
    assert isinstance(pusher.push(payload([0, 1.0])), bytes)
    assert pacer.busy_seconds > 0 and pacer.tokens < pacer.burst
    pacer.spent(pacer.tokens + 0.01)  # 10 ms of work past the bucket
    assert not pacer.may_spend()
    paced = pusher.push(payload([1, 1.0]))
    assert not isinstance(paced, bytes) and pusher.instance.paced == 1
    before = pacer.busy_seconds

    async def answered() -> None:
        assert isinstance(await paced, bytes)

    trio.run(answered)
    # What the paced push cost (its check, decompression and decode: processor time, more
    # of it on a loaded machine) is charged too; the bucket refills past zero once the
    # clock has paid for both.
    cost = pacer.busy_seconds - before
    assert cost > 0
    clock[0] += (0.01 + cost) / pacer.share + 0.01
    assert pacer.may_spend()
    assert isinstance(pusher.push(payload([2, 1.0])), bytes)
    assert series_values(pusher.service.store) == series_values(
        reference_store([payload([v, 1.0]) for v in (0, 1, 2)], pusher.instance))
