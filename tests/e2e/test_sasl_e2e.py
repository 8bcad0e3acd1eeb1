"""SASL terminated at a running `kproxy run` (two workers) in front of a tansu broker
with no authentication: confluent-kafka and kafka-python log in with PLAIN and SCRAM;
a wrong password, a request before login and a malformed SaslAuthenticate are refused
while others go on; SIGHUP reloads the users file; the audit log records it all with no
secret; the HTTP port's admin token and status_auth hold; start-up refuses --admin on
beyond loopback without a token."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import scramp

from kproxy.codecs import api_keys
from kproxy.codecs.error_codes import ErrorCode
from kproxy.codecs.messages import decode_response
from kproxy.embedded_broker import TansuBroker

from ..support import (
    KproxyProcess,
    audit_records,
    broker_port_base,
    encode_request,
    free_port,
    kproxy_process,
    wait_until,
)

pytestmark = pytest.mark.broker
TOKEN = "test-admin-token-0123456789"
USERS = """
[users.alice]
password = "alice-secret"
[users.svc]
password = "svc-secret"
"""


@pytest.fixture(scope="module")
def proxy(shared_tansu: TansuBroker,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KproxyProcess, Path]]:
    tmp = tmp_path_factory.mktemp("sasl")
    (tmp / "users.toml").write_text(USERS)
    token = tmp / "admin.token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    vc_port, vc_base = free_port(), broker_port_base()
    (tmp / "kproxy.toml").write_text(f"""
