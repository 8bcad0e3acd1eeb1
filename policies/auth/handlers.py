"""SaslHandshake and SaslAuthenticate answered by the proxy (``[sasl] terminate``).

The client logs in here, as it would at a broker: a handshake names the mechanism,
then SaslAuthenticate requests carry its tokens. Until a login succeeds only
ApiVersions and the SASL requests pass (``gate``); a failed login is answered with
SASL_AUTHENTICATION_FAILED after a fixed delay and the connection is closed, as a
broker does. A client may log in again on the same connection (KIP-368): a session
with a lifetime ends at its first request after it, unless renewed.

Every login, ok or failed, is handed to ``audit`` (mechanism, principal, source):
never a password, a token or a SCRAM proof.

A PLAIN password checked against stored SCRAM keys is checked by deriving its key
(PBKDF2 over the stored iterations): with ``SaslSettings.derive`` that runs off the
event loop and the login is answered later, in its place among the connection's
answers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kproxy.codecs import api_keys
from kproxy.codecs.error_codes import ErrorCode
from kproxy.codecs.errors import CodecError
from kproxy.codecs.messages import decode_request, encode_response_parts
from kproxy.codecs.peek import RequestPeek
from kproxy.policies.auth.sasl import Exchange, PendingCheck, Step
from kproxy.policies.connection import (
    Answer,
    AnswerLater,
    Close,
    ConnectionState,
    Handlers,
    Refuse,
    RequestDecision,
    RequestHandler,
)

AuditFn = Callable[[dict[str, object]], None]
# Runs a password check that derives a key somewhere other than the event loop.
Derive = Callable[[Callable[[], bool]], Awaitable[bool]]
MAX_TOKEN_BYTES = 64 * 1024  # a SaslAuthenticate token larger than this is refused
MAX_STEPS = 4  # SCRAM takes two; a client that keeps going is refused


@dataclass
class SaslSettings:
    """What the handlers read at each login (replaced whole at a reload)."""

    mechanisms: tuple[str, ...]
    make_exchange: Callable[[str], Exchange | None]
    failed_delay_s: float = 1.0
    max_token_bytes: int = MAX_TOKEN_BYTES
    session_lifetime_ms: int = 0  # PLAIN/SCRAM sessions; 0: no re-authentication asked
    clock: Callable[[], float] = field(default=lambda: 0.0)  # monotonic seconds
    derive: Derive | None = None  # the shell's, off its event loop; None: in place


def _source(conn: ConnectionState) -> str:
    return f"{conn.info.source_address}:{conn.info.source_port}"


class SaslHandshake:
    def __init__(self, settings: Callable[[], SaslSettings]) -> None:
        self.settings = settings

    def request(self, conn: ConnectionState, peek: RequestPeek,
                body: memoryview) -> RequestDecision:
        if peek.api_version == 0:
            return Close("SaslHandshake v0", "sasl_v0", "SaslHandshake v0 (raw SASL tokens) "
                         "is not supported; the client must use SaslHandshake v1 and "
                         "SaslAuthenticate (Kafka 1.0+ clients do)")
        try:
            mechanism = decode_request(body).body["mechanism"]
        except CodecError as exc:
            return Close(f"bad SaslHandshake: {exc}", "sasl_malformed",
                         "malformed SaslHandshake request; connection closed")
        settings = self.settings()
        offered = list(settings.mechanisms)
        exchange = (settings.make_exchange(mechanism) if mechanism in offered else None)
        if exchange is None:
            reply = encode_response_parts(api_keys.SASL_HANDSHAKE, peek.api_version,
                                          peek.correlation_id, {
                                              "error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                                              "mechanisms": offered})
            return Refuse(reply, 0.0, "sasl_mechanism", "client asked for a SASL mechanism "
                          "not offered; connection closed")
        conn.sasl = [exchange, 0]
        return Answer(encode_response_parts(api_keys.SASL_HANDSHAKE, peek.api_version,
                                            peek.correlation_id,
                                            {"error_code": 0, "mechanisms": offered}))


class SaslAuthenticate:
    def __init__(self, settings: Callable[[], SaslSettings], audit: AuditFn) -> None:
        self.settings = settings
        self.audit = audit

    def request(self, conn: ConnectionState, peek: RequestPeek,
                body: memoryview) -> RequestDecision:
        settings = self.settings()
        state = conn.sasl
        if state is None:
            return self._fail(conn, peek, settings, None, ErrorCode.ILLEGAL_SASL_STATE,
                              "SaslAuthenticate before SaslHandshake", "no handshake")
        exchange: Exchange = state[0]
        if len(body) > settings.max_token_bytes + 256:
            return self._fail(conn, peek, settings, exchange, ErrorCode.SASL_AUTHENTICATION_FAILED,
                              "Authentication failed: token too large", "token too large")
        try:
            token = decode_request(body).body["auth_bytes"]
        except CodecError:
            return self._fail(conn, peek, settings, exchange, ErrorCode.SASL_AUTHENTICATION_FAILED,
                              "Authentication failed: malformed request", "malformed")
        state[1] += 1
        if len(token) > settings.max_token_bytes or state[1] > MAX_STEPS:
            return self._fail(conn, peek, settings, exchange, ErrorCode.SASL_AUTHENTICATION_FAILED,
                              "Authentication failed: token too large or too many steps",
                              "token too large" if state[1] <= MAX_STEPS else "too many steps")
        try:
            step = exchange.step(bytes(token))
        except Exception as exc:  # a mechanism's library choking on hostile bytes: fail closed
            step = Step(error="Authentication failed: malformed message",
                        detail=f"malformed ({type(exc).__name__})")
        if step.pending is not None:
            if settings.derive is not None:
                return AnswerLater(self._settled(conn, peek, settings, exchange, step.pending,
                                                 settings.derive))
            step = step.pending.settle(step.pending.check())
        return self._conclude(conn, peek, settings, exchange, step)

    async def _settled(self, conn: ConnectionState, peek: RequestPeek, settings: SaslSettings,
                       exchange: Exchange, pending: PendingCheck, derive: Derive,
                       ) -> bytes | Refuse:
        """The answer once the pending check has run where ``derive`` runs it."""
        try:
            step = pending.settle(await derive(pending.check))
        except Exception as exc:  # the check itself failed: nobody is logged in
            step = Step(error="Authentication failed: the check could not be made",
                        detail=f"check failed ({type(exc).__name__})")
        decision = self._conclude(conn, peek, settings, exchange, step)
        return decision.body if isinstance(decision, Answer) else decision

    def _conclude(self, conn: ConnectionState, peek: RequestPeek, settings: SaslSettings,
                  exchange: Exchange, step: Step) -> Answer | Refuse:
        """A settled step's answer: the next token, a login, or a refusal."""
        if step.error is not None:
            return self._fail(conn, peek, settings, exchange,
                              ErrorCode.SASL_AUTHENTICATION_FAILED, step.error,
                              step.detail or "failed")
        lifetime = 0
        if step.principal is not None:
            if conn.authenticated and conn.principal != step.principal:
                # KIP-368: a re-authentication may not change who the connection is.
                return self._fail(conn, peek, settings, exchange,
                                  ErrorCode.SASL_AUTHENTICATION_FAILED,
                                  "Authentication failed: re-authentication must keep the "
                                  "principal", "principal changed")
            lifetime = step.lifetime_ms or settings.session_lifetime_ms
            again = conn.authenticated
            conn.authenticated, conn.principal, conn.sasl = True, step.principal, None
            conn.session_expiry = (settings.clock() + lifetime / 1000) if lifetime else None
            self.audit({"event": "reauthentication" if again else "login", "outcome": "ok",
                        "mechanism": exchange.mechanism, "principal": step.principal,
                        "source": _source(conn), "listener": conn.listener,
                        **({"session_lifetime_ms": lifetime} if lifetime else {})})
        return Answer(_authenticate_reply(peek, ErrorCode.NONE, None, step.reply, lifetime))

    def _fail(self, conn: ConnectionState, peek: RequestPeek, settings: SaslSettings,
              exchange: Exchange | None, code: int, message: str, detail: str) -> Refuse:
        self.audit({"event": "login", "outcome": "failed",
                    "mechanism": exchange.mechanism if exchange else None,
                    "principal": exchange.principal_hint if exchange else None,
                    "source": _source(conn), "listener": conn.listener, "reason": detail})
        conn.sasl = None
        return Refuse(_authenticate_reply(peek, code, message, b"", 0), settings.failed_delay_s,
                      "sasl_failed", "SASL authentication failed; connection closed")


