"""SASL termination without sockets: the users file, PLAIN and SCRAM exchanges against
scramp's client, and the handlers' answers (ok, failed after a delay, gate, sizes)."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest
import scramp
from hypothesis import given, settings
from hypothesis import strategies as st

from kproxy.codecs import api_keys
from kproxy.codecs.error_codes import ErrorCode
from kproxy.codecs.messages import decode_response
from kproxy.codecs.peek import peek_request
from kproxy.policies.addressing import PortMap
from kproxy.policies.auth.handlers import SaslSettings, make_gate, sasl_handlers
from kproxy.policies.auth.sasl import PlainExchange, ScramExchange, exchange_factory
from kproxy.policies.auth.users import UsersError, UserStore, parse_users
from kproxy.policies.connection import Answer, AnswerLater, Close, ConnectionState, Refuse
from kproxy.policies.proxy_state import ProxyState

from ..support import encode_request

_SALT, _STORED, _SERVER, _I = scramp.ScramMechanism("SCRAM-SHA-512").make_auth_info(
    "bob-secret", iteration_count=4096)
USERS = f"""
[users.alice]
password = "alice-secret"

[users.bob.scram_sha_512]
salt = "{base64.b64encode(_SALT).decode()}"
iterations = {_I}
stored_key = "{base64.b64encode(_STORED).decode()}"
server_key = "{base64.b64encode(_SERVER).decode()}"
"""


def _scram_login(mechanism: str, user: str, password: str) -> tuple[str | None, str | None]:
    store = parse_users(USERS)
    client = scramp.ScramClient([mechanism], user, password)
    server = ScramExchange(store, mechanism)
    first = server.step(client.get_client_first().encode())
    if first.error:
        return None, first.error
    client.set_server_first(first.reply.decode())
    final = server.step(client.get_client_final().encode())
    if final.error:
        return None, final.error
    client.set_server_final(final.reply.decode())  # the server proved it knows the key
    return final.principal, None


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_with_a_password_user(mechanism: str) -> None:
    assert _scram_login(mechanism, "alice", "alice-secret") == ("alice", None)
    principal, error = _scram_login(mechanism, "alice", "wrong")
    assert principal is None and error and "invalid credentials" in error


def test_scram_with_stored_credentials_and_unknown_user() -> None:
    assert _scram_login("SCRAM-SHA-512", "bob", "bob-secret") == ("bob", None)
    assert _scram_login("SCRAM-SHA-512", "bob", "nope")[0] is None
    # bob has no SHA-256 credential and no password: refused like an unknown name
    assert _scram_login("SCRAM-SHA-256", "bob", "bob-secret")[0] is None
    assert _scram_login("SCRAM-SHA-256", "nobody", "x")[0] is None


PASSWORDS_ONLY = '[users.alice]\npassword = "alice-secret"\n'


def test_plain() -> None:
    store = parse_users(PASSWORDS_ONLY)  # no user with stored keys: answered at once
    assert PlainExchange(store).step(b"\0alice\0alice-secret").principal == "alice"
    assert PlainExchange(store).step(b"alice\0alice\0alice-secret").principal == "alice"
    assert PlainExchange(store).step(b"\0alice\0wrong").error
    store = parse_users(USERS)
    assert PlainExchange(store).step(b"bob\0alice\0alice-secret").error  # authzid differs
    # stored SCRAM keys: the password's key is derived, a check left to run (off the
    # loop); until it has run, nobody is logged in
    for password, principal in ((b"bob-secret", "bob"), (b"nope", None)):
        step = PlainExchange(store).step(b"\0bob\0" + password)
        assert step.pending is not None and step.principal is None and step.error is None
        assert step.pending.settle(step.pending.check()).principal == principal
    assert PlainExchange(store).step(b"garbage").error
    assert PlainExchange(store).step(b"\0\xff\0x").error


def _server_first(store: UserStore, mechanism: str, name: str) -> tuple[bytes, int]:
    """The salt and iteration count a SCRAM server-first message gives ``name``."""
    client = scramp.ScramClient([mechanism], name, "any")
    first = ScramExchange(store, mechanism).step(client.get_client_first().encode())
    fields = dict(f.split("=", 1) for f in first.reply.decode().split(","))
    return base64.b64decode(fields["s"]), int(fields["i"])


def _stored(name: str, mechanism: str, password: str, iterations: int, salt: bytes) -> str:
    s, stored, server, i = scramp.ScramMechanism(mechanism).make_auth_info(
        password, iteration_count=iterations, salt=salt)
    keys = {"salt": s, "stored_key": stored, "server_key": server}
    return (f"[users.{name}.{mechanism.lower().replace('-', '_')}]\niterations = {i}\n"
            + "".join(f'{k} = "{base64.b64encode(v).decode()}"\n' for k, v in keys.items()))


def test_an_unknown_scram_name_looks_like_a_known_one() -> None:
    """Its salt has the store's usual length and stays the same login after login and
    in every worker (each builds its own store from the same file); its iteration
    count is the store's usual one. Kafka's keys carry a 26-byte salt at 8,192 here."""
    text = "".join(_stored(f"u{n}", "SCRAM-SHA-256", "pw", 8192, bytes(26)) for n in range(3))
    one, other = parse_users(text), parse_users(text)
    known_salt, known_i = _server_first(one, "SCRAM-SHA-256", "u0")
    salt, i = _server_first(one, "SCRAM-SHA-256", "mallory")
    assert (len(salt), i) == (len(known_salt), known_i) == (26, 8192)
    assert _server_first(other, "SCRAM-SHA-256", "mallory") == (salt, i)  # another worker
    assert _server_first(one, "SCRAM-SHA-256", "trudy")[0] != salt  # per name
    # a store of password users: shaped as their derived keys
    store = parse_users(USERS)
    known = _server_first(store, "SCRAM-SHA-256", "alice")
    unknown = _server_first(store, "SCRAM-SHA-256", "nobody")
    assert (len(unknown[0]), unknown[1]) == (len(known[0]), known[1]) == (32, 4096)
    # a password user's derived keys keep one salt in every worker, as a decoy does
    assert _server_first(parse_users(USERS), "SCRAM-SHA-256", "alice") == known
    assert _scram_login("SCRAM-SHA-256", "nobody", "x")[0] is None


def test_password_keys_derived_ahead_leave_no_derivation_to_a_login(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``derive_password_keys`` (run by the proxy in a thread before the file serves a
    login) derives each password user's keys once per mechanism asked, and none for
    stored keys; a login then derives nothing, so its answer comes as soon as an
    unknown name's. The keys are those a first login would have derived."""
    derivations: list[str] = []
    real = hashlib.pbkdf2_hmac

    def counted(name: str, password: bytes, salt: bytes, iterations: int) -> bytes:
        derivations.append(name)
        return real(name, password, salt, iterations)

    text = USERS + _stored("bob", "SCRAM-SHA-256", "pw", 4096, bytes(32))
    lazily = parse_users(text)
    expected = _server_first(lazily, "SCRAM-SHA-512", "alice")
    store = parse_users(text)
    monkeypatch.setattr(hashlib, "pbkdf2_hmac", counted)
    password_users = [u for u in store.users.values() if u.password is not None]
    assert store.derive_password_keys(["SCRAM-SHA-512"]) == len(password_users) > 0
    assert derivations == ["sha512"] * len(password_users)
    assert store.derive_password_keys(["SCRAM-SHA-512"]) == 0  # kept: never twice
    derivations.clear()
    assert _server_first(store, "SCRAM-SHA-512", "alice") == expected
    assert _server_first(store, "SCRAM-SHA-512", "nobody")[1] == expected[1]
    assert derivations == []
    # A reloaded file with the same users takes the keys already derived; one whose
    # users changed (so did every salt) derives them all again.
    again = parse_users(text)
    assert again.derive_password_keys(["SCRAM-SHA-512"], store) == 0 and derivations == []
    assert again.users["alice"].scram == store.users["alice"].scram
    changed = parse_users(text + '[users.carol]\npassword = "c"\n')
    assert changed.derive_password_keys(["SCRAM-SHA-512"], store) == len(password_users) + 1
    assert _server_first(changed, "SCRAM-SHA-512", "alice") != expected


