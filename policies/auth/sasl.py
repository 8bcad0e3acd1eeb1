"""The SASL mechanisms the proxy terminates, as step functions over tokens (no I/O).

A ``Exchange`` takes the client's tokens one SaslAuthenticate at a time and returns
the server's token, until it ends in a principal or a failure. PLAIN is one step;
SCRAM (RFC 5802, through ``scramp``) two; OAUTHBEARER's check lives in
``policies.auth.oauth`` behind the same interface. Failures carry one message for
every cause, so a client cannot learn which names exist.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import scramp

from kproxy.policies.auth.users import MAX_NAME_BYTES, MAX_PASSWORD_BYTES, UserStore

PLAIN = "PLAIN"
SCRAM_SHA_256 = "SCRAM-SHA-256"
SCRAM_SHA_512 = "SCRAM-SHA-512"
OAUTHBEARER = "OAUTHBEARER"
MECHANISMS = (PLAIN, SCRAM_SHA_256, SCRAM_SHA_512, OAUTHBEARER)
FAILED = "Authentication failed: invalid credentials"


@dataclass(frozen=True, slots=True)
class PendingCheck:
    """A password check that derives a key (PBKDF2): the caller runs ``check`` off its
    event loop, then takes ``settle``'s step. Until then nobody is logged in."""

    principal: str
    check: Callable[[], bool]

    def settle(self, holds: bool) -> Step:
        return _password_step(self.principal, holds)


@dataclass(frozen=True, slots=True)
class Step:
    """What one client token led to: the token to send back and, at the end, either a
    principal (logged in) or a failure (``error``, safe to show the client); or, with
    ``pending``, neither yet: a check still to run."""

    reply: bytes = b""
    principal: str | None = None
    error: str | None = None
    lifetime_ms: int = 0  # KIP-368: the session's lifetime, 0 for none (OAUTHBEARER sets it)
    detail: str | None = None  # why it failed, for the audit log (never a secret)
    pending: PendingCheck | None = None

    @property
    def done(self) -> bool:
        return self.principal is not None or self.error is not None


class Exchange(Protocol):
    mechanism: str
    principal_hint: str | None  # the name the client gave, once known (for the audit)

    def step(self, token: bytes) -> Step: ...


class PlainExchange:
    """RFC 4616: ``authzid NUL authcid NUL passwd``; an authzid must equal the authcid."""

    mechanism = PLAIN

    def __init__(self, users: UserStore) -> None:
        self.users = users
        self.principal_hint: str | None = None

    def step(self, token: bytes) -> Step:
        parts = token.split(b"\x00")
        if len(parts) != 3:
            return Step(error="Authentication failed: malformed PLAIN message",
                        detail="malformed")
        authzid, authcid, passwd = parts
        try:
            name, password = authcid.decode(), passwd.decode()
        except UnicodeDecodeError:
            return Step(error="Authentication failed: malformed PLAIN message",
                        detail="malformed")
        self.principal_hint = name[:MAX_NAME_BYTES]
        if authzid and authzid != authcid:
            return Step(error="Authentication failed: authorization id must be the user name",
                        detail="authzid differs")
        holds = (bool(name) and len(authcid) <= MAX_NAME_BYTES
                 and len(passwd) <= MAX_PASSWORD_BYTES
                 and self.users.check_password(name, password))
        if callable(holds):
            return Step(pending=PendingCheck(name, holds))
        return _password_step(name, holds)


def _password_step(name: str, holds: bool) -> Step:
    return Step(principal=name) if holds else Step(error=FAILED, detail="bad credentials")


class ScramExchange:
    """SCRAM-SHA-256/512 without channel binding, as Kafka's clients speak it."""

    def __init__(self, users: UserStore, mechanism: str) -> None:
        self.mechanism = mechanism
        self.users = users
        self.principal_hint: str | None = None
        self._server = scramp.ScramMechanism(mechanism).make_server(self._credentials)
        self._stage = 0

    def _credentials(self, saslname: str) -> tuple[bytes, bytes, bytes, int]:
        name = saslname.replace("=2C", ",").replace("=3D", "=")
        self.principal_hint = name[:MAX_NAME_BYTES]
        # An unknown name gets a decoy: the exchange goes on to the proof as for a real
        # user, and fails there.
        cred = self.users.scram_credential(name, self.mechanism)
        return cred.salt, cred.stored_key, cred.server_key, cred.iterations

    def step(self, token: bytes) -> Step:
        try:
            text = token.decode()
            if self._stage == 0:
                self._stage = 1
                self._server.set_client_first(text)
                return Step(self._server.get_server_first().encode())
            if self._stage == 1:
                self._stage = 2
                self._server.set_client_final(text)
                final = self._server.get_server_final().encode()
                assert self.principal_hint is not None
                return Step(final, principal=self.principal_hint)
        except (scramp.ScramException, UnicodeDecodeError, ValueError, KeyError) as exc:
            self._stage = 2
            detail = "bad credentials" if "proof" in str(exc).lower() else "malformed"
            return Step(error=FAILED, detail=detail)
        return Step(error="Authentication failed: the exchange is over", detail="extra step")


def exchange_factory(users: Callable[[], UserStore],
                     others: dict[str, Callable[[], Exchange]] | None = None,
                     ) -> Callable[[str], Exchange | None]:
    """Make a fresh exchange for a mechanism name (None if not one of ``MECHANISMS``
    built here); ``users`` is read at each login, so a reload applies at once."""
    def make(mechanism: str) -> Exchange | None:
        if mechanism == PLAIN:
            return PlainExchange(users())
        if mechanism in (SCRAM_SHA_256, SCRAM_SHA_512):
            return ScramExchange(users(), mechanism)
        if others and mechanism in others:
            return others[mechanism]()
        return None
    return make
