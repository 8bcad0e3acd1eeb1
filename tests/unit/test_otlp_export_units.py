"""The OTLP exporter's pure parts: batching and retry decisions, the request bytes,
the per-session latency sketch, and the export options in the config."""

from __future__ import annotations

import email.utils
import gzip
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

from kproxy.codecs.errors import CodecError
from kproxy.codecs.otlp.export import encode_body, export_request, rejected_points
from kproxy.config import settings as config_mod
from kproxy.policies import otlp_batch
from kproxy.policies.otlp_batch import (
    Batch,
    BatchSettings,
    ExportQueue,
    Push,
    RetryPolicy,
    parse_retry_after,
)
from kproxy.session.latency_sketch import LatencySketch, bucket_of, merge, quantile, upper_bound

from ..otlp_samples import as_temporality
from ..support import make_config


def push(size: int, at: float = 0.0) -> Push:
    return Push(b"x" * size, {}, at)


# ------------------------------------------------------------------ queue and batches

def test_batch_leaves_when_old_enough_or_big_enough() -> None:
    q = ExportQueue(BatchSettings(max_batch_bytes=1000, max_batch_age=2.0,
                                  max_queue_bytes=10_000))
    assert q.take(0.0) is None and q.due_at() is None
    assert q.offer(push(100, at=10.0))
    assert q.due_at() == 12.0
    assert q.take(11.9) is None
    batch = q.take(12.0)
    assert batch is not None and len(batch.pushes) == 1 and q.bytes == 0
    for i in range(12):  # 1200 bytes: the first ten make a full batch at once
        assert q.offer(push(100, at=20.0 + i * 0.01))
    first = q.take(20.2)
    assert first is not None and len(first.pushes) == 10 and first.size == 1000
    assert q.take(20.2) is None  # two left, not old enough
    assert q.take(20.0, force=True) is not None and len(q) == 0


def test_queue_refuses_beyond_its_bound_and_a_lone_large_push_goes_alone() -> None:
    q = ExportQueue(BatchSettings(max_batch_bytes=100, max_queue_bytes=500))
    assert q.offer(push(300))
    assert not q.offer(push(201))  # 501 > 500
    assert q.offer(push(200)) and q.bytes == 500
    batch = q.take(0.0)
    assert batch is not None and [p.size for p in batch.pushes] == [300]
    rest = q.take(0.0)
    assert rest is not None and [p.size for p in rest.pushes] == [200]


def test_push_size_counts_resource_attributes() -> None:
    assert Push(b"abc", {"k": "vv"}, 0).size == 6


# ------------------------------------------------------------------ retries

def policy(jitter: float = 0.0, **kw: float) -> RetryPolicy:
    return RetryPolicy(BatchSettings(**kw), jitter=lambda: jitter)  # type: ignore[arg-type]


def test_success_and_rejection_end_the_batch() -> None:
    p = policy()
    assert p.after_attempt(Batch([push(1)]), 200, None, 0, 0).outcome == otlp_batch.EXPORTED
    assert p.after_attempt(Batch([push(1)]), 204, None, 0, 0).outcome == otlp_batch.EXPORTED
    d = p.after_attempt(Batch([push(1)]), 400, None, 0, 0)
    assert d.outcome == otlp_batch.REJECTED and "400" in d.reason


@pytest.mark.parametrize("status", [None, 429, 500, 502, 503, 504])
def test_retryable_answers_back_off_exponentially(status: int | None) -> None:
    p = policy(backoff_initial=0.5, backoff_max=4.0, max_retry_time=1000)
    batch = Batch([push(1)])
    delays = []
    now = 100.0
    for _ in range(6):
        d = p.after_attempt(batch, status, None, now, 0)
        assert d.outcome is None and d.retry_at is not None
        delays.append(d.retry_at - now)
        now = d.retry_at
    # jitter 0 gives half the ceiling; the ceiling doubles up to backoff_max
    assert delays == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    assert batch.attempts == 6 and batch.first_attempt_at == 100.0


