"""OTLP export end to end: a real librdkafka client (confluent-kafka) pushes telemetry
through a real `kproxy run` in front of a real tansu broker; the proxy forwards it to a
fake OTLP collector (tests/fake_otlp_collector.py: no collector binary can be installed
here). The exported requests are checked field by field against the pushes the proxy's
archive recorded; then the collector misbehaves (503 then 200, hangs, is absent)."""

from __future__ import annotations

import json
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from google.protobuf import json_format, text_format
from opentelemetry.proto.metrics.v1 import metrics_pb2

from kproxy.embedded_broker import TansuBroker

from ..fake_otlp_collector import FakeCollector, fake_collector
from ..support import KproxyProcess, free_port, kproxy_process

pytestmark = pytest.mark.broker
SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?P<labels>.*)\})? (?P<value>\S+)$')
PROXY_KEYS = {"client.instance.id", "client.id", "client.software.name",
              "client.software.version", "client.source.address", "client.source.port",
              "kproxy.host", "kproxy.version", "kafka.cluster.id"}


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    with TansuBroker(log_path=tmp_path_factory.mktemp("tansu") / "tansu.log") as broker:
        yield broker


def config(tmp_path: Path, endpoint: str, interval_ms: int = 500, extra: str = "",
           otlp: str = "", batch_age: float = 0.2) -> Path:
    path = tmp_path / "kproxy.toml"
    path.write_text(f"[telemetry]\n{extra}\n[telemetry.otlp]\nendpoint = \"{endpoint}\"\n"
                    f"max_batch_age = {batch_age}\n{otlp}\n"
                    f"[[telemetry.subscriptions]]\nname = \"all\"\nmetrics = [\"*\"]\n"
                    f"interval_ms = {interval_ms}\n")
    return path


def value(kp: KproxyProcess, name: str, **labels: str) -> float:
    """One sample of the proxy's /metrics (0 when absent)."""
    _, text = kp.http_get("/metrics")
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and m["name"] == name and ",".join(sorted((m["labels"] or "").split(","))) == want:
            return float(m["value"])
    return 0.0


def wait_for(predicate: Callable[[], object], timeout: float,
             step: Callable[[], None] | None = None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if step is not None:
            step()
        else:
            time.sleep(0.2)
        if predicate():
            return True
    return False


class Traffic:
    """A confluent-kafka producer through the proxy, timing each message's delivery."""

    def __init__(self, bootstrap: str, client_id: str) -> None:
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id,
                                  "linger.ms": 0, "acks": 1})
        self.topic = f"otlp-{uuid.uuid4().hex[:6]}"
        self.latencies: list[float] = []
        self.errors: list[str] = []

    def run(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sent = time.monotonic()

            def done(err: object, _msg: object, sent: float = sent) -> None:
                if err is not None:
                    self.errors.append(str(err))
                else:
                    self.latencies.append(time.monotonic() - sent)

            self.producer.produce(self.topic, b"v" * 100, on_delivery=done)
            self.producer.poll(0.02)

    def p99(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]

    def close(self) -> None:
        self.producer.flush(10)


def attrs(rm: metrics_pb2.ResourceMetrics) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in rm.resource.attributes}


def exported(fake: FakeCollector) -> list[metrics_pb2.ResourceMetrics]:
    return [rm for r in fake.snapshot() for rm in r.request.resource_metrics]