audit_log = "{tmp / 'audit.log'}"
admin = true
admin_token_file = "{token}"
status_auth = true
[sasl]
terminate = true
mechanisms = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
users_file = "{tmp / 'users.toml'}"
failed_login_delay = 0.3
[[virtual_clusters]]
name = "tenant"
listen = "127.0.0.1:{vc_port}"
broker_port_base = {vc_base}
prefix = "tenant."
""")
    with kproxy_process(shared_tansu.bootstrap, tmp, "--config", str(tmp / "kproxy.toml")) as kp:
        yield kp, tmp




def _ck(kp: KproxyProcess, mechanism: str, user: str, password: str,
        **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": kp.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password,
            **extra}


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_confluent_kafka_logs_in_and_produces(proxy: tuple[KproxyProcess, Path],
                                              mechanism: str) -> None:
    from confluent_kafka import Producer
    kp, tmp = proxy
    topic = f"sasl-{uuid.uuid4().hex[:8]}"
    producer = Producer(_ck(kp, mechanism, "alice", "alice-secret"))
    delivered: list[Any] = []
    producer.produce(topic, b"hello", on_delivery=lambda err, msg: delivered.append(err))
    producer.flush(30)
    assert delivered == [None]
    wait_until(lambda: any(r["event"] == "login" and r["outcome"] == "ok"
                           and r["mechanism"] == mechanism and r["principal"] == "alice"
                           for r in audit_records(tmp)))


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kafka_python_logs_in(proxy: tuple[KproxyProcess, Path], mechanism: str) -> None:
    from kafka import KafkaProducer
    kp, tmp = proxy
    producer = KafkaProducer(bootstrap_servers=kp.bootstrap, security_protocol="SASL_PLAINTEXT",
                             sasl_mechanism=mechanism, sasl_plain_username="svc",
                             sasl_plain_password="svc-secret", request_timeout_ms=20000)
    try:
        producer.send(f"kp-{uuid.uuid4().hex[:8]}", b"v").get(timeout=30)
    finally:
        producer.close(5)
    wait_until(lambda: any(r["event"] == "login" and r["outcome"] == "ok"
                           and r["principal"] == "svc" and r["mechanism"] == mechanism
                           for r in audit_records(tmp)))


def test_wrong_password_is_refused_and_audited_without_it(
        proxy: tuple[KproxyProcess, Path]) -> None:
    from confluent_kafka import KafkaError, Producer
    kp, tmp = proxy
    errors: list[Any] = []
    producer = Producer(_ck(kp, "SCRAM-SHA-256", "alice", "guessed-wrong",
                            error_cb=errors.append))
    wait_until(lambda: any(e.code() == KafkaError._AUTHENTICATION for e in errors) or
               producer.poll(0.1))
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors)
    wait_until(lambda: any(r["outcome"] == "failed" and r["principal"] == "alice"
                           and r["mechanism"] == "SCRAM-SHA-256" and r["source"].startswith("127.")
                           for r in audit_records(tmp)))
    text = (tmp / "audit.log").read_text()
    assert "guessed-wrong" not in text and "alice-secret" not in text


def _raw(kp: KproxyProcess, *frames: bytes, port: int | None = None) -> bytes:
    """Send frames on a fresh connection; what comes back before the proxy closes it."""
    with socket.create_connection(("127.0.0.1", port or kp.bootstrap_port), timeout=10) as sock:
        for frame in frames:
            sock.sendall(frame)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        return data


def _frames(sock: socket.socket, count: int) -> list[bytes]:
    """The next ``count`` response frames (bodies) on a blocking socket."""
    data, frames = b"", list[bytes]()
    while len(frames) < count:
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            chunk = sock.recv(65536)
            assert chunk, "closed before the answer"
            data += chunk
        size = struct.unpack(">i", data[:4])[0]
        frames.append(data[4:4 + size])
        data = data[4 + size:]
    return frames


def _scram_salt(kp: KproxyProcess, name: str) -> tuple[bytes, int]:
    """A SCRAM-SHA-256 login as ``name`` with a wrong password, over a raw connection:
    the salt and iteration count the server-first message gave."""
    client = scramp.ScramClient(["SCRAM-SHA-256"], name, "not-the-password")
    with socket.create_connection(("127.0.0.1", kp.bootstrap_port), timeout=10) as sock:
        sock.sendall(encode_request(api_keys.SASL_HANDSHAKE, 1, 1, {"mechanism": "SCRAM-SHA-256"})
                     + encode_request(api_keys.SASL_AUTHENTICATE, 2, 2, {
                         "auth_bytes": client.get_client_first().encode()}))
        first = decode_response(_frames(sock, 2)[1], api_keys.SASL_AUTHENTICATE, 2).body
        assert first["error_code"] == 0
        client.set_server_first(first["auth_bytes"].decode())
        sock.sendall(encode_request(api_keys.SASL_AUTHENTICATE, 2, 3, {
            "auth_bytes": client.get_client_final().encode()}))
        final = decode_response(_frames(sock, 1)[0], api_keys.SASL_AUTHENTICATE, 2).body
        assert final["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED
    fields = dict(f.split("=", 1) for f in first["auth_bytes"].decode().split(","))
    return base64.b64decode(fields["s"]), int(fields["i"])


def _salts_from_every_worker(kp: KproxyProcess, tmp: Path, name: str) -> set[tuple[bytes, int]]:
    """What SCRAM server-first messages gave ``name`` over logins until both workers
    had answered one (told apart by the audit records' pids)."""
    seen = len(audit_records(tmp))
    salts: set[tuple[bytes, int]] = set()
    pids: set[int] = set()
    for _ in range(40):  # connections land on either worker; 40 misses one 1 in 10^11
        salts.add(_scram_salt(kp, name))
        pids = wait_until(lambda: {r["pid"] for r in audit_records(tmp)[seen:]
                                   if r.get("principal") == name})
        if len(pids) >= 2:
            return salts
    raise AssertionError(f"every login as {name} landed on one worker")


def test_a_scram_name_gets_one_salt_from_every_worker(
        proxy: tuple[KproxyProcess, Path]) -> None:
    """A SCRAM server-first message gives an unknown name a made-up salt, and a
    password user the salt of keys each worker derives on its own; were either made
    per worker, two logins landing on the two workers would see two salts for one
    name and one for the other, and tell the unknown name apart. Their shape is alike."""
    kp, tmp = proxy
    unknown, known = (_salts_from_every_worker(kp, tmp, name) for name in ("mallory", "alice"))
    assert len(unknown) == 1 and len(known) == 1
    ((salt, iterations),), ((known_salt, known_iterations),) = unknown, known
    assert (len(salt), iterations) == (len(known_salt), known_iterations)
    assert _scram_salt(kp, "trudy")[0] != salt


DERIVED = "derived the SCRAM keys of the users file's password users keys="


def test_every_worker_derives_password_keys_before_a_login(
        proxy: tuple[KproxyProcess, Path]) -> None:
    """Each worker derives the password users' SCRAM keys at start, in a thread, before
    it serves a login (two users, two SCRAM mechanisms: four keys each): none is
    derived at a first login, whose answer would then come a derivation later than an
    unknown name's."""
    kp, _ = proxy
    assert kp.log().count(DERIVED + "4 ") == len(kp.worker_pids()) >= 2, kp.log()[-3000:]


def test_requests_before_login_and_malformed_frames_are_refused(
        proxy: tuple[KproxyProcess, Path]) -> None:
    kp, _ = proxy
    # Metadata before any login: closed without an answer.
    assert _raw(kp, encode_request(api_keys.METADATA, 12, 1, {"topics": None,
                "allow_auto_topic_creation": False, "include_topic_authorized_operations":
                False})) == b""
    handshake = encode_request(api_keys.SASL_HANDSHAKE, 1, 1, {"mechanism": "PLAIN"})
    # A SaslAuthenticate whose body is cut short: a handshake answer, then a refusal.
    cut = encode_request(api_keys.SASL_AUTHENTICATE, 1, 2, {"auth_bytes": b"\0a\0b"})[:-3]
    cut = struct.pack(">i", len(cut) - 4) + cut[4:]
    started = time.monotonic()
    answers = _raw(kp, handshake, cut)
    assert time.monotonic() - started >= 0.25  # the failed-login delay
    assert answers.count(struct.pack(">i", 2)) == 1  # the refusal to correlation id 2
    # An oversized token: refused the same way.
    big = encode_request(api_keys.SASL_AUTHENTICATE, 1, 2, {"auth_bytes": b"\0a\0" + b"x" * 70000})
    assert struct.pack(">i", 2) in _raw(kp, handshake, big)
    # Everyone else is served meanwhile.
    test_confluent_kafka_logs_in_and_produces(proxy, "PLAIN")


def test_a_virtual_cluster_listener_needs_a_login_too(
        proxy: tuple[KproxyProcess, Path]) -> None:
    """A tenant's listener is no way around logging in: nothing before a login, and a
    client that logs in there produces into the tenant's own topic."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    kp, tmp = proxy
    vc = int(re.search(r'listen = "127.0.0.1:(\d+)"',
                       (tmp / "kproxy.toml").read_text()).group(1))  # type: ignore[union-attr]
    assert _raw(kp, encode_request(api_keys.METADATA, 12, 1, {
        "topics": None, "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False}), port=vc) == b""
    topic = f"vc-sasl-{uuid.uuid4().hex[:8]}"
    producer = Producer(_ck(kp, "SCRAM-SHA-256", "alice", "alice-secret",
                            **{"bootstrap.servers": f"127.0.0.1:{vc}"}))
    failed: list[object] = []

    def report(err: object, _msg: object) -> None:
        if err:
            failed.append(err)
    producer.produce(topic, b"x", on_delivery=report)
    assert producer.flush(30) == 0 and not failed, failed
    # On the backend the topic carries the tenant's prefix.
    admin = AdminClient(_ck(kp, "PLAIN", "alice", "alice-secret"))
    assert f"tenant.{topic}" in admin.list_topics(timeout=20).topics


def test_sighup_reloads_the_users_file(proxy: tuple[KproxyProcess, Path]) -> None:
    from confluent_kafka.admin import AdminClient
    kp, tmp = proxy
    (tmp / "users.toml").write_text(USERS + '[users.carol]\npassword = "carol-secret"\n')
    kp.process.send_signal(signal.SIGHUP)
    workers = len(kp.worker_pids())
    wait_until(lambda: sum(r["event"] == "config_reload" and r["outcome"] == "applied"
                           for r in audit_records(tmp)) >= workers >= 2)  # every worker
    # Each derived carol's keys too, before it applied the file.
    assert kp.log().count(DERIVED + "6 ") == workers
    admin = AdminClient(_ck(kp, "SCRAM-SHA-512", "carol", "carol-secret"))
    assert admin.list_topics(timeout=20).brokers
    # A reload with the same users derives nothing again: the keys carry over.
    kp.process.send_signal(signal.SIGHUP)
    wait_until(lambda: sum(r["event"] == "config_reload" and r["outcome"] == "applied"
                           for r in audit_records(tmp)) >= 2 * workers)
    assert kp.log().count(DERIVED) == 2 * workers  # the start's and the first reload's
    admin = AdminClient(_ck(kp, "SCRAM-SHA-256", "carol", "carol-secret"))
    assert admin.list_topics(timeout=20).brokers


def _http(kp: KproxyProcess, path: str, method: str = "GET",
          token: str | None = None) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{kp.http_port}{path}", method=method,
                                 data=b"" if method == "POST" else None,
                                 headers={"authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_admin_token_and_status_auth(proxy: tuple[KproxyProcess, Path]) -> None:
    kp, tmp = proxy
    assert _http(kp, "/admin/rebootstrap", "POST") == 401
    assert _http(kp, "/admin/rebootstrap", "POST", "wrong-token-wrong-token") == 401
    assert _http(kp, "/admin/rebootstrap", "POST", TOKEN) == 200
    for path in ("/", "/status.json"):
        assert _http(kp, path) == 401
        assert _http(kp, path, token=TOKEN) == 200
    for path in ("/metrics", "/healthz", "/readyz"):
        assert _http(kp, path) == 200
    # The workers guard their own loopback ports the same way; the supervisor passes the
    # token on (its /metrics merges every worker's /internal/facts).
    req = urllib.request.Request(f"http://127.0.0.1:{kp.http_port}/status.json",
                                 headers={"authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=20) as resp:
        workers = json.loads(resp.read())["workers"]
    assert len(workers) == 2
    for worker in workers:
        port = worker["http_port"]
        for path in ("/internal/facts", "/internal/sample", "/status.json"):
            url = f"http://127.0.0.1:{port}{path}"
            try:
                urllib.request.urlopen(url, timeout=20)
                raise AssertionError(f"{url} answered without the token")
            except urllib.error.HTTPError as exc:
                assert exc.code == 401
            authed = urllib.request.Request(url, headers={"authorization": f"Bearer {TOKEN}"})
            with urllib.request.urlopen(authed, timeout=20) as resp:
                assert resp.status == 200
    admin = [r for r in audit_records(tmp) if r["event"] == "admin"]
    assert [r["outcome"] for r in admin] == ["denied", "denied", "ok"]
    assert all(r["process"] == "supervisor" and r["source"].startswith("127.") for r in admin)
    assert TOKEN not in (tmp / "audit.log").read_text()


def test_admin_on_beyond_loopback_needs_a_token(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "kproxy.cli", "run", "--admin", "on",
                          "--http", f"0.0.0.0:{free_port()}"], capture_output=True, text=True,
                         timeout=60, env={**os.environ})
    assert out.returncode == 2 and "admin_token_file" in out.stderr
