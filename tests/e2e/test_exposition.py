"""/metrics: what the sliced exposition writes, what it costs the relay, and label bounds.

The large test fills a kproxy subprocess with 250,000 client telemetry series the way
a fleet would (real GetTelemetrySubscriptions and PushTelemetry requests, see
tests/scrape_load.py), then compares a real producer's delivery latency without and
with back-to-back scrapes, in one run.
"""

from __future__ import annotations

import gc
import gzip
import math
import os
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as om_generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families as text_parse
from prometheus_client.utils import floatToGoString

from kproxy.codecs import api_keys
from kproxy.codecs.otlp.model import decode_metrics_data
from kproxy.embedded_broker import TansuBroker
from kproxy.metrics.exposition import Exposition, value_text
from kproxy.metrics.proxy_metrics import ProxyMetrics
from kproxy.runtime.server import Proxy
from kproxy.telemetry.exposition import ClientMetricsCollector
from kproxy.telemetry.service import TelemetryService

from ..otlp_samples import librdkafka_like_payload
from ..scrape_load import fill_series, metric_value, relay_cost
from ..support import http_get, kproxy_process, make_config

# ----------------------------------------------------------------------------- rendering


def _filled_service(instances: int, points: int) -> tuple[ProxyMetrics, TelemetryService]:
    cfg = make_config("127.0.0.1:1", telemetry_max_series=instances * (points + 2))
    metrics = ProxyMetrics()
    service = TelemetryService(cfg.telemetry, metrics)
    resources = decode_metrics_data(librdkafka_like_payload(points=points))
    for i in range(instances):
        iid = uuid.UUID(int=i + 1)
        tricky = 'id "quoted" \\ back\nslash' if i % 7 == 0 else f"client-{i}"
        service.store.ingest(iid, {"client_instance_id": str(iid), "client_id": tricky,
                                   "client_software_name": "librdkafka",
                                   "client_software_version": "2.16.1"}, resources, False)
    return metrics, service


class _Whole:
    """The reference: every series in one Metric per family, rendered in one go."""

    def __init__(self, collector: ClientMetricsCollector) -> None:
        self.collector = collector

    def collect(self) -> Iterator[Metric]:
        store = self.collector.service.store
        for family, rows in store.snapshot():
            metric = Metric(family.name, family.help, family.kind, family.unit)
            for labels, series in rows:
                lab = dict(labels)
                if family.kind == "counter":
                    metric.add_sample(family.name + "_total", lab, series.value)
                elif family.kind == "gauge":
                    metric.add_sample(family.name, lab, series.value)
                else:
                    for le, count in series.cumulative_buckets():
                        metric.add_sample(family.name + "_bucket", {**lab, "le": le}, count)
                    metric.add_sample(family.name + "_count", lab, series.count)
                    metric.add_sample(family.name + "_sum", lab, series.sum)
            yield metric


def _samples(text: str, openmetrics: bool) -> set[tuple[str, frozenset[tuple[str, str]], float]]:
    parse = om_parse if openmetrics else text_parse
    return {(s.name, frozenset(s.labels.items()), s.value)
            for family in parse(text) if family.name.startswith("org_apache_kafka")
            for s in family.samples}


async def test_sliced_exposition_matches_prometheus_client() -> None:
    metrics, _ = _filled_service(instances=300, points=20)
    collector = next(s for s in metrics.piece_sources if isinstance(s, ClientMetricsCollector))
    reference = CollectorRegistry()
    reference.register(_Whole(collector))
    exposition = Exposition(metrics.registry, metrics.piece_sources)
    for openmetrics in (False, True):
        for compress in (False, True):
            headers = {}
            if openmetrics:
                headers["accept"] = "application/openmetrics-text; version=1.0.0"
            if compress:
                headers["accept-encoding"] = "gzip"
            resp = await exposition.response(headers)
            body = b"".join(resp.parts or [resp.body])
            text = (gzip.decompress(body) if compress else body).decode()
            want = (om_generate_latest(reference) if openmetrics  # type: ignore[no-untyped-call]
                    else generate_latest(reference)).decode()
            got = _samples(text, openmetrics)
            assert got == _samples(want, openmetrics)
            assert len(got) == 300 * (1 + 20 + 5)  # counter, 20 gauges, histogram lines
            assert text.count("# TYPE org_apache_kafka_producer_record_queue_time ") == 1
            assert text.endswith("# EOF\n") == openmetrics