def test_an_unknown_plain_name_derives_as_long_as_a_known_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """PLAIN against stored keys: an unknown name's check derives a key over the store's
    usual iteration count too (else its quick refusal names it unknown), and fails."""
    derivations: list[tuple[str, int]] = []
    real = hashlib.pbkdf2_hmac

    def counted(name: str, password: bytes, salt: bytes, iterations: int) -> bytes:
        derivations.append((name, iterations))
        return real(name, password, salt, iterations)

    store = parse_users(_stored("bob", "SCRAM-SHA-512", "pw", 5000, bytes(20)))
    monkeypatch.setattr(hashlib, "pbkdf2_hmac", counted)
    for name, password, principal in (("bob", b"pw", "bob"), ("bob", b"guess", None),
                                      ("mallory", b"pw", None)):
        step = PlainExchange(store).step(b"\0" + name.encode() + b"\0" + password)
        assert step.pending is not None and step.error is None
        assert step.pending.settle(step.pending.check()).principal == principal
    assert derivations == [("sha512", 5000)] * 3
    # beside a stored-key user, a password user's check derives too, then answers
    mixed = parse_users(_stored("bob", "SCRAM-SHA-512", "pw", 5000, bytes(20))
                        + '[users.alice]\npassword = "a"\n')
    derivations.clear()
    for password, principal in ((b"a", "alice"), (b"guess", None)):
        step = PlainExchange(mixed).step(b"\0alice\0" + password)
        assert step.pending is not None
        assert step.pending.settle(step.pending.check()).principal == principal
    assert derivations == [("sha512", 5000)] * 2
    assert mixed.mixed and not store.mixed and not parse_users(PASSWORDS_ONLY).mixed
    # with no stored-key user, no check derives: an unknown name is refused at once
    step = PlainExchange(parse_users('[users.alice]\npassword = "a"\n')).step(b"\0mallory\0pw")
    assert step.pending is None and step.error


