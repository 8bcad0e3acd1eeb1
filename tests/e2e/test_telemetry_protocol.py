"""Telemetry at the protocol level, through the in-process proxy, with a raw client.

Every error path of PushTelemetry, the hold after a refused push, the ApiVersions
advertisement, and the series cap and expiry with many synthetic clients. The
upstream is FakeBroker (named fake): telemetry requests must never reach it.
"""

from __future__ import annotations

import gzip
import uuid
from pathlib import Path

import pytest
import trio

from kproxy.codecs import api_keys, compression
from kproxy.codecs.messages import decode_response
from kproxy.codecs.peek import peek_correlation_id
from kproxy.runtime.server import Proxy

from ..fake_broker import FakeBroker
from ..otlp_samples import librdkafka_like_payload
from ..support import RawClient, encode_request, http_get, make_config

PAYLOAD = librdkafka_like_payload()


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeBroker:
    return await FakeBroker(node_ids=[0]).start(nursery)


async def start(nursery: trio.Nursery, fake: FakeBroker, tmp_path: Path, interval_ms: int = 200,
                **overrides: object) -> Proxy:
    cfg_file = tmp_path / "kproxy.toml"
    cfg_file.write_text(f'[[telemetry.subscriptions]]\nname = "all"\nmetrics = ["*"]\n'
                        f'interval_ms = {interval_ms}\n')
    proxy = Proxy(make_config(fake.bootstrap, cfg_file, node_id_range="0-0",
                              **overrides))
    started: Proxy = await nursery.start(lambda task_status: proxy.run(
        handle_signals=False, task_status=task_status))
    return started


class TelemetryClient:
    def __init__(self, client: RawClient) -> None:
        self.client = client
        self.cid = 0
        self.instance = uuid.UUID(int=0)
        self.sub = 0

    async def get(self) -> dict[str, object]:
        self.cid += 1
        resp = await self.client.request(71, 0, self.cid, {"client_instance_id": self.instance})
        body = resp.body
        if body["error_code"] == 0:
            self.instance = body["client_instance_id"]
            self.sub = body["subscription_id"]
        return body

    async def push(self, payload: bytes | None = None, ctype: int = 4, *,
                   terminating: bool = False, sub: int | None = None,
                   instance: uuid.UUID | None = None) -> int:
        self.cid += 1
        data = compression.compress(ctype, PAYLOAD) if payload is None else payload
        resp = await self.client.request(72, 0, self.cid, {
            "client_instance_id": self.instance if instance is None else instance,
            "subscription_id": self.sub if sub is None else sub,
            "terminating": terminating, "compression_type": ctype, "metrics": data})
        return int(resp.body["error_code"])


async def connect(proxy: Proxy) -> TelemetryClient:
    client = await RawClient.connect(proxy.bootstrap_port or 0)
    await client.request(api_keys.API_VERSIONS, 3, 1000, {
        "client_software_name": "raw-test", "client_software_version": "9.9"})
    return TelemetryClient(client)


async def test_api_versions_advertises_71_and_72_together(nursery: trio.Nursery,
                                                          fake: FakeBroker, tmp_path: Path) -> None:
    proxy = await start(nursery, fake, tmp_path)
    client = await RawClient.connect(proxy.bootstrap_port or 0)
    resp = await client.request(api_keys.API_VERSIONS, 3, 1, {
        "client_software_name": "t", "client_software_version": "1"})
    keys = {e["api_key"]: (e["min_version"], e["max_version"]) for e in resp.body["api_keys"]}
    assert keys[71] == (0, 0) and keys[72] == (0, 0)
    proxy.shutdown()


async def test_get_then_push_exports_labelled_series(nursery: trio.Nursery, fake: FakeBroker,
                                                     tmp_path: Path) -> None:
    proxy = await start(nursery, fake, tmp_path)
    tc = await connect(proxy)
    body = await tc.get()
    assert body["error_code"] == 0 and tc.instance.int != 0
    assert body["requested_metrics"] == ["*"] and body["push_interval_ms"] == 200
    assert body["accepted_compression_types"] == [4, 3, 1, 2]
    assert body["telemetry_max_bytes"] == 1024 * 1024 and body["delta_temporality"] is False
    assert await tc.push() == 0
    status, headers, text = await http_get(proxy.http_port or 0, "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    line = next(x for x in text.decode().splitlines()
                if x.startswith("org_apache_kafka_producer_node_request_latency_avg{"))
    assert f'client_instance_id="{tc.instance}"' in line
    assert 'client_software_name="raw-test"' in line and 'node_id="1"' in text.decode()
    assert not any(r[0] in (71, 72) for r in fake.requests)  # never forwarded
    # OpenMetrics when asked, gzip when accepted.
    status, headers, om = await http_get(proxy.http_port or 0, "/metrics", {
        "accept": "application/openmetrics-text; version=1.0.0",
        "accept-encoding": "gzip"})
    assert headers["content-type"].startswith("application/openmetrics-text")
    assert headers["content-encoding"] == "gzip"
    assert gzip.decompress(om).rstrip().endswith(b"# EOF")
    proxy.shutdown()