def test_value_text_is_prometheus_float_text() -> None:
    values = [0.0, -0.0, 1.0, 0.1, 1e-7, 3.14159, 999_999.9, 1e6, 1_234_567.0, 2.0**53,
              1e16, 1e300, -1.5, -5e6, -1e300, math.inf, -math.inf, math.nan]
    assert [value_text(v) for v in values] == [
        floatToGoString(v) for v in values]  # type: ignore[no-untyped-call]


async def test_label_text_is_kept_and_a_scrape_reads_as_the_first() -> None:
    metrics, service = _filled_service(instances=30, points=5)
    exposition = Exposition(metrics.registry, metrics.piece_sources)

    async def client_lines() -> list[str]:
        body = b"".join((await exposition.response({})).parts or [])
        return [ln for ln in body.decode().splitlines() if ln.startswith("org_apache")]

    first = await client_lines()
    assert all(len(own.heads) == len(own.slot_of) and all(own.heads)
               for own in service.store.series.values())
    assert await client_lines() == first
    assert gc.isenabled(), "a scrape left the garbage collector paused"
    iid = uuid.UUID(int=1000)  # a new instance: its series get their text in this scrape
    service.store.max_series *= 2
    service.store.ingest(iid, {"client_instance_id": str(iid), "client_id": 'new "one"',
                               "client_software_name": "librdkafka",
                               "client_software_version": "2.16.1"},
                         decode_metrics_data(librdkafka_like_payload(points=5)), False)
    again = await client_lines()
    assert set(first) < set(again) and len(again) == len(first) * 31 // 30
    assert f'client_instance_id="{iid}",client_id="new \\"one\\""' in "\n".join(again)


async def test_concurrent_scrapes_share_one_production() -> None:
    metrics, _ = _filled_service(instances=200, points=50)
    exposition = Exposition(metrics.registry, metrics.piece_sources)
    bodies: list[bytes] = []

    async def one() -> None:
        resp = await exposition.response({})
        bodies.append(b"".join(resp.parts or [resp.body]))

    async with trio.open_nursery() as n:
        for _ in range(4):
            n.start_soon(one)
    assert len(bodies) == 4 and len(set(bodies)) == 1
    scrapes = exposition.scrapes._value.get()
    assert scrapes == 1, "concurrent scrapes of one format were produced separately"


# ----------------------------------------------------------------------------- label bounds


def _unknown_api_frames(keys: range) -> bytes:
    out = []
    for key in keys:  # request header v2 (keys outside the table are flexible from v0)
        body = struct.pack(">hhih", key, 0, 1, -1) + b"\x00"
        out.append(struct.pack(">i", len(body)) + body)
    return b"".join(out)


