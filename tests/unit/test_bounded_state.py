"""Everything keyed by what a client chooses is bounded in count and in bytes."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

from kproxy.archive import ArchiveSettings, ArchiveWriter
from kproxy.codecs.otlp import model as otlp
from kproxy.logs import JsonFormatter, RateLimitedLog, TextFormatter
from kproxy.metrics.proxy_metrics import ProxyMetrics
from kproxy.policies.bounds import MAX_LABEL_CHARS, bounded
from kproxy.policies.telemetry import state as t
from kproxy.policies.telemetry import subscriptions as subs
from kproxy.policies.telemetry.store import MAX_POINT_LABELS, MetricsStore

from ..otlp_samples import librdkafka_like_payload

LONG = "c" * 30_000


def test_bounded_keeps_short_values_and_shortens_long_ones_distinctly() -> None:
    assert bounded("producer-1") == "producer-1"
    a, b = bounded(LONG + "a"), bounded(LONG + "b")
    assert len(a) == len(b) == MAX_LABEL_CHARS
    assert a != b and a == bounded(LONG + "a")
    assert a.startswith("c" * 200)


def test_connections_leave_nothing_keyed_by_client_id_behind() -> None:
    """The rebootstrap epoch lives on the connection, not in proxy-wide memory keyed by
    (source, client id): once connections with huge client ids close, nothing of them
    stays in the state every connection shares."""
    import gc
    import tracemalloc

    from kproxy.codecs.peek import peek_request
    from kproxy.policies.addressing import PortMap
    from kproxy.policies.connection import ConnectionState
    from kproxy.policies.handlers import standard_handlers
    from kproxy.policies.proxy_state import ProxyState

    from ..support import encode_request

    state = ProxyState(PortMap("proxy.local", 30000, 30000, 0, 1023))
    handlers = standard_handlers()
    body = {"topics": [], "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False}
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(500):
        conn = ConnectionState(state, handlers, "bootstrap", None, ("10.0.0.1", i))
        frame = encode_request(3, 12, i, body, client_id=f"{i}-{LONG}")[4:]
        conn.request(peek_request(frame), memoryview(frame))
        del conn, frame
    gc.collect()
    retained = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert retained < 500 * 1_000, f"{retained} bytes retained for 500 closed connections"


def test_the_log_limiter_remembers_few_keys_and_log_lines_stay_short(caplog: object) -> None:
    limiter = RateLimitedLog(interval=60, max_keys=100)
    for i in range(2_000):
        limiter(logging.DEBUG, f"decode:{i}:{LONG}", "m")
    assert len(limiter) == 100
    record = logging.LogRecord("kproxy", logging.INFO, __file__, 1, "m", None, None)
    record.fields = {"client_id": LONG, "n": 3}
    for formatter in (JsonFormatter(), TextFormatter()):
        assert len(formatter.format(record)) < 1_000
    assert json.loads(JsonFormatter().format(record))["n"] == 3


def _attrs(client_id: str) -> dict[str, str]:
    return {"client_id": client_id, "client_software_name": LONG,
            "client_software_version": LONG, "client_source_address": "10.0.0.1",
            "client_source_port": "1"}


def test_telemetry_instances_are_bounded_in_bytes_with_attributes_shortened() -> None:
    settings = subs.TelemetrySettings(max_instances=100_000, max_instance_bytes=512 * 1024)
    state = t.TelemetryState(settings)
    for i in range(2_000):
        got = state.get_subscriptions(uuid.UUID(int=0), _attrs(f"{i}-{LONG}"), 10**9)
        assert got.error_code == 0
    assert state.instance_bytes <= settings.max_instance_bytes
    assert 100 < len(state.instances) < 2_000
    assert all(len(v) <= MAX_LABEL_CHARS for inst in state.instances.values()
               for v in inst.attrs.values())
    assert state.instance_bytes == sum(inst.size for inst in state.instances.values())
    assert state.evicted == {"instances": 0, "bytes": 2_000 - len(state.instances)}


def _push_with(name: str, attributes: dict[str, otlp.AttrValue],
               points: int = 1) -> list[otlp.ResourceMetrics]:
    metric = otlp.Metric(name, "d" * 10_000, "u" * 1_000, "gauge", points=[
        otlp.NumberPoint({**attributes, "i": i}, 0, 0, 1.0) for i in range(points)])
    return [otlp.ResourceMetrics({}, [otlp.ScopeMetrics("s", "1", [metric])])]


def test_series_and_families_are_bounded_and_families_go_with_their_series() -> None:
    store = MetricsStore(max_series=1_000_000, max_series_bytes=256 * 1024, max_families=50)
    ids = [uuid.uuid4() for _ in range(200)]
    for n, instance in enumerate(ids):
        stats = store.ingest(instance, _attrs(LONG), _push_with(
            f"{n}.{LONG}", {"topic": LONG, **{f"a{k}": k for k in range(40)}}, points=3), False)
        if not stats.dropped_families:  # topic, a0..a39 and i: 42 attributes per point
            assert stats.labels_dropped == 3 * (42 - MAX_POINT_LABELS)
    assert store.bytes <= 256 * 1024
    assert len(store.families) <= 50
    for family in store.families.values():
        assert len(family.name) <= 210 and len(family.help) <= 512 and len(family.unit) <= 64
    for _, rows in store.snapshot():
        for labels, _ in rows:
            assert all(len(v) <= MAX_LABEL_CHARS for _, v in labels)
    for instance in ids:
        store.forget(instance)
    assert (store.total, store.bytes, store.families) == (0, 0, {})


def test_metric_points_dropped_by_the_byte_bound_are_counted() -> None:
    store = MetricsStore(max_series_bytes=10_000)
    stats = store.ingest(uuid.uuid4(), _attrs("c"), _push_with("m", {}, points=100), False)
    assert stats.points + stats.dropped_by_bytes == 100 and stats.dropped_by_bytes > 50


def test_made_up_api_keys_share_one_metrics_label() -> None:
    metrics = ProxyMetrics()
    for key in range(1_000, 3_000):
        metrics.api(key).request(10)
    assert metrics.api(30_000) is metrics.api(1_000)
    assert metrics.apis.labels() == {"unknown"}
    assert metrics.api(1_000).requests == 2_000


def test_the_archive_queue_is_bounded_in_bytes_and_records_are_shortened(
        tmp_path: Path) -> None:
    writer = ArchiveWriter(ArchiveSettings(tmp_path, queue_records=100_000,
                                           queue_bytes=200_000)).start()
    writer.stall()  # a disk that does not keep up
    try:
        for i in range(1_000):
            writer.connection({"client_id": f"{i}-{LONG}",
                               "apis": {f"Unknown{k}": 1 for k in range(1_000)}})
        raw = librdkafka_like_payload()
        for _ in range(1_000):
            writer.telemetry_payload(raw, {"client.id": "x"})
        assert writer.stats.bytes_queued <= 200_000
        assert writer.stats.dropped["connections"] > 0 and writer.stats.dropped["telemetry"] > 0
    finally:
        writer.resume()
        writer.close()
    lines = [json.loads(line) for p in (tmp_path / "connections").rglob("*.jsonl")
             for line in p.read_text().splitlines()]
    assert lines and all(len(r["client_id"]) <= 256 and len(r["apis"]) <= 128 for r in lines)
    pushes = [json.loads(line) for p in (tmp_path / "telemetry").rglob("*.jsonl")
              for line in p.read_text().splitlines()]
    assert pushes and all("resourceMetrics" in p for p in pushes)
    assert writer.stats.bytes_queued == 0