def test_export_matches_what_librdkafka_pushed(backend: TansuBroker, tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    with fake_collector() as fake, kproxy_process(
            backend.bootstrap, tmp_path, "--config",
            str(config(tmp_path, fake.url, extra="delta_temporality = true", batch_age=2.5,
                       otlp='compression = "none"\n[telemetry.otlp.headers]\n'
                       'authorization = "Bearer t0ken"')),
            "--archive", str(archive)) as kp:
        traffic = Traffic(kp.bootstrap, "otlp-e2e")
        try:
            assert wait_for(lambda: len(exported(fake)) >= 3, 60, lambda: traffic.run(0.5)), \
                kp.log()
            # Prometheus keeps working beside the export.
            _, text = kp.http_get("/metrics")
            assert "org_apache_kafka_producer_" in text
            # counted once the answer is back (the fake records a request before answering)
            assert wait_for(lambda: value(kp, "kproxy_telemetry_export_total",
                                          outcome="exported") >= 3, 30)
        finally:
            traffic.close()
    received = fake.snapshot()
    first = received[0]
    # The request as the fake collector decoded it, for a person to read.
    decoded = text_format.MessageToString(first.request)
    (tmp_path / "exported-request.txt").write_text(decoded)
    Path("/tmp/kproxy-otlp-request.txt").write_text(decoded)
    assert first.path == "/v1/metrics" and first.answered == 200
    assert first.headers["content-type"] == "application/x-protobuf"
    assert first.headers["authorization"] == "Bearer t0ken"
    # Pushes every 0.5 s wait up to 2.5 s for company: requests carry several.
    assert max(len(r.request.resource_metrics) for r in received) >= 2
    assert "content-encoding" not in first.headers

    # What the client pushed, as the proxy's archive recorded it (completed on shutdown).
    pushed: list[metrics_pb2.ResourceMetrics] = []
    for part in archive.glob("telemetry/date=*/hour=*/part-*.jsonl"):
        for line in part.read_text().splitlines():
            data = json_format.Parse(line, metrics_pb2.MetricsData())
            pushed.extend(data.resource_metrics)
    assert pushed
    sent = exported(fake)
    instance_ids = {attrs(rm)["client.instance.id"] for rm in sent}
    assert len(instance_ids) == 1 and uuid.UUID(instance_ids.pop()).int != 0
    for rm in sent:
        a = attrs(rm)
        assert a["client.id"] == "otlp-e2e"
        assert a["client.software.name"] == "confluent-kafka-python"
        assert a["client.software.version"]
        assert a["client.source.address"] == "127.0.0.1" and int(a["client.source.port"]) > 0
        assert a["kproxy.host"] == socket.gethostname() and a["kproxy.version"]
        assert a["kafka.cluster.id"]
    # Field by field: every exported resource equals one archived push, metrics untouched.
    archived = {m.SerializeToString(deterministic=True): m for m in pushed}
    matched = 0
    for rm in sent:
        scopes = b"".join(s.SerializeToString(deterministic=True) for s in rm.scope_metrics)
        twins = [p for p in archived.values() if b"".join(
            s.SerializeToString(deterministic=True) for s in p.scope_metrics) == scopes]
        assert twins, "an exported resource matches no pushed one"
        twin = twins[0]
        client_sent = {k: v for k, v in attrs(twin).items() if k not in PROXY_KEYS
                       and not k.startswith("kproxy.")}
        assert client_sent.items() <= attrs(rm).items()  # the client's own attributes kept
        assert attrs(twin)["client.instance.id"] == attrs(rm)["client.instance.id"]
        matched += 1
    assert matched == len(sent) >= 3
    metrics = [m for rm in sent for s in rm.scope_metrics for m in s.metrics]
    names = {m.name for m in metrics}
    assert any(n.startswith("org.apache.kafka.producer.") for n in names), names
    sums = [m for m in metrics if m.WhichOneof("data") == "sum"]
    assert sums and all(m.sum.aggregation_temporality == 1 for m in sums)  # delta, as pushed
    points = [p for m in sums for p in m.sum.data_points]
    assert points and all(p.time_unix_nano > 0 for p in points)


def test_collector_503_then_200_is_retried(backend: TansuBroker, tmp_path: Path) -> None:
    with fake_collector(script=[503], retry_after="1") as fake, kproxy_process(
            backend.bootstrap, tmp_path, "--config",
            str(config(tmp_path, fake.url, extra="prometheus = false"))) as kp:
        traffic = Traffic(kp.bootstrap, "otlp-retry")
        try:
            assert wait_for(lambda: any(r.answered == 200 for r in fake.snapshot()), 60,
                            lambda: traffic.run(0.5)), kp.log()
            assert value(kp, "kproxy_telemetry_export_requests_total", result="5xx") == 1
            assert wait_for(lambda: value(kp, "kproxy_telemetry_export_total",
                                          outcome="exported") >= 1, 10)
            _, text = kp.http_get("/metrics")
            assert "org_apache_kafka_producer_" not in text  # Prometheus export switched off
        finally:
            traffic.close()
    first, second = fake.snapshot()[:2]
    assert (first.answered, second.answered) == (503, 200)
    assert first.body == second.body  # the same batch, sent again
    assert first.headers["content-encoding"] == "gzip"
    sums = [m for rm in second.request.resource_metrics for s in rm.scope_metrics
            for m in s.metrics if m.WhichOneof("data") == "sum"]
    assert sums and all(m.sum.aggregation_temporality == 2 for m in sums)  # cumulative


def test_hanging_collector_drops_pushes_and_never_slows_the_relay(
        backend: TansuBroker, tmp_path: Path) -> None:
    with fake_collector() as fake, kproxy_process(
            backend.bootstrap, tmp_path, "--config",
            str(config(tmp_path, fake.url, interval_ms=200,
                       otlp="timeout = 60\nmax_queue_bytes = 8192\nmax_batch_bytes = 4096"))
    ) as kp:
        traffic = Traffic(kp.bootstrap, "otlp-hang")
        try:
            assert wait_for(lambda: fake.snapshot(), 60, lambda: traffic.run(0.5)), kp.log()
            traffic.latencies.clear()
            traffic.run(6)  # baseline: the collector answers
            healthy, healthy_n = traffic.p99(), len(traffic.latencies)
            fake.default = "hang"
            hung_at = len(fake.snapshot())
            assert wait_for(lambda: len(fake.snapshot()) > hung_at, 30,
                            lambda: traffic.run(0.5))
            pushes_before = value(kp, "kproxy_telemetry_requests_total", api="PushTelemetry",
                                  error="none")
            traffic.latencies.clear()
            assert wait_for(lambda: value(kp, "kproxy_telemetry_export_total",
                                          outcome="dropped_queue_full") >= 1, 60,
                            lambda: traffic.run(1))
            traffic.run(6)  # the collector hangs on its request; the queue is full
            hung, hung_n = traffic.p99(), len(traffic.latencies)
            assert value(kp, "kproxy_telemetry_requests_total", api="PushTelemetry",
                         error="none") > pushes_before  # pushes still answered and accepted
            assert value(kp, "kproxy_telemetry_export_queue_bytes") <= 8192
        finally:
            traffic.close()
    assert not traffic.errors
    print(f"producer p99 through kproxy: collector answering {healthy * 1000:.1f} ms "
          f"({healthy_n} messages), collector hanging {hung * 1000:.1f} ms ({hung_n})")
    assert healthy_n > 50 and hung_n > 50
    # A push answer that waited for the collector would hold its connection (the one the
    # producer uses) for up to the 60 s timeout: the producer's p99 would be seconds.
    assert hung <= 3 * healthy + 0.1, (healthy, hung)


def test_absent_collector_counts_failures(backend: TansuBroker, tmp_path: Path) -> None:
    port = free_port()  # nothing listens there: connection refused
    with kproxy_process(backend.bootstrap, tmp_path, "--config",
                        str(config(tmp_path, f"http://127.0.0.1:{port}/v1/metrics",
                                   otlp="max_retry_time = 1.5"))) as kp:
        traffic = Traffic(kp.bootstrap, "otlp-absent")
        try:
            assert wait_for(lambda: value(kp, "kproxy_telemetry_export_total",
                                          outcome="dropped_failed") >= 1, 60,
                            lambda: traffic.run(0.5)), kp.log()
            assert value(kp, "kproxy_telemetry_export_requests_total", result="no_answer") >= 2
            assert value(kp, "kproxy_telemetry_export_total", outcome="exported") == 0
            _, status = kp.http_get("/status.json")
            otlp = json.loads(status)["telemetry"]["otlp"]
            assert otlp["outcomes"]["dropped_failed"] >= 1
        finally:
            traffic.close()
        assert "OTLP export gave up" in kp.log()
    assert traffic.latencies and not traffic.errors


def test_https_collector_with_client_certificate(backend: TansuBroker, tmp_path: Path) -> None:
    """TLS to the collector: its certificate verified against tls_ca, ours presented."""
    import ssl

    import trustme

    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    ca.configure_trust(server)
    server.verify_mode = ssl.CERT_REQUIRED  # mTLS: the proxy must present a certificate
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    client = ca.issue_cert("kproxy.test")
    client.cert_chain_pems[0].write_to_path(str(tmp_path / "client.pem"))
    client.private_key_pem.write_to_path(str(tmp_path / "client.key"))
    with fake_collector(tls=server) as fake, kproxy_process(
            backend.bootstrap, tmp_path, "--config", str(config(
                tmp_path, fake.url, otlp=f'tls_ca = "{tmp_path / "ca.pem"}"\n'
                f'tls_cert = "{tmp_path / "client.pem"}"\n'
                f'tls_key = "{tmp_path / "client.key"}"'))) as kp:
        traffic = Traffic(kp.bootstrap, "otlp-tls")
        try:
            assert wait_for(lambda: value(kp, "kproxy_telemetry_export_total",
                                          outcome="exported") >= 1, 60,
                            lambda: traffic.run(0.5)), kp.log()
        finally:
            traffic.close()
    assert fake.url.startswith("https://") and exported(fake)
    names = {tuple(name) for cert in fake.peer_certs
             for name in cert.get("subjectAltName", ())}
    assert ("DNS", "kproxy.test") in names  # the proxy's client certificate


def test_unreadable_collector_ca_stops_start_up(backend: TansuBroker, tmp_path: Path) -> None:
    import subprocess
    import sys

    cfg = config(tmp_path, "https://127.0.0.1:1/v1/metrics",
                 otlp=f'tls_ca = "{tmp_path / "missing.pem"}"')
    proc = subprocess.run([sys.executable, "-m", "kproxy.cli", "run", "--upstream",
                           backend.bootstrap, "--config", str(cfg), "--listen",
                           f"127.0.0.1:{free_port()}", "--http", f"127.0.0.1:{free_port()}",
                           "--node-id-range", "111-111"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "telemetry.otlp.tls_ca: cannot load" in proc.stderr
