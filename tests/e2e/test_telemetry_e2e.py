"""Real librdkafka clients push telemetry through a real `kproxy run`; a real Prometheus
server scrapes the proxy. Every push compression librdkafka offers is decoded."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kproxy.embedded_broker import TansuBroker, wait_for_port

from ..support import KproxyProcess, free_port, kproxy_process

pytestmark = pytest.mark.broker
SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>.*)\} (?P<value>\S+)$')


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    with TansuBroker(log_path=tmp_path_factory.mktemp("tansu") / "tansu.log") as broker:
        yield broker


def telemetry_config(tmp_path: Path) -> Path:
    path = tmp_path / "kproxy.toml"
    path.write_text('[[telemetry.subscriptions]]\nname = "all"\nmetrics = ["*"]\n'
                    "interval_ms = 1000\n")
    return path


def client_samples(kp: KproxyProcess, prefix: str) -> dict[tuple[str, str], float]:
    _, text = kp.http_get("/metrics")
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and m["name"].startswith(prefix):
            out[(m["name"], m["labels"])] = float(m["value"])
    return out


def produce_for(producer: object, topic: str, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        producer.produce(topic, b"v" * 200)  # type: ignore[attr-defined]
        producer.poll(0.02)  # type: ignore[attr-defined]


def wait_for(predicate: Callable[[], object], timeout: float,
             step: Callable[[], object] | None = None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if step is not None:
            step()
        if predicate():
            return True
        if step is None:
            time.sleep(0.2)
    return False


def test_librdkafka_producer_and_consumer_metrics(backend: TansuBroker, tmp_path: Path) -> None:
    from confluent_kafka import Consumer, Producer

    topic = f"tel-{uuid.uuid4().hex[:6]}"
    archive = tmp_path / "archive"
    with kproxy_process(backend.bootstrap, tmp_path, "--config",
                        str(telemetry_config(tmp_path)), "--archive", str(archive)) as kp:
        producer = Producer({"bootstrap.servers": kp.bootstrap, "linger.ms": 5})
        consumer = Consumer({"bootstrap.servers": kp.bootstrap, "group.id": topic,
                             "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
        consumer.subscribe([topic])
        try:
            def traffic() -> None:
                produce_for(producer, topic, 0.5)
                consumer.poll(0.1)

            assert wait_for(lambda: client_samples(kp, "org_apache_kafka_consumer_")
                            and client_samples(kp, "org_apache_kafka_producer_"), 40, traffic)
            producer_series = client_samples(kp, "org_apache_kafka_producer_")
            labels = " ".join(lbl for _, lbl in producer_series)
            assert 'client_software_name="confluent-kafka-python"' in labels
            instance_ids = set(re.findall(r'client_instance_id="([0-9a-f-]{36})"', labels))
            assert len(instance_ids) == 1 and uuid.UUID(instance_ids.pop()).int != 0
            assert 'node_id="111"' in labels  # librdkafka's int attribute keeps its value

            # The values move as traffic flows.
            before = producer_series
            assert wait_for(lambda: client_samples(kp, "org_apache_kafka_producer_") != before,
                            20, traffic)
            _, own = kp.http_get("/metrics")
            assert 'kproxy_telemetry_pushes_decoded_total{compression="zstd"}' in own
            assert re.search(r'kproxy_requests_total\{api="PushTelemetry"\} [1-9]', own)
        finally:
            consumer.close()
            producer.flush(5)
    # The archive, completed on shutdown: OTLP JSON lines enriched with what the proxy
    # knows of the client, and one inventory record per connection.
    lines = [json.loads(line) for p in archive.glob("telemetry/date=*/hour=*/part-*.jsonl")
             for line in p.read_text().splitlines()]
    assert lines and all("resourceMetrics" in x for x in lines)
    keys = {kv["key"] for x in lines for rm in x["resourceMetrics"]
            for kv in rm["resource"]["attributes"]}
    assert {"client.instance.id", "client.software.name", "client.id"} <= keys
    conns = [json.loads(line) for p in archive.glob("connections/date=*/hour=*/part-*.jsonl")
             for line in p.read_text().splitlines()]
    # Which of a client's connections carries its telemetry, and whether that one also
    # sent Metadata, is librdkafka's timing: check each record against its own APIs.
    assert any(c["telemetry"] for c in conns) and any(c["supports_metadata_v13"] for c in conns)
    for c in conns:
        apis = c["apis"]
        assert c["telemetry"] == ("PushTelemetry" in apis or "GetTelemetrySubscriptions" in apis)
        assert c["supports_metadata_v13"] == (None if "Metadata" not in apis
                                              else apis["Metadata"] >= 13)
    assert not list(archive.rglob(".*.tmp"))


@pytest.mark.parametrize("codec", ["lz4", "gzip", "snappy"])
def test_every_push_compression_is_decoded(backend: TansuBroker, tmp_path: Path,
                                           codec: str) -> None:
    from confluent_kafka import Producer

    # librdkafka uses the first type in the broker's accepted list that it supports.
    with kproxy_process(backend.bootstrap, tmp_path, "--config", str(telemetry_config(tmp_path)),
                        "--telemetry-compression-types", codec) as kp:
        producer = Producer({"bootstrap.servers": kp.bootstrap, "linger.ms": 5})
        topic = f"tel-{codec}"
        needle = f'kproxy_telemetry_pushes_decoded_total{{compression="{codec}"}}'
        assert wait_for(lambda: needle in kp.http_get("/metrics")[1]
                        and client_samples(kp, "org_apache_kafka_producer_"), 30,
                        lambda: produce_for(producer, topic, 0.5))
        _, text = kp.http_get("/metrics")
        assert 'error="invalid_record"' not in text
        producer.flush(5)


def test_real_prometheus_scrapes_client_metrics(backend: TansuBroker, tmp_path: Path) -> None:
    from confluent_kafka import Producer

    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed: `make test` installs it (Debian package)"
    with kproxy_process(backend.bootstrap, tmp_path, "--config",
                        str(telemetry_config(tmp_path))) as kp:
        port = free_port()
        (tmp_path / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n"
            "scrape_configs:\n  - job_name: kproxy\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{kp.http_port}']\n")
        with open(tmp_path / "prometheus.log", "wb") as prom_log:
            prom = subprocess.Popen(
                [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}"],
                stdout=subprocess.DEVNULL, stderr=prom_log)
        try:
            assert wait_for_port("127.0.0.1", port, 30)
            producer = Producer({"bootstrap.servers": kp.bootstrap, "linger.ms": 5})

            def query(q: str) -> list[dict[str, object]]:
                url = f"http://127.0.0.1:{port}/api/v1/query?query={urllib.parse.quote(q)}"
                with urllib.request.urlopen(url, timeout=5) as resp:
                    return list(json.load(resp)["data"]["result"])

            q = '{__name__=~"org_apache_kafka_producer_.+", client_software_name!=""}'
            assert wait_for(lambda: query(q), 60,
                            lambda: produce_for(producer, "prom-topic", 0.5))
            result = query(q)
            assert all(r["metric"]["job"] == "kproxy" for r in result)  # type: ignore[index]
            assert {r["metric"]["client_software_name"] for r in result} == {  # type: ignore[index]
                "confluent-kafka-python"}
            assert query('kproxy_requests_total{api="Produce"}')
            # Every panel of the shipped Grafana dashboard is a valid query over these
            # series, and the main ones show data.
            dashboard = json.loads((Path(__file__).resolve().parents[2] / "deploy" /
                                    "grafana" / "kproxy-dashboard.json").read_text())
            panels = {p["title"]: [t["expr"].replace("$__rate_interval", "1m")
                                   .replace("$group", ".*")  # the variable's "All"
                                   for t in p["targets"]] for p in dashboard["panels"]}
            must_show = ("Requests per second by API", "Request latency through the proxy, "
                         "p99 by API", "Client connections by listener",
                         "Top clients by producer request latency (avg, ms)")
            assert wait_for(lambda: all(query(e) for t in must_show for e in panels[t]), 30,
                            lambda: produce_for(producer, "prom-topic", 0.5))
            for exprs in panels.values():
                for expr in exprs:
                    query(expr)  # raises on a query Prometheus rejects
            producer.flush(5)
        finally:
            prom.terminate()
            prom.wait(10)