def _authenticate_reply(peek: RequestPeek, code: int, message: str | None, token: bytes,
                        lifetime_ms: int) -> bytes:
    return encode_response_parts(api_keys.SASL_AUTHENTICATE, peek.api_version,
                                 peek.correlation_id, {
                                     "error_code": code, "error_message": message,
                                     "auth_bytes": token, "session_lifetime_ms": lifetime_ms})


def make_gate(clock: Callable[[], float]) -> Callable[[ConnectionState, int], Close | None]:
    """What ``ConnectionState`` asks of every request but ApiVersions and SASL's."""
    def gate(conn: ConnectionState, api_key: int) -> Close | None:
        if not conn.authenticated:
            # A broker with SASL closes a connection whose requests come before a login.
            return Close("request before SASL authentication", "unauthenticated",
                         "request before SASL authentication; connection closed",
                         api_keys.api_name(api_key))
        if conn.session_expiry is not None and clock() > conn.session_expiry:
            return Close("SASL session expired", "sasl_expired",
                         "SASL session lifetime passed without re-authentication; "
                         "connection closed", api_keys.api_name(api_key))
        return None
    return gate


def sasl_handlers(settings: Callable[[], SaslSettings], audit: AuditFn) -> Handlers:
    """The built-in filter that terminates SASL: it replaces the pass-through one's
    SaslHandshake check and SaslAuthenticate response reader."""
    requests: dict[int, RequestHandler] = {
        api_keys.SASL_HANDSHAKE: SaslHandshake(settings),
        api_keys.SASL_AUTHENTICATE: SaslAuthenticate(settings, audit),
    }
    return Handlers(requests)