def test_jitter_stays_within_half_to_full_ceiling() -> None:
    d = policy(jitter=0.999, backoff_initial=1.0).after_attempt(Batch([push(1)]), 503, None,
                                                               0, 0)
    assert d.retry_at is not None and 0.5 <= d.retry_at < 1.0


def test_retry_after_is_honoured_in_seconds_and_as_a_date() -> None:
    p = policy(max_retry_time=100)
    d = p.after_attempt(Batch([push(1)]), 429, "7", 10.0, 0)
    assert d.retry_at == 17.0
    wall = 1_700_000_000.0
    date = email.utils.formatdate(wall + 12, usegmt=True)
    d = p.after_attempt(Batch([push(1)]), 503, date, 10.0, wall)
    assert d.retry_at == pytest.approx(22.0)
    # an unreadable header falls back to the backoff
    d = p.after_attempt(Batch([push(1)]), 503, "soon", 10.0, wall)
    assert d.retry_at == pytest.approx(10.25)


def test_retry_budget_ends_in_failed() -> None:
    p = policy(max_retry_time=10)
    batch = Batch([push(1)])
    assert p.after_attempt(batch, 503, "5", 0.0, 0).retry_at == 5.0
    d = p.after_attempt(batch, 503, "6", 5.0, 0)  # would retry at 11 > 0 + 10
    assert d.outcome == otlp_batch.FAILED and "2 attempt" in d.reason


def test_parse_retry_after() -> None:
    assert parse_retry_after(None, 0) is None
    assert parse_retry_after("", 0) is None
    assert parse_retry_after(" 3 ", 0) == 3.0
    assert parse_retry_after("-1", 0) is None
    assert parse_retry_after(email.utils.formatdate(50, usegmt=True), 100) == 0.0


# ------------------------------------------------------------------ request bytes

def metrics_data(resource: dict[str, str], temporality: int) -> bytes:
    data = metrics_pb2.MetricsData()
    rm = data.resource_metrics.add()
    for k, v in resource.items():
        rm.resource.attributes.append(KeyValue(key=k, value=AnyValue(string_value=v)))
    sm = rm.scope_metrics.add()
    sm.scope.name = "scope"
    m = sm.metrics.add()
    m.name = "org.apache.kafka.producer.record.queue.time.max"
    m.sum.aggregation_temporality = as_temporality(temporality)
    m.sum.is_monotonic = True
    dp = m.sum.data_points.add()
    dp.as_int = 42
    dp.time_unix_nano = 123
    return data.SerializeToString()


def test_export_request_keeps_metrics_and_sets_the_proxys_attributes() -> None:
    a = metrics_data({"client.id": "forged", "keep.me": "1"}, 1)  # delta
    b = metrics_data({}, 2)  # cumulative
    body, bad = export_request([(a, {"client.id": "real", "kproxy.host": "h"}),
                                (b, {"client.id": "other"}), (b"\xff\xff", {})])
    assert bad == 1
    req = metrics_service_pb2.ExportMetricsServiceRequest()
    req.ParseFromString(body)
    assert len(req.resource_metrics) == 2
    first = {kv.key: kv.value.string_value for kv in req.resource_metrics[0].resource.attributes}
    assert first == {"keep.me": "1", "client.id": "real", "kproxy.host": "h"}
    temporalities = [rm.scope_metrics[0].metrics[0].sum.aggregation_temporality
                     for rm in req.resource_metrics]
    assert temporalities == [1, 2]
    point = req.resource_metrics[1].scope_metrics[0].metrics[0].sum.data_points[0]
    assert (point.as_int, point.time_unix_nano) == (42, 123)


def test_body_gzip_and_partial_success() -> None:
    assert gzip.decompress(encode_body(b"abc", 5)) == b"abc"
    assert encode_body(b"abc", None) == b"abc"
    resp = metrics_service_pb2.ExportMetricsServiceResponse()
    resp.partial_success.rejected_data_points = 3
    resp.partial_success.error_message = "bad"
    assert rejected_points(resp.SerializeToString()) == (3, "bad")
    assert rejected_points(b"") == (0, "")
    with pytest.raises(CodecError):
        rejected_points(b"\xff\xff\xff")


