"""TLS on both sides, SNI routing and SASL pass-through, with certificates made by the test.

Clients are real (confluent-kafka, kafka-python) and so is the broker (tansu)
wherever it can be; the SASL broker and the broker-side TLS terminator are named
stand-ins (see fake_broker.py and tls_front.py for why).
"""

from __future__ import annotations

import logging
import socket
import ssl
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme

from kproxy.codecs import api_keys
from kproxy.codecs.messages import decode_response
from kproxy.embedded_broker import TansuBroker
from kproxy.runtime.server import Proxy

from ..fake_broker import FakeBroker
from ..support import RawClient, encode_request, free_port, http_get, make_config, value_of
from ..tls_front import serve_tls_front

TOPIC_MESSAGES = 50


@dataclass
class Pki:
    ca: trustme.CA
    ca_file: Path
    cert: Path  # server certificate: localhost, 127.0.0.1, *.kafka.test
    key: Path
    client_cert: Path
    client_key: Path
    other_ca_file: Path  # a CA that signed nothing here

    def client_context(self, with_cert: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        if with_cert:
            ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        return ctx


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1", "*.kafka.test")
    client = ca.issue_cert("client-1@example.test")
    paths = {name: tmp_path / f"{name}.pem" for name in
             ("ca", "cert", "key", "client_cert", "client_key", "other_ca")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    server.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    server.private_key_pem.write_to_path(str(paths["key"]))
    client.cert_chain_pems[0].write_to_path(str(paths["client_cert"]))
    client.private_key_pem.write_to_path(str(paths["client_key"]))
    trustme.CA().cert_pem.write_to_path(str(paths["other_ca"]))
    return Pki(ca, paths["ca"], paths["cert"], paths["key"], paths["client_cert"],
               paths["client_key"], paths["other_ca"])


async def start_proxy(nursery: trio.Nursery, upstream: str, **overrides: Any) -> Proxy:
    proxy = Proxy(make_config(upstream, **overrides))
    started: Proxy = await nursery.start(lambda task_status: proxy.run(
        handle_signals=False, task_status=task_status))
    return started


def round_trip(conf: dict[str, Any], topic: str, n: int = TOPIC_MESSAGES) -> list[bytes]:
    """Produce n messages with confluent-kafka, then read partition 0 back to its end."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    producer = Producer({**conf, "acks": "all"})
    for i in range(n):
        producer.produce(topic, f"m{i}".encode(), partition=0)
    assert producer.flush(30) == 0, "messages left undelivered"
    consumer = Consumer({**conf, "group.id": "unused", "enable.partition.eof": True,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    try:
        for _ in range(200):
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if (error := msg.error()) is not None:
                if error.code() == -191:  # partition EOF
                    break
                continue
            got.append(value_of(msg))
    finally:
        consumer.close()
    return got


async def metric(proxy: Proxy, name: str) -> float:
    assert proxy.http_port is not None
    _, _, body = await http_get(proxy.http_port, "/metrics")
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def closed_by_proxy(client: RawClient, timeout: float = 5) -> bool:
    with trio.move_on_after(timeout):
        try:
            return await client.read_frame(timeout) is None
        except (trio.BrokenResourceError, ssl.SSLError):
            return True
    return False


def tls_raw(stream: trio.SocketStream, ctx: ssl.SSLContext, name: str) -> RawClient:
    client = RawClient(stream)
    client.stream = trio.SSLStream(stream, ctx, server_hostname=name)  # type: ignore[assignment]
    return client


API_VERSIONS_V3 = {"client_software_name": "kproxy-test", "client_software_version": "1"}


# ----------------------------------------------------------------------------- TLS to clients


async def test_tls_clients_produce_and_consume_through_the_proxy(
        nursery: trio.Nursery, tansu: TansuBroker, pki: Pki) -> None:
    proxy = await start_proxy(nursery, tansu.bootstrap, tls_cert=pki.cert, tls_key=pki.key)
    conf = {"bootstrap.servers": f"127.0.0.1:{proxy.bootstrap_port}",
            "security.protocol": "SSL", "ssl.ca.location": str(pki.ca_file)}
    got = await trio.to_thread.run_sync(round_trip, conf, "tls-topic")
    assert got == [f"m{i}".encode() for i in range(TOPIC_MESSAGES)]
    # A plaintext client on the TLS port gets nowhere, and the failure is counted.
    assert proxy.bootstrap_port is not None
    raw = await RawClient.connect(proxy.bootstrap_port)
    await raw.send(encode_request(api_keys.API_VERSIONS, 3, 1, API_VERSIONS_V3))
    assert await closed_by_proxy(raw)
    assert await metric(proxy, "kproxy_tls_handshake_failures_total") >= 1


async def test_a_virtual_cluster_serves_tls_with_the_proxy_certificate(
        nursery: trio.Nursery, tansu: TansuBroker, pki: Pki, tmp_path: Path) -> None:
    """A virtual cluster's bootstrap and broker listeners take the proxy's TLS settings."""
    from ..support import broker_port_base

    port, base = free_port(), broker_port_base()
    config = tmp_path / "kproxy.toml"
    config.write_text(f'[[virtual_clusters]]\nname = "vc"\nlisten = "127.0.0.1:{port}"\n'
                      f'broker_port_base = {base}\nprefix = "tls."\n')
    proxy = Proxy(make_config(tansu.bootstrap, config, tls_cert=pki.cert, tls_key=pki.key))
    await nursery.start(lambda task_status: proxy.run(handle_signals=False,
                                                      task_status=task_status))
    conf = {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SSL",
            "ssl.ca.location": str(pki.ca_file)}
    got = await trio.to_thread.run_sync(round_trip, conf, "vc-topic", 5)
    assert got == [f"m{i}".encode() for i in range(5)]
    assert "tls.vc-topic" in await trio.to_thread.run_sync(tansu_topics, tansu)


def tansu_topics(tansu: TansuBroker) -> set[str]:
    from confluent_kafka.admin import AdminClient

    return set(AdminClient({"bootstrap.servers": tansu.bootstrap}).list_topics(timeout=10)
               .topics)


async def test_mutual_tls_requires_a_certificate_from_the_trusted_ca(
        nursery: trio.Nursery, tansu: TansuBroker, pki: Pki) -> None:
    proxy = await start_proxy(nursery, tansu.bootstrap, tls_cert=pki.cert, tls_key=pki.key,
                              tls_client_ca=pki.ca_file, tls_client_auth="required")
    assert proxy.bootstrap_port is not None
    without = tls_raw(await trio.open_tcp_stream("127.0.0.1", proxy.bootstrap_port),
                      pki.client_context(), "localhost")
    # Under TLS 1.3 the client's handshake ends before the server checks its
    # certificate; the refusal arrives on the first read.
    await without.send(encode_request(api_keys.API_VERSIONS, 3, 1, API_VERSIONS_V3))
    assert await closed_by_proxy(without)
    conf = {"bootstrap.servers": f"127.0.0.1:{proxy.bootstrap_port}",
            "security.protocol": "SSL", "ssl.ca.location": str(pki.ca_file),
            "ssl.certificate.location": str(pki.client_cert),
            "ssl.key.location": str(pki.client_key)}
    got = await trio.to_thread.run_sync(round_trip, conf, "mtls-topic", 5)
    assert len(got) == 5
    assert await metric(proxy, "kproxy_tls_handshake_failures_total") >= 1


async def test_tls_handshake_timeout_closes_a_silent_connection(
        nursery: trio.Nursery, tansu: TansuBroker, pki: Pki) -> None:
    proxy = await start_proxy(nursery, tansu.bootstrap, tls_cert=pki.cert, tls_key=pki.key,
                              tls_handshake_timeout="0.5")
    assert proxy.bootstrap_port is not None
    silent = await RawClient.connect(proxy.bootstrap_port)
    assert await closed_by_proxy(silent, 5)
    assert await metric(proxy, 'kproxy_limit_hits_total{limit="tls_handshake_timeout"}') == 1


def test_unreadable_certificate_is_a_clear_start_error(tmp_path: Path, pki: Pki) -> None:
    from kproxy.config.settings import ConfigError

    bad = tmp_path / "not-a-cert.pem"
    bad.write_text("hello")
    with pytest.raises(ConfigError, match="tls_cert: cannot load"):
        Proxy(make_config("127.0.0.1:1", tls_cert=bad, tls_key=pki.key))
    with pytest.raises(ConfigError, match="set both or neither"):
        make_config("127.0.0.1:1", tls_cert=pki.cert)
    with pytest.raises(ConfigError, match="upstream_tls_ca: cannot load"):
        Proxy(make_config("127.0.0.1:1", upstream_tls="on", upstream_tls_ca=bad))


# ----------------------------------------------------------------------------- TLS to brokers


async def tls_fronted_tansu(nursery: trio.Nursery, tmp_path: Path, cert: trustme.LeafCert,
                            ) -> TansuBroker:
    """tansu that advertises a TLS terminator's port: every broker address is TLS."""
    front_port = free_port()
    broker = TansuBroker(advertised=f"127.0.0.1:{front_port}",
                         log_path=tmp_path / "tansu.log").start()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert.configure_cert(ctx)
    await nursery.start(serve_tls_front, ctx, ("127.0.0.1", broker.port), front_port)
    broker.advertised = f"127.0.0.1:{front_port}"
    return broker


async def test_upstream_tls_verifies_the_broker_and_relays(
        nursery: trio.Nursery, tmp_path: Path, pki: Pki) -> None:
    broker = await tls_fronted_tansu(nursery, tmp_path, pki.ca.issue_cert("127.0.0.1"))
    try:
        upstream = broker.advertised or ""
        proxy = await start_proxy(nursery, upstream, upstream_tls="on",
                                  upstream_tls_ca=pki.ca_file)
        assert proxy.ready()[0], proxy.ready()[1]
        conf = {"bootstrap.servers": f"127.0.0.1:{proxy.bootstrap_port}"}
        got = await trio.to_thread.run_sync(round_trip, conf, "upstream-tls", 20)
        assert len(got) == 20
        # A proxy that trusts another CA refuses the same broker.
        wrong = await start_proxy(nursery, upstream, upstream_tls="on",
                                  upstream_tls_ca=pki.other_ca_file, connect_timeout="2")
        assert not wrong.ready()[0]
    finally:
        broker.stop()


async def test_upstream_hostname_is_verified_unless_turned_off(
        nursery: trio.Nursery, tmp_path: Path, pki: Pki,
        caplog: pytest.LogCaptureFixture) -> None:
    broker = await tls_fronted_tansu(nursery, tmp_path, pki.ca.issue_cert("other.example"))
    try:
        upstream = broker.advertised or ""
        with caplog.at_level(logging.WARNING, logger="kproxy"):
            strict = await start_proxy(nursery, upstream, upstream_tls="on",
                                       upstream_tls_ca=pki.ca_file)
        assert not strict.ready()[0]
        assert any("IP address mismatch" in str(getattr(r, "fields", "")) or
                   "mismatch" in str(getattr(r, "fields", "")) for r in caplog.records), \
            [getattr(r, "fields", r.getMessage()) for r in caplog.records]
        lax = await start_proxy(nursery, upstream, upstream_tls="on",
                                upstream_tls_ca=pki.ca_file,
                                upstream_tls_verify_hostname="off")
        assert lax.ready()[0], lax.ready()[1]
    finally:
        broker.stop()


# ----------------------------------------------------------------------------- SNI routing


@pytest.fixture
def kafka_test_resolves_to_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Names under .kafka.test resolve to 127.0.0.1 in this process (a client-side stub
    resolver: the machine's DNS cannot be changed by a test)."""
    real: Callable[..., Any] = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(".kafka.test"):
            host = "127.0.0.1"
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


async def test_sni_routes_one_tls_port_to_every_broker(
        nursery: trio.Nursery, tansu: TansuBroker, pki: Pki,
        kafka_test_resolves_to_loopback: None) -> None:
    proxy = await start_proxy(nursery, tansu.bootstrap, tls_cert=pki.cert, tls_key=pki.key,
                              sni_host_pattern="broker-{node_id}.kafka.test",
                              advertised_host="bootstrap.kafka.test")
    port = proxy.bootstrap_port
    assert port is not None
    # Metadata names each broker by host name, all on the one port.
    raw = tls_raw(await trio.open_tcp_stream("127.0.0.1", port), pki.client_context(),
                  "bootstrap.kafka.test")
    resp = await raw.request(api_keys.METADATA, 12, 1, {
        "topics": [], "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False})
    assert [(b["node_id"], b["host"], b["port"]) for b in resp.body["brokers"]] == [
        (111, "broker-111.kafka.test", port)]
    assert proxy.listeners.scopes == {}  # no per-broker ports are opened
    # A real client reaches the broker through the name it was given.
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    def kafka_python_round_trip() -> list[bytes]:
        common = {"bootstrap_servers": f"bootstrap.kafka.test:{port}",
                  "security_protocol": "SSL", "ssl_cafile": str(pki.ca_file)}
        producer = KafkaProducer(**common, acks="all")
        for i in range(10):
            producer.send("sni-topic", f"s{i}".encode(), partition=0)
        producer.flush(30)
        producer.close()
        consumer = KafkaConsumer(**common, enable_auto_commit=False,
                                 consumer_timeout_ms=5000)
        consumer.assign([TopicPartition("sni-topic", 0)])
        consumer.seek(TopicPartition("sni-topic", 0), 0)
        values = [m.value for m in consumer]
        consumer.close()
        return values

    got = await trio.to_thread.run_sync(kafka_python_round_trip)
    assert got == [f"s{i}".encode() for i in range(10)]
    assert await metric(
        proxy, 'kproxy_client_connections_accepted_total{listener="broker-111"}') >= 1
    # A name for a broker that does not exist is refused, not sent to some broker.
    unknown = tls_raw(await trio.open_tcp_stream("127.0.0.1", port), pki.client_context(),
                      "broker-999.kafka.test")
    await unknown.send(encode_request(api_keys.API_VERSIONS, 3, 1, API_VERSIONS_V3))
    assert await closed_by_proxy(unknown)


# ----------------------------------------------------------------------------- SASL


SECRET = "pa55-w0rd-that-must-not-leak"
ZERO_ID = uuid.UUID(int=0)


async def test_sasl_passes_through_and_gates_local_telemetry(
        nursery: trio.Nursery, caplog: pytest.LogCaptureFixture) -> None:
    fake = await FakeBroker(node_ids=[111], sasl_users={"alice": SECRET}).start(nursery)
    with caplog.at_level(logging.DEBUG):
        proxy = await start_proxy(nursery, fake.bootstrap, require_sasl="on")
        port = proxy.bootstrap_port
        assert port is not None

        # Telemetry before authenticating: closed, as a SASL broker closes it.
        early = await RawClient.connect(port)
        await early.request(api_keys.API_VERSIONS, 3, 1, API_VERSIONS_V3)
        await early.send(encode_request(api_keys.GET_TELEMETRY_SUBSCRIPTIONS, 0, 2, {
            "client_instance_id": ZERO_ID}))
        assert await closed_by_proxy(early)
        assert await metric(proxy, "kproxy_unauthenticated_requests_total") == 1

        # After SaslHandshake v1 + SaslAuthenticate, the proxy answers it.
        client = await RawClient.connect(port)
        hs = await client.request(api_keys.SASL_HANDSHAKE, 1, 1, {"mechanism": "PLAIN"})
        assert hs.body["error_code"] == 0
        auth = await client.request(api_keys.SASL_AUTHENTICATE, 2, 2, {
            "auth_bytes": f"\0alice\0{SECRET}".encode()})
        assert auth.body["error_code"] == 0
        await client.send(encode_request(api_keys.GET_TELEMETRY_SUBSCRIPTIONS, 0, 3, {
            "client_instance_id": ZERO_ID}))
        frame = await client.read_frame()
        assert frame is not None
        subs = decode_response(frame, api_keys.GET_TELEMETRY_SUBSCRIPTIONS, 0)
        assert subs.body["error_code"] == 0 and subs.body["push_interval_ms"] > 0

        # A real client authenticates through the proxy; a wrong password does not.
        def list_topics(password: str) -> int:
            from confluent_kafka.admin import AdminClient

            admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}",
                                 "security.protocol": "SASL_PLAINTEXT",
                                 "sasl.mechanism": "PLAIN", "sasl.username": "alice",
                                 "sasl.password": password})
            try:
                return len(admin.list_topics(timeout=5).brokers)
            except Exception:
                return -1

        assert await trio.to_thread.run_sync(list_topics, SECRET) == 1
        assert await trio.to_thread.run_sync(list_topics, "wrong-" + SECRET) == -1
        assert fake.authenticated.count("alice") >= 2
        assert proxy.http_port is not None
        _, _, metrics_text = await http_get(proxy.http_port, "/metrics")
    logged = "\n".join(f"{r.getMessage()} {getattr(r, 'fields', '')}" for r in caplog.records)
    assert logged, "nothing was logged at DEBUG"
    assert SECRET not in logged and SECRET.encode() not in metrics_text


async def test_without_require_sasl_telemetry_is_answered_before_authentication(
        nursery: trio.Nursery) -> None:
    fake = await FakeBroker(node_ids=[111], sasl_users={"alice": SECRET}).start(nursery)
    proxy = await start_proxy(nursery, fake.bootstrap)
    assert proxy.bootstrap_port is not None
    client = await RawClient.connect(proxy.bootstrap_port)
    resp = await client.request(api_keys.GET_TELEMETRY_SUBSCRIPTIONS, 0, 1, {
        "client_instance_id": ZERO_ID})
    assert resp.body["error_code"] == 0


async def test_sasl_handshake_v0_is_refused_with_a_clear_log(
        nursery: trio.Nursery, caplog: pytest.LogCaptureFixture) -> None:
    fake = await FakeBroker(node_ids=[111], sasl_users={"alice": SECRET}).start(nursery)
    proxy = await start_proxy(nursery, fake.bootstrap)
    assert proxy.bootstrap_port is not None
    client = await RawClient.connect(proxy.bootstrap_port)
    with caplog.at_level(logging.WARNING, logger="kproxy"):
        await client.send(encode_request(api_keys.SASL_HANDSHAKE, 0, 1, {"mechanism": "PLAIN"}))
        assert await closed_by_proxy(client)
    assert any("SaslHandshake v0" in r.getMessage() for r in caplog.records)


async def test_a_client_certificate_names_the_principal_in_the_audit_log(
        nursery: trio.Nursery, tansu: TansuBroker, pki: Pki, tmp_path: Path) -> None:
    import json
    audit = tmp_path / "audit.log"
    proxy = await start_proxy(nursery, tansu.bootstrap, tls_cert=pki.cert, tls_key=pki.key,
                              tls_client_ca=pki.ca_file, tls_client_auth="required",
                              audit_log=audit)
    conf = {"bootstrap.servers": f"127.0.0.1:{proxy.bootstrap_port}",
            "security.protocol": "SSL", "ssl.ca.location": str(pki.ca_file),
            "ssl.certificate.location": str(pki.client_cert),
            "ssl.key.location": str(pki.client_key)}
    assert len(await trio.to_thread.run_sync(round_trip, conf, "mtls-principal", 1)) == 1
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    logins = [r for r in records if r["mechanism"] == "mTLS"]
    assert logins and all(r["outcome"] == "ok" and r["source"].startswith("127.0.0.1:")
                          for r in logins)
    assert "O=trustme" in logins[0]["principal"]