@pytest.mark.parametrize("text, where", [
    ("[users.a]\n", "needs a password"),
    ("[users.a]\npassword = 3\n", "password"),
    ("[users.a]\nsecret = 'x'\n", "unknown key"),
    ("[users.a.scram_sha_256]\nsalt = 'x'\n", "missing"),
    ("[users.a.scram_sha_256]\nsalt='!!'\niterations=4096\nstored_key='QQ=='\n"
     "server_key='QQ=='\n", "not base64"),
    ("[users.a.scram_sha_256]\nsalt='QQ=='\niterations=10\nstored_key='QQ=='\n"
     "server_key='QQ=='\n", "iterations"),
    ("users = 3\n", "must be a table"),
    ("not toml [", "not valid TOML"),
    ("x" * (1024 * 1024 + 1), "larger than"),
])
def test_bad_users_files(text: str, where: str) -> None:
    with pytest.raises(UsersError, match=where):
        parse_users(text)


# ----------------------------------------------------------------------------- handlers

class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def _conn(settings: SaslSettings, audit: list[dict[str, Any]]) -> ConnectionState:
    state = ProxyState(PortMap("h", 30000, 30000, 1, 1))
    state.sasl_gate = make_gate(settings.clock)
    return ConnectionState(state, sasl_handlers(lambda: settings, audit.append), "bootstrap",
                           None, ("10.0.0.7", 5555))


def _ask(conn: ConnectionState, key: int, version: int, body: dict[str, Any],
         cid: int = 1) -> Any:
    frame = memoryview(encode_request(key, version, cid, body))[4:]
    return conn.request(peek_request(frame), frame)


def _settings(users: str = USERS, **kw: Any) -> SaslSettings:
    store = parse_users(users)
    return SaslSettings(("PLAIN", "SCRAM-SHA-256"), exchange_factory(lambda: store), 0.5,
                        clock=Clock(), **kw)