# ------------------------------------------------------------------ latency sketch

def test_buckets_are_contiguous_and_bounded() -> None:
    prev = 0
    for us in range(0, 70_000, 7):
        b = bucket_of(us / 1e6)
        assert b >= prev
        assert us / 1e6 < upper_bound(b) and (b == 0 or us / 1e6 >= upper_bound(b - 1) - 1e-12)
        prev = b
    assert bucket_of(10_000.0) == bucket_of(1e9)  # the last bucket takes everything long
    assert bucket_of(-1.0) == 0


def test_p99_within_a_quarter_and_windows_rotate() -> None:
    s = LatencySketch()
    for i in range(990):
        s.observe(0.001, now=i * 0.01)
    for i in range(10):
        s.observe(0.2, now=10 + i * 0.01)
    p99 = quantile(s.counts(11.0), 0.99)
    assert p99 is not None and 0.001 <= p99 <= 0.00125
    p100 = quantile(s.counts(11.0), 1.0)
    assert p100 is not None and 0.2 <= p100 <= 0.25
    s.observe(0.005, now=70.0)  # a new window: the first one is now the previous one
    counts = s.counts(70.0)
    assert counts is not None and sum(counts) == 1001
    s.observe(0.005, now=200.0)  # two windows later: only the recent value is left
    counts = s.counts(200.0)
    assert counts is not None and sum(counts) == 1
    assert s.counts(400.0) is None and LatencySketch().counts(0.0) is None
    assert quantile(merge([None, [0] * 120]), 0.99) is None
    merged = merge([s.counts(200.0), s.counts(200.0)])
    assert merged is not None and sum(merged) == 2


# ------------------------------------------------------------------ configuration

def test_otlp_options_from_file_env_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "k.toml"
    path.write_text('[telemetry]\nprometheus = false\n[telemetry.otlp]\n'
                    'endpoint = "http://collector:4318/v1/metrics"\ncompression = "none"\n'
                    'max_batch_age = 0.5\n[telemetry.otlp.headers]\nauthorization = "Bearer x"\n')
    cfg = make_config("127.0.0.1:1", path)
    assert cfg.telemetry_otlp_endpoint == "http://collector:4318/v1/metrics"
    assert cfg.telemetry_otlp_headers == (("authorization", "Bearer x"),)
    assert cfg.telemetry_otlp_compression == "none" and cfg.telemetry_otlp_max_batch_age == 0.5
    assert cfg.telemetry.prometheus is False
    cfg = config_mod.load(None, env={"KPROXY_TELEMETRY_OTLP_HEADERS": "a=1,b=x%3Dy",
                                     "KPROXY_TELEMETRY_OTLP_ENDPOINT": "https://c/v1/metrics"})
    assert cfg.telemetry_otlp_headers == (("a", "1"), ("b", "x=y"))
    assert cfg.telemetry.prometheus is True and cfg.telemetry_otlp_timeout == 10.0
    cfg = make_config("127.0.0.1:1", telemetry_otlp_endpoint="http://127.0.0.1:9/x")
    assert cfg.telemetry_otlp_endpoint == "http://127.0.0.1:9/x"


@pytest.mark.parametrize(("toml", "message"), [
    ('[telemetry.otlp]\nendpoint = "ftp://x"\n', "http:// or https://"),
    ('[telemetry.otlp]\nendpoint = "http://x:99999/"\n', "telemetry.otlp.endpoint"),
    ('[telemetry.otlp]\nheaders = "bad header=1"\n', "not a valid HTTP header"),
    ('[telemetry.otlp]\nheaders = "novalue"\n', "NAME=VALUE"),
    ('[telemetry.otlp]\nendpoint = "http://x/"\nbogus = 1\n', "telemetry.otlp.bogus"),
    ('[telemetry.otlp]\ntls_cert = "c.pem"\n', "set both or neither"),
])
def test_bad_otlp_options_name_the_key(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "k.toml"
    path.write_text(toml)
    with pytest.raises(config_mod.ConfigError, match=message):
        make_config("127.0.0.1:1", path)
