"""OAUTHBEARER at a running `kproxy run` (two workers): confluent-kafka's ``oauth_cb``
hands tokens signed with RSA and EC keys made here; the JWKS is served by this test on
loopback. A JWKS endpoint that hangs, then answers garbage, costs OAUTHBEARER logins a
clear refusal while PLAIN clients go on; once it answers, good tokens log in and an
expired token, a wrong audience and an unknown key id are refused; the session
lifetime follows the token's exp (KIP-368)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kproxy.codecs import api_keys
from kproxy.codecs.messages import decode_response
from kproxy.embedded_broker import TansuBroker

from ..oauth_keys import AUDIENCE, ISSUER, Keys, client_message
from ..support import (
    KproxyProcess,
    audit_records,
    encode_request,
    kproxy_process,
    wait_until,
)

pytestmark = pytest.mark.broker
KEYS = Keys()


class Jwks:
    """The issuer's JWKS endpoint, whose behaviour the test sets: hang, garbage, ok."""

    def __init__(self) -> None:
        self.mode = "hang"
        self.hits = 0
        self.release = threading.Event()
        jwks = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                jwks.hits += 1
                if jwks.mode == "hang":
                    jwks.release.wait(30)
                    return
                body = (json.dumps(KEYS.jwks()).encode() if jwks.mode == "ok"
                        else b"<html>not a jwks</html>")
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks.json"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()


@pytest.fixture(scope="module")
def bed(shared_tansu: TansuBroker, tmp_path_factory: pytest.TempPathFactory,
        ) -> Iterator[tuple[KproxyProcess, Jwks, Path]]:
    tmp = tmp_path_factory.mktemp("oauth")
    jwks = Jwks()
    (tmp / "users.toml").write_text('[users.alice]\npassword = "alice-secret"\n')
    (tmp / "kproxy.toml").write_text(f"""
audit_log = "{tmp / 'audit.log'}"
[sasl]
terminate = true
mechanisms = ["PLAIN", "OAUTHBEARER"]
users_file = "{tmp / 'users.toml'}"
failed_login_delay = 0.2
[sasl.oauthbearer]
jwks_url = "{jwks.url}"
issuer = "{ISSUER}"
audience = "{AUDIENCE}"
jwks_refresh = 2
clock_skew = 0
""")
    try:
        with kproxy_process(shared_tansu.bootstrap, tmp, "--config",
                            str(tmp / "kproxy.toml")) as kp:
            yield kp, jwks, tmp
    finally:
        jwks.close()




def _oauth_login(kp: KproxyProcess, token: Callable[[], str], timeout: float = 15) -> str:
    """Log in with confluent-kafka through ``oauth_cb``: "ok" or the error it saw."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient
    errors: list[Any] = []

    def oauth_cb(_: str) -> tuple[str, float]:
        value = token()
        return value, time.time() + 300

    # The callbacks are config entries librdkafka's Python binding takes; its stubs type
    # the values as scalars only.
    config: dict[str, Any] = {"bootstrap.servers": kp.bootstrap,
                              "security.protocol": "SASL_PLAINTEXT",
                              "sasl.mechanism": "OAUTHBEARER", "log_level": 0,
                              "oauth_cb": oauth_cb, "error_cb": errors.append}
    admin = AdminClient(config)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if admin.list_topics(timeout=1).brokers:
                return "ok"
        except Exception:
            pass
        admin.poll(0)  # serves error_cb
        if any(e.code() == KafkaError._AUTHENTICATION for e in errors):
            return "authentication failed"
    return "timeout"


def _plain_ok(kp: KproxyProcess) -> bool:
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": kp.bootstrap, "security.protocol":
                         "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                         "sasl.username": "alice", "sasl.password": "alice-secret"})
    return bool(admin.list_topics(timeout=20).brokers)


def test_a_hanging_then_garbage_jwks_refuses_oauth_and_serves_others(
        bed: tuple[KproxyProcess, Jwks, Path]) -> None:
    kp, jwks, tmp = bed
    assert _oauth_login(kp, lambda: KEYS.token(time.time())) == "authentication failed"
    assert _plain_ok(kp)
    jwks.mode = "garbage"
    jwks.release.set()
    hits = jwks.hits
    wait_until(lambda: jwks.hits >= hits + 2)  # both workers, after their backoff
    assert _oauth_login(kp, lambda: KEYS.token(time.time())) == "authentication failed"
    assert _plain_ok(kp)
    failed = [r for r in audit_records(tmp) if r["mechanism"] == "OAUTHBEARER"]
    assert failed and all(r["outcome"] == "failed" for r in failed)
    assert "keys not fetched" in failed[0]["reason"]


def test_good_tokens_log_in_and_bad_ones_are_refused(
        bed: tuple[KproxyProcess, Jwks, Path]) -> None:
    kp, jwks, tmp = bed
    jwks.mode = "ok"
    # Each worker learns the keys at its next fetch (backoff at most jwks_refresh).
    wait_until(lambda: _oauth_login(kp, lambda: KEYS.token(time.time(), sub="svc-rsa"), 5) == "ok")
    assert _oauth_login(kp, lambda: KEYS.token(time.time(), sub="svc-ec", kid="ec-1")) == "ok"
    for bad in (lambda: KEYS.token(time.time(), ttl=-5),
                lambda: KEYS.token(time.time(), aud="another-service"),
                lambda: KEYS.token(time.time(), kid="gone")):
        assert _oauth_login(kp, bad) == "authentication failed"
    records = audit_records(tmp)
    oks = {r["principal"] for r in records if r["mechanism"] == "OAUTHBEARER"
           and r["outcome"] == "ok"}
    assert {"svc-rsa", "svc-ec"} <= oks
    reasons = {r["reason"] for r in records if r.get("outcome") == "failed"}
    assert {"expired", "wrong audience", "unknown key id"} <= reasons
    text = (tmp / "audit.log").read_text()
    assert "eyJ" not in text  # no token, not even a piece of one


def test_session_lifetime_is_the_tokens(bed: tuple[KproxyProcess, Jwks, Path]) -> None:
    import socket
    import struct
    kp, jwks, _ = bed
    jwks.mode = "ok"
    wait_until(lambda: _oauth_login(kp, lambda: KEYS.token(time.time()), 5) == "ok")
    token = KEYS.token(time.time(), ttl=120)
    with socket.create_connection(("127.0.0.1", kp.bootstrap_port), timeout=10) as sock:
        sock.sendall(encode_request(api_keys.SASL_HANDSHAKE, 1, 1, {"mechanism": "OAUTHBEARER"}))
        sock.sendall(encode_request(api_keys.SASL_AUTHENTICATE, 2, 2,
                                    {"auth_bytes": client_message(token)}))
        frames: list[bytes] = []
        data = b""
        while len(frames) < 2:
            data += sock.recv(65536)
            while len(data) >= 4 and len(data) >= 4 + struct.unpack(">i", data[:4])[0]:
                size = struct.unpack(">i", data[:4])[0]
                frames.append(data[4:4 + size])
                data = data[4 + size:]
    body = decode_response(frames[1], api_keys.SASL_AUTHENTICATE, 2).body
    assert body["error_code"] == 0
    assert 110_000 <= body["session_lifetime_ms"] <= 120_000