async def test_every_push_error_path(nursery: trio.Nursery, fake: FakeBroker,
                                     tmp_path: Path) -> None:
    """A broker's rules, one after the other on one connection: kproxy's own hold after
    a refused push is off here (tested below), or the pushes after the first 87 would
    all meet it."""
    proxy = await start(nursery, fake, tmp_path, telemetry_max_bytes=4096,
                        telemetry_max_decompressed_bytes=65536,
                        telemetry_refused_push_hold_ms=0)
    tc = await connect(proxy)
    await tc.get()
    assert await tc.push() == 0  # first push right after the Get: accepted
    assert await tc.push() == 89  # early push: THROTTLING_QUOTA_EXCEEDED
    await trio.sleep(0.25)
    assert await tc.push(sub=tc.sub ^ 1) == 117  # stale subscription id
    await trio.sleep(0.25)
    assert await tc.push(b"", ctype=9) == 76  # compression type 9
    await trio.sleep(0.25)
    assert await tc.push(b"x" * 4097, ctype=0) == 118  # over TelemetryMaxBytes
    await trio.sleep(0.25)
    assert await tc.push(b"\x28\xb5\x2f\xfd\x00corrupt", ctype=4) == 87  # corrupt zstd
    await trio.sleep(0.25)
    bomb = compression.compress(4, bytes(10 * 1024 * 1024))
    assert len(bomb) < 4096
    assert await tc.push(bomb, ctype=4) == 87  # decompression bomb
    await trio.sleep(0.25)
    assert await tc.push(compression.compress(3, b"not protobuf at all" * 3), ctype=3) == 87
    assert await tc.push(instance=uuid.UUID(int=0)) == 42  # zero instance id
    # Terminating: accepted once even inside the interval, then refused.
    await trio.sleep(0.25)
    assert await tc.push(ctype=1) == 0
    assert await tc.push(terminating=True, ctype=2) == 0
    assert await tc.push(terminating=True, ctype=2) == 42
    _, _, text = await http_get(proxy.http_port or 0, "/metrics")
    for outcome, n in (("throttling_quota_exceeded", 1), ("unknown_subscription_id", 1),
                       ("unsupported_compression_type", 1), ("telemetry_too_large", 1),
                       ("invalid_record", 3), ("invalid_request", 2), ("none", 3)):
        assert (f'kproxy_telemetry_requests_total{{api="PushTelemetry",error="{outcome}"}} '
                f"{float(n)}") in text.decode()
    proxy.shutdown()