def test_plain_login_opens_the_gate_and_is_audited() -> None:
    audit: list[dict[str, Any]] = []
    conn = _conn(_settings(), audit)
    assert isinstance(_ask(conn, api_keys.METADATA, 12, {"topics": None}), Close)
    hs = _ask(conn, api_keys.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
    assert isinstance(hs, Answer)
    body = decode_response(hs.body, api_keys.SASL_HANDSHAKE, 1).body
    assert body["error_code"] == 0 and body["mechanisms"] == ["PLAIN", "SCRAM-SHA-256"]
    ok = _ask(conn, api_keys.SASL_AUTHENTICATE, 2, {"auth_bytes": b"\0alice\0alice-secret"})
    assert isinstance(ok, Answer)
    assert decode_response(ok.body, api_keys.SASL_AUTHENTICATE, 2).body["error_code"] == 0
    assert conn.authenticated and conn.principal == "alice"
    assert _ask(conn, api_keys.METADATA, 12, {"topics": None}) is None  # forwarded
    assert audit == [{"event": "login", "outcome": "ok", "mechanism": "PLAIN",
                      "principal": "alice", "source": "10.0.0.7:5555",
                      "listener": "bootstrap"}]


def test_failed_login_is_refused_after_the_delay_and_audited_without_the_password() -> None:
    audit: list[dict[str, Any]] = []
    conn = _conn(_settings(), audit)
    _ask(conn, api_keys.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
    bad = _ask(conn, api_keys.SASL_AUTHENTICATE, 1, {"auth_bytes": b"\0alice\0guess"})
    assert isinstance(bad, Refuse) and bad.delay_s == 0.5
    resp = decode_response(bad.body, api_keys.SASL_AUTHENTICATE, 1).body
    assert resp["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert not conn.authenticated
    assert audit[0]["outcome"] == "failed" and audit[0]["principal"] == "alice"
    assert "guess" not in repr(audit)


def _settle_now(later: AnswerLater) -> bytes | Refuse:
    """Await ``later.reply`` where nothing it awaits suspends (``derive`` below)."""
    coro = later.reply.__await__()
    with pytest.raises(StopIteration) as done:
        coro.send(None)
    result: bytes | Refuse = done.value.value
    return result


derived: list[object] = []  # the checks ``_derive_here`` ran


async def _derive_here(check: Any) -> bool:
    derived.append(check)
    return bool(check())


def test_a_plain_password_against_stored_keys_is_answered_once_derived() -> None:
    audit: list[dict[str, Any]] = []
    derived.clear()
    conn = _conn(_settings(PASSWORDS_ONLY, derive=_derive_here), audit)
    _ask(conn, api_keys.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
    # no user with stored keys: a password user's check needs no derivation
    assert isinstance(_ask(conn, api_keys.SASL_AUTHENTICATE, 2,
                           {"auth_bytes": b"\0alice\0alice-secret"}), Answer)
    assert not derived
    # beside one, it waits for a (decoy) derivation like theirs, then logs in
    conn = _conn(_settings(derive=_derive_here), audit)
    _ask(conn, api_keys.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
    later = _ask(conn, api_keys.SASL_AUTHENTICATE, 2, {"auth_bytes": b"\0alice\0alice-secret"})
    assert isinstance(later, AnswerLater) and not conn.authenticated
    assert isinstance(_settle_now(later), bytes) and len(derived) == 1
    assert conn.authenticated and conn.principal == "alice"
    derived.clear()
    conn = _conn(_settings(derive=_derive_here), audit)
    _ask(conn, api_keys.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
    later = _ask(conn, api_keys.SASL_AUTHENTICATE, 2, {"auth_bytes": b"\0bob\0bob-secret"})
    assert isinstance(later, AnswerLater) and not conn.authenticated
    ok = _settle_now(later)
    assert isinstance(ok, bytes) and len(derived) == 1
    assert decode_response(ok, api_keys.SASL_AUTHENTICATE, 2).body["error_code"] == 0
    assert conn.authenticated and conn.principal == "bob" and audit[-1]["outcome"] == "ok"
    conn = _conn(_settings(derive=_derive_here), audit)
    _ask(conn, api_keys.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
    later = _ask(conn, api_keys.SASL_AUTHENTICATE, 2, {"auth_bytes": b"\0bob\0guess"})
    assert isinstance(later, AnswerLater)
    bad = _settle_now(later)
    assert isinstance(bad, Refuse) and bad.delay_s == 0.5 and not conn.authenticated
    assert decode_response(bad.body, api_keys.SASL_AUTHENTICATE, 2).body[
        "error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert audit[-1]["outcome"] == "failed" and "guess" not in repr(audit)


def test_a_check_that_fails_to_run_refuses_the_login() -> None:
    async def broken(check: Any) -> bool:
        raise OSError("no thread to run it in")

    audit: list[dict[str, Any]] = []
    conn = _conn(_settings(derive=broken), audit)
    _ask(conn, api_keys.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
    later = _ask(conn, api_keys.SASL_AUTHENTICATE, 2, {"auth_bytes": b"\0bob\0bob-secret"})
    assert isinstance(later, AnswerLater)
    refused = _settle_now(later)
    assert isinstance(refused, Refuse) and not conn.authenticated
    assert audit[-1]["outcome"] == "failed" and audit[-1]["reason"] == "check failed (OSError)"


def test_unoffered_mechanism_v0_handshake_oversized_token_and_no_handshake() -> None:
    conn = _conn(_settings(), [])
    refused = _ask(conn, api_keys.SASL_HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-512"})
    assert isinstance(refused, Refuse)
    body = decode_response(refused.body, api_keys.SASL_HANDSHAKE, 1).body
    assert body["error_code"] == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert isinstance(_ask(_conn(_settings(), []), api_keys.SASL_HANDSHAKE, 0,
                           {"mechanism": "PLAIN"}), Close)
    conn = _conn(_settings(max_token_bytes=100), [])
    _ask(conn, api_keys.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
    assert isinstance(_ask(conn, api_keys.SASL_AUTHENTICATE, 1, {"auth_bytes": b"x" * 200}),
                      Refuse)
    no_hs = _ask(_conn(_settings(), []), api_keys.SASL_AUTHENTICATE, 1, {"auth_bytes": b""})
    assert isinstance(no_hs, Refuse)
    assert decode_response(no_hs.body, api_keys.SASL_AUTHENTICATE, 1).body[
        "error_code"] == ErrorCode.ILLEGAL_SASL_STATE


def test_session_lifetime_closes_an_expired_session_unless_renewed() -> None:
    settings = _settings(session_lifetime_ms=10_000)
    clock = settings.clock
    assert isinstance(clock, Clock)
    conn = _conn(settings, [])
    for _ in range(2):
        _ask(conn, api_keys.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
        ok = _ask(conn, api_keys.SASL_AUTHENTICATE, 2, {"auth_bytes": b"\0alice\0alice-secret"})
        assert decode_response(ok.body, api_keys.SASL_AUTHENTICATE, 2).body[
            "session_lifetime_ms"] == 10_000
        clock.now += 9
        assert _ask(conn, api_keys.METADATA, 12, {"topics": None}) is None
    clock.now += 2
    assert isinstance(_ask(conn, api_keys.METADATA, 12, {"topics": None}), Close)


def test_certificate_principal_as_kafka_names_it() -> None:
    from kproxy.policies.auth.cert import cert_principal
    cert = {"subject": ((("countryName", "DE"),), (("organizationName", "Corp, Inc"),),
                        (("organizationalUnitName", "team"),), (("commonName", "app-1"),))}
    assert cert_principal(cert) == "CN=app-1,OU=team,O=Corp\\, Inc,C=DE"
    assert cert_principal(cert, "cn") == "app-1"
    assert cert_principal(None) is None and cert_principal({}) is None


@given(st.lists(st.binary(max_size=300), min_size=1, max_size=3),
       st.sampled_from(["PLAIN", "SCRAM-SHA-256"]))
@settings(max_examples=60, deadline=None)
def test_hostile_tokens_end_in_an_answer_or_a_refusal_never_an_error(
        tokens: list[bytes], mechanism: str) -> None:
    conn = _conn(_settings(), [])
    _ask(conn, api_keys.SASL_HANDSHAKE, 1, {"mechanism": mechanism})
    for token in tokens:
        decision = _ask(conn, api_keys.SASL_AUTHENTICATE, 1, {"auth_bytes": token})
        assert isinstance(decision, Answer | Refuse)
        if isinstance(decision, Refuse):
            break
    assert not conn.authenticated
