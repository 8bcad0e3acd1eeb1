"""What a login costs the proxy, per mechanism, in logins per CPU-second.

Run: ``.venv/bin/python tests/bench/sasl_logins.py [seconds per mechanism]``.

Measured in one process, without sockets: the proxy's side of each login only (the
SaslHandshake and SaslAuthenticate requests decoded, the mechanism's checks, the
answers encoded, the audit record built), each through the same ``ConnectionState``
and handlers the relay uses. The client's side (its PBKDF2 for SCRAM, signing the
JWT) is made outside the timed part. CPU time is ``time.process_time``. What a real
connection adds (accept, the TCP round trips, the relay's tasks) is the same for
every mechanism and is not in these figures.

- PLAIN against a stored ``password``: a constant-time comparison; beside users with
  stored SCRAM keys only, a PBKDF2 derivation over a decoy too (so that its answer
  comes no sooner than theirs: docs/security.md).
- PLAIN against stored SCRAM keys only: a PBKDF2 derivation (4096 iterations) per login.
- SCRAM-SHA-256/512: two steps; the server derives nothing per login (the salted keys
  are stored, or derived once per process for a ``password`` user).
- OAUTHBEARER: one signature check, RS256 (2048-bit) or ES256 (P-256).
"""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import scramp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kproxy.codecs import api_keys  # noqa: E402
from kproxy.codecs.peek import peek_request  # noqa: E402
from kproxy.policies.addressing import PortMap  # noqa: E402
from kproxy.policies.auth.handlers import SaslSettings, make_gate, sasl_handlers  # noqa: E402
from kproxy.policies.auth.oauth import (  # noqa: E402
    JwksKeys,
    OAuthExchange,
    OAuthSettings,
    parse_jwks,
)
from kproxy.policies.auth.sasl import exchange_factory  # noqa: E402
from kproxy.policies.auth.users import parse_users  # noqa: E402
from kproxy.policies.connection import Answer, ConnectionState  # noqa: E402
from kproxy.policies.proxy_state import ProxyState  # noqa: E402
from tests.oauth_keys import AUDIENCE, ISSUER, Keys, client_message  # noqa: E402
from tests.support import encode_request  # noqa: E402

_SALT, _STORED, _SERVER, _I = scramp.ScramMechanism("SCRAM-SHA-256").make_auth_info(
    "stored-secret", iteration_count=4096)
USERS = f"""
[users.alice]
password = "alice-secret"
[users.stored.scram_sha_256]
salt = "{base64.b64encode(_SALT).decode()}"
iterations = {_I}
stored_key = "{base64.b64encode(_STORED).decode()}"
server_key = "{base64.b64encode(_SERVER).decode()}"
"""
KEYS = Keys()


def _frame(key: int, version: int, cid: int, body: dict[str, Any]) -> memoryview:
    return memoryview(encode_request(key, version, cid, body))[4:]


PASSWORDS_ONLY = '[users.alice]\npassword = "alice-secret"\n'


class Bed:
    def __init__(self, users: str = USERS) -> None:
        store = parse_users(users)
        jwks = JwksKeys(parse_jwks(json.dumps(KEYS.jwks()).encode()), fetched=True)
        oauth = OAuthSettings(ISSUER, AUDIENCE, "sub", 30)
        make = exchange_factory(lambda: store, {"OAUTHBEARER": lambda: OAuthExchange(
            oauth, lambda: jwks, time.time, lambda: None)})
        self.settings = SaslSettings(("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"),
                                     make, 0.0, clock=time.monotonic)
        self.state = ProxyState(PortMap("h", 30000, 30000, 1, 1))
        self.state.sasl_gate = make_gate(time.monotonic)
        self.audit: list[dict[str, object]] = []
        self.handlers = sasl_handlers(lambda: self.settings, self.audit.append)

    def conn(self) -> ConnectionState:
        return ConnectionState(self.state, self.handlers, "bootstrap", None, ("10.0.0.1", 1))

    def ask(self, conn: ConnectionState, key: int, body: dict[str, Any]) -> bytes:
        frame = _frame(key, 1, 1, body)
        decision = conn.request(peek_request(frame), frame)
        assert isinstance(decision, Answer), decision
        return decision.body


def plain(bed: Bed, user: str, password: str) -> Callable[[], float]:
    token = f"\0{user}\0{password}".encode()

    def one() -> float:
        t0 = time.process_time()
        conn = bed.conn()
        bed.ask(conn, api_keys.SASL_HANDSHAKE, {"mechanism": "PLAIN"})
        bed.ask(conn, api_keys.SASL_AUTHENTICATE, {"auth_bytes": token})
        assert conn.authenticated
        return time.process_time() - t0
    return one


def scram(bed: Bed, mechanism: str) -> Callable[[], float]:
    from kproxy.codecs.messages import decode_response

    def one() -> float:
        client = scramp.ScramClient([mechanism], "alice", "alice-secret")
        first = client.get_client_first().encode()
        t0 = time.process_time()
        conn = bed.conn()
        bed.ask(conn, api_keys.SASL_HANDSHAKE, {"mechanism": mechanism})
        reply = bed.ask(conn, api_keys.SASL_AUTHENTICATE, {"auth_bytes": first})
        spent = time.process_time() - t0
        server_first = decode_response(reply, api_keys.SASL_AUTHENTICATE, 1).body["auth_bytes"]
        client.set_server_first(bytes(server_first).decode())
        final = client.get_client_final().encode()  # the client's PBKDF2: not counted
        t0 = time.process_time()
        bed.ask(conn, api_keys.SASL_AUTHENTICATE, {"auth_bytes": final})
        spent += time.process_time() - t0
        assert conn.authenticated
        return spent
    return one


def oauth(bed: Bed, kid: str) -> Callable[[], float]:
    token = client_message(KEYS.token(time.time(), kid=kid, ttl=3600))

    def one() -> float:
        t0 = time.process_time()
        conn = bed.conn()
        bed.ask(conn, api_keys.SASL_HANDSHAKE, {"mechanism": "OAUTHBEARER"})
        bed.ask(conn, api_keys.SASL_AUTHENTICATE, {"auth_bytes": token})
        assert conn.authenticated
        return time.process_time() - t0
    return one


def measure(one: Callable[[], float], seconds: float) -> tuple[float, int]:
    one()  # warm: a password user's SCRAM keys are derived at the first login
    spent, n = 0.0, 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline or n < 20:
        spent += one()
        n += 1
        for bed in (BED, PASSWORDS_BED):
            if len(bed.audit) > 10_000:
                bed.audit.clear()
    return n / spent if spent else float("inf"), n


BED = Bed()
PASSWORDS_BED = Bed(PASSWORDS_ONLY)


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    rows = [("PLAIN (password)", plain(PASSWORDS_BED, "alice", "alice-secret")),
            ("PLAIN (password, beside keys)", plain(BED, "alice", "alice-secret")),
            ("PLAIN (stored SCRAM keys)", plain(BED, "stored", "stored-secret")),
            ("SCRAM-SHA-256", scram(BED, "SCRAM-SHA-256")),
            ("SCRAM-SHA-512", scram(BED, "SCRAM-SHA-512")),
            ("OAUTHBEARER RS256", oauth(BED, "rsa-1")),
            ("OAUTHBEARER ES256", oauth(BED, "ec-1"))]
    print(f"{'mechanism':30} {'logins/CPU-s':>14} {'us/login':>10} {'logins':>8}")
    for name, one in rows:
        rate, n = measure(one, seconds)
        print(f"{name:30} {rate:14,.0f} {1e6 / rate:10.1f} {n:8d}")


if __name__ == "__main__":
    main()