async def test_after_a_refused_push_the_connections_telemetry_is_held_in_order(
        nursery: trio.Nursery, fake: FakeBroker, tmp_path: Path) -> None:
    """Default settings: after a push refused as INVALID_RECORD, the same connection's
    next push waits out the hold (1 s) and is refused as THROTTLING_QUOTA_EXCEEDED; a
    Metadata request sent right behind it is answered after it (answers leave in
    order); another connection's telemetry is answered meanwhile."""
    proxy = await start(nursery, fake, tmp_path)
    tc, other = await connect(proxy), await connect(proxy)
    await tc.get()
    assert await tc.push(b"\x28\xb5\x2f\xfd\x00corrupt", ctype=4) == 87
    refused_at = trio.current_time()
    await tc.client.send(
        encode_request(72, 0, 50, {"client_instance_id": tc.instance, "subscription_id": tc.sub,
                                   "terminating": False, "compression_type": 4,
                                   "metrics": compression.compress(4, PAYLOAD)})
        + encode_request(api_keys.METADATA, 12, 51, {
            "topics": [], "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False}))
    assert (await other.get())["error_code"] == 0  # not held: another connection
    frames = [await tc.client.read_frame(30) for _ in range(2)]
    assert [peek_correlation_id(f) for f in frames if f is not None] == [50, 51]
    assert frames[0] is not None
    held = decode_response(frames[0], 72, 0).body
    assert held["error_code"] == 89 and 0 < held["throttle_time_ms"] <= 1000
    assert trio.current_time() - refused_at >= held["throttle_time_ms"] / 1000 - 0.002
    assert (await tc.get())["error_code"] == 0  # the hold is out: served again
    _, _, text = await http_get(proxy.http_port or 0, "/metrics")
    assert 'kproxy_telemetry_requests_held_total{api="PushTelemetry"} 1.0' in text.decode()
    proxy.shutdown()


async def test_sighup_style_reload_makes_the_subscription_stale(
        nursery: trio.Nursery, fake: FakeBroker, tmp_path: Path) -> None:
    proxy = await start(nursery, fake, tmp_path)
    tc = await connect(proxy)
    await tc.get()
    assert await tc.push() == 0
    cfg_file = tmp_path / "kproxy.toml"
    cfg_file.write_text('[[telemetry.subscriptions]]\nmetrics = ["org.apache.kafka.producer."]'
                        "\ninterval_ms = 200\n")
    proxy.reload_config = lambda: make_config(fake.bootstrap, cfg_file,
                                              node_id_range="0-0")
    assert await proxy.reload()
    await trio.sleep(0.25)
    assert await tc.push() == 117  # the client must fetch again...
    body = await tc.get()  # ...and may do so at once
    assert body["error_code"] == 0 and body["requested_metrics"] == ["org.apache.kafka.producer."]
    cfg_file.write_text("[[telemetry.subscriptions]]\ninterval_ms = 5\n")  # invalid
    assert not await proxy.reload()
    assert proxy.config.telemetry.settings.subscriptions[0].metrics == (
        "org.apache.kafka.producer.",)
    proxy.shutdown()


async def test_many_clients_cap_and_expiry(nursery: trio.Nursery, fake: FakeBroker,
                                           tmp_path: Path) -> None:
    proxy = await start(nursery, fake, tmp_path, telemetry_max_series=300)
    assert proxy.telemetry is not None
    now = [1_000_000]
    proxy.telemetry.clock_ms = lambda: now[0]
    clients = []
    # Each push holds 5 series (1 counter, 3 gauges by node.id, 1 histogram): 100
    # synthetic clients want 500, the cap is 300, so the last 40 clients are dropped.
    for _ in range(100):
        tc = await connect(proxy)
        await tc.get()
        assert await tc.push() == 0
        clients.append(tc)
    _, _, text = await http_get(proxy.http_port or 0, "/metrics")
    lines = text.decode().splitlines()
    client_series = [x for x in lines if x.startswith("org_apache_kafka_")]
    # 60 clients x (1 counter + 3 gauges + a histogram's 3 buckets, _count and _sum).
    assert len(client_series) == 60 * 9
    assert "kproxy_telemetry_series 300.0" in lines
    dropped = next(x for x in lines if x.startswith("kproxy_telemetry_points_dropped_total"))
    assert float(dropped.split()[-1]) == 40 * 7  # 3 sum + 3 gauge + 1 histogram points each
    # Nobody pushes for max(60 s, 3 x interval): every client's series vanish.
    now[0] += 60_001
    _, _, text = await http_get(proxy.http_port or 0, "/metrics")
    assert not [x for x in text.decode().splitlines() if x.startswith("org_apache_kafka_")]
    assert "kproxy_telemetry_client_instances 0.0" in text.decode()
    proxy.shutdown()


async def test_malformed_and_oversized_http_requests_get_4xx(
        nursery: trio.Nursery, fake: FakeBroker, tmp_path: Path) -> None:
    proxy = await start(nursery, fake, tmp_path)
    port = proxy.http_port or 0
    assert (await http_get(port, "/nope"))[0] == 404
    assert (await http_get(port, "", raw=b"NOT HTTP AT ALL\r\n\r\n"))[0] == 400
    huge = b"GET /metrics HTTP/1.1\r\nhost: t\r\nx-pad: " + b"a" * 70_000 + b"\r\n\r\n"
    assert (await http_get(port, "", raw=huge))[0] in (400, 431)
    assert (await http_get(port, "/healthz"))[0] == 200
    proxy.shutdown()


async def test_telemetry_off_forwards_71_and_72_untouched(nursery: trio.Nursery,
                                                          tmp_path: Path) -> None:
    from kproxy.embedded_broker import TansuBroker

    broker = TansuBroker(log_path=tmp_path / "tansu.log").start()
    try:
        proxy = Proxy(make_config(broker.bootstrap, telemetry="off"))
        await nursery.start(lambda task_status: proxy.run(handle_signals=False,
                                                          task_status=task_status))
        assert proxy.telemetry is None
        client = await RawClient.connect(proxy.bootstrap_port or 0)
        resp = await client.request(api_keys.API_VERSIONS, 3, 1, {
            "client_software_name": "t", "client_software_version": "1"})
        keys = {e["api_key"] for e in resp.body["api_keys"]}
        assert 71 in keys and 72 not in keys  # as tansu says: it advertises 71 only
        # The request goes to the broker, and its answer comes back as it is.
        got = await client.request(71, 0, 2, {"client_instance_id": uuid.UUID(int=0)})
        assert got.header.correlation_id == 2
        _, _, text = await http_get(proxy.http_port or 0, "/metrics")
        assert b"kproxy_telemetry_requests_total{" not in text
        await client.aclose()
        proxy.shutdown()
    finally:
        broker.stop()