async def test_unknown_api_flood_keeps_metrics_small(nursery: trio.Nursery,
                                                     tansu: TansuBroker) -> None:
    proxy = Proxy(make_config(tansu.bootstrap, max_connections_per_source=1000))
    await nursery.start(lambda task_status: proxy.run(handle_signals=False,
                                                      task_status=task_status))
    assert proxy.bootstrap_port is not None and proxy.http_port is not None
    sent = 0
    for start in range(100, 20_100, 1000):  # 20,000 distinct keys outside the table
        stream = await trio.open_tcp_stream("127.0.0.1", proxy.bootstrap_port)
        await stream.send_all(_unknown_api_frames(range(start, start + 1000)))
        sent += 1000
        with trio.move_on_after(10):  # the broker closes such connections
            while await stream.receive_some(65536):
                pass
        await stream.aclose()
    text = ""
    with trio.fail_after(60):
        while True:
            _, _, body = await http_get(proxy.http_port, "/metrics")
            text = body.decode()
            line = [ln for ln in text.splitlines()
                    if ln.startswith('kproxy_requests_total{api="unknown"}')]
            if line and float(line[0].rsplit(" ", 1)[1]) >= 1000:
                break
            await trio.sleep(0.1)
    assert len(body) < 1_000_000, f"/metrics grew to {len(body):,} bytes"
    apis = {ln.split('api="', 1)[1].split('"', 1)[0] for ln in text.splitlines()
            if ln.startswith("kproxy_requests_total{")}
    assert apis <= {*(name for name, _ in api_keys.API_KEYS.values()), "unknown"}
    assert not any("Unknown" in ln for ln in text.splitlines() if not ln.startswith("#"))
    proxy.shutdown()


# ----------------------------------------------------------------------------- cost


def test_scrape_of_250k_series_does_not_stall_a_producer(tmp_path: Path,
                                                         tansu: TansuBroker) -> None:
    """Scrapes of 250,000 series beside a producer: no request waits for a scrape.

    The producer runs in a process of its own throughout, and its latency is compared
    in alternating windows, without scrapes and with scrapes back to back, round by
    round (``tests/scrape_load.relay_cost``); meanwhile the proxy has a core of its
    own, the broker, the producer and the scraper the other (``cores_apart``).
    Asserted is what holds whatever the machine's load: the scrape never holds the
    event loop for more than some milliseconds of CPU (it used to hold it for the
    whole scrape), and no delivery waits for a whole scrape (the slowest is a small
    part of the shortest scrape).

    The issue's target, the producer's p99 during scrapes within 2x of without, is
    printed, not asserted: it is a verdict of the machine's load. On a quiet machine,
    proxy apart, it read 1.00 to 1.43, and 1.03 to 1.31 beside two processes busy half
    the time; but in a fresh-clone `make test`, with the other lane's tests sharing
    the proxy's core, it read 3.16 (rounds 4.4, 4.1, 2.2 and 1.8): a scrape's fifth of
    a core then comes out of what the relay would have had. `make bench` measures it
    on a machine kept for it (docs/benchmarks.md), both with the cores shared and
    with the proxy apart.
    """
    from confluent_kafka.admin import AdminClient, NewTopic

    assert len(os.sched_getaffinity(0)) >= 2, "this measurement needs two usable CPUs"
    # One worker: what is measured is one process's event loop, on a core of its own
    # (a pid is pinned); the supervisor's merge at two workers is measured in
    # `make bench`, which compares the scrape at one and at two workers.
    with kproxy_process(tansu.bootstrap, tmp_path, "--workers", "1",
                        "--telemetry-max-series", "250000",
                        "--telemetry-max-series-bytes", str(512 << 20),
                        "--log-level", "warning") as kp:
        fill_series(kp.bootstrap, 1000, 250)  # 1,000 instances x 250 series
        assert metric_value(kp.http_port, "kproxy_telemetry_series") == 250_000
        admin = AdminClient({"bootstrap.servers": kp.bootstrap})
        admin.create_topics([NewTopic("scrape-lat", num_partitions=1)])["scrape-lat"].result(30)
        assert tansu.process is not None
        cost = relay_cost(kp.bootstrap, kp.http_port, "scrape-lat", rounds=4, window=2.0,
                          rate=500, proxy_pid=kp.process.pid, broker_pid=tansu.process.pid)
        print(cost.summary())
        assert cost.cores_apart
        assert cost.scrapes, "no scrape finished while the producer ran"
        assert max(cost.held_cpu) < 0.02, "a scrape held the event loop for tens of ms on end"
        # No request waited for a whole scrape: the slowest delivery is a small part of
        # the shortest scrape (the scrape used to hold every connection from end to end).
        assert cost.slowest < min(cost.scrapes) / 4
