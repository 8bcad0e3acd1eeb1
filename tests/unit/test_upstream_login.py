"""The proxy's own SASL login at a broker (``UpstreamLogin``), without sockets: against
the proxy's own SASL termination as the broker. Which answer derives the key (the
costly step the shell computes off its loop), and a broker asking for more iterations
than ``MAX_ITERATIONS`` refused before any key is derived."""

from __future__ import annotations

import hashlib
import os

import pytest
import scramp

from kproxy.codecs import api_keys
from kproxy.codecs.messages import decode_request, encode_response_parts
from kproxy.policies.auth.sasl import Exchange, exchange_factory
from kproxy.policies.auth.upstream import UpstreamCredentials, UpstreamLogin, UpstreamLoginFailed
from kproxy.policies.auth.users import MAX_ITERATIONS, ScramCredential, User, UserStore

PASSWORD = "proxy-secret"


def _store(mechanism: str, iterations: int) -> UserStore:
    salt, stored, server, i = scramp.ScramMechanism(mechanism).make_auth_info(
        PASSWORD, iteration_count=iterations)
    return UserStore({"the-proxy": User("the-proxy", scram={
        mechanism: ScramCredential(salt, stored, server, i)})})


class Broker:
    """The broker's side: the proxy's SASL termination, answering the login's frames."""

    def __init__(self, users: UserStore) -> None:
        self.make = exchange_factory(lambda: users)
        self.exchange: Exchange | None = None
        self.principal: str | None = None

    def answer(self, frame: bytes) -> bytes:
        request = decode_request(frame[4:])
        header, body = request.header, request.body
        if header.api_key == api_keys.SASL_HANDSHAKE:
            self.exchange = self.make(body["mechanism"])
            return encode_response_parts(header.api_key, header.api_version,
                                         header.correlation_id,
                                         {"error_code": 0, "mechanisms": ["SCRAM-SHA-256",
                                                                          "SCRAM-SHA-512"]})
        assert self.exchange is not None
        step = self.exchange.step(bytes(body["auth_bytes"]))
        self.principal = step.principal
        return encode_response_parts(header.api_key, header.api_version, header.correlation_id,
                                     {"error_code": 58 if step.error else 0,
                                      "error_message": step.error, "auth_bytes": step.reply,
                                      "session_lifetime_ms": 0})


def _login(login: UpstreamLogin, broker: Broker) -> list[bool]:
    """Run the login to its end; ``derives_key`` before each answer is read."""
    derives = []
    out: bytes | None = login.start()
    while out is not None:
        answer = broker.answer(out)
        derives.append(login.derives_key)
        out = login.receive(answer)
    return derives


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_login_derives_the_key_at_the_brokers_first_message(mechanism: str) -> None:
    broker = Broker(_store(mechanism, 4096))
    login = UpstreamLogin(UpstreamCredentials(mechanism, "the-proxy", PASSWORD))
    # handshake answer, server-first (the proof is derived), server-final (checked)
    assert _login(login, broker) == [False, True, False]
    assert broker.principal == "the-proxy"


def test_plain_login_derives_nothing() -> None:
    users = UserStore({"the-proxy": User("the-proxy", password=PASSWORD)})
    broker = Broker(users)
    login = UpstreamLogin(UpstreamCredentials("PLAIN", "the-proxy", PASSWORD))
    assert _login(login, broker) == [False, False]
    assert broker.principal == "the-proxy"


def test_a_broker_asking_too_many_iterations_is_refused_before_any_derivation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    salt = os.urandom(16)
    users = UserStore({"the-proxy": User("the-proxy", scram={"SCRAM-SHA-512": ScramCredential(
        salt, os.urandom(64), os.urandom(64), MAX_ITERATIONS + 1)})})

    def no_derivation(*args: object) -> bytes:
        raise AssertionError("a key was derived")

    monkeypatch.setattr(hashlib, "pbkdf2_hmac", no_derivation)
    login = UpstreamLogin(UpstreamCredentials("SCRAM-SHA-512", "the-proxy", PASSWORD))
    with pytest.raises(UpstreamLoginFailed, match=f"asks for {MAX_ITERATIONS + 1} SCRAM "
                                                  f"iterations.*at most {MAX_ITERATIONS}"):
        _login(login, Broker(users))
