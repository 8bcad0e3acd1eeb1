"""One client connection's protocol state and decisions, without I/O (h11's shape).

The session (``kproxy.session.session``) owns the sockets, buffers, ordering and timeouts. It
tells a ``ConnectionState`` what it saw — a request's header, a response, a topology
change — and applies what it gets back: forward this frame (as received, or these
bytes at that upstream version), answer this locally, replace this response, close
for this reason. What a connection knows of its client (versions used, software,
the topology epoch it last saw, whether SASL succeeded) lives here, and only the
handlers here change it.

Handlers are looked up by API key: a ``RequestHandler`` may answer, replace or refuse
a request; a ``ResponseHandler`` says which versions it must see whole and rewrites
them. Everything without a handler is relayed as bytes (responses cut through).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kproxy.codecs.partial.fetch_walk import FetchWalk
from kproxy.codecs.peek import RequestPeek
from kproxy.policies.proxy_state import HostPort, ProxyState
from kproxy.policies.rebootstrap import Action, on_change
from kproxy.policies.rewrite import Seen
from kproxy.policies.topology import Change


@dataclass(slots=True)
class ClientInfo:
    """What the proxy knows of the client on this connection."""

    source_address: str
    source_port: int
    client_id: str | None = None
    software_name: str | None = None
    software_version: str | None = None


# ----------------------------------------------------------------------------- decisions


# What a filter that changed a request does to its response: given the response (header
# included, no size prefix) at the client's version, the response to send instead.
FollowUp = Callable[[memoryview, int], bytes]


@dataclass(frozen=True, slots=True)
class Forward:
    """Send this request upstream as ``body`` (header included, no size prefix); with
    ``then``, its response is passed through ``then`` before the client sees it."""

    body: bytes
    upstream_version: int
    then: FollowUp | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """Answer locally with ``body`` (header included, no size prefix)."""

    body: bytes


@dataclass(frozen=True, slots=True)
class AnswerLater:
    """Answer locally with what ``reply`` gives once awaited (work that must not stall
    the relay, e.g. decoding a telemetry push). The answer still leaves in request
    order; this connection's later requests are forwarded meanwhile. A ``Refuse``
    given instead is carried out as one (a login that failed once checked)."""

    reply: Awaitable[bytes | Refuse]


@dataclass(frozen=True, slots=True)
class Close:
    """End the connection: what is in flight is not answered."""

    reason: str  # for the debug log
    event: str  # what happened, for the operator log and the metrics
    message: str  # the operator log line
    api: str | None = None


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer with ``body`` after ``delay_s``, then close: a failed login, as a broker
    answers it (the delay slows a client that guesses passwords). The connection reads
    nothing more meanwhile."""

    body: bytes
    delay_s: float
    event: str
    message: str


# None from ``request`` means: forward the request as received.
RequestDecision = Forward | Answer | AnswerLater | Close | Refuse | None

# With SASL terminated at the proxy, the only requests served before a login.
SASL_OPEN_APIS = frozenset({18, 17, 36})  # ApiVersions, SaslHandshake, SaslAuthenticate


@dataclass(slots=True)
class Handled:
    """What a response handler made of a response."""

    body: bytes | memoryview | None = None  # the response to send instead; None: unchanged
    seen: Seen | None = None  # what it said about the backend
    change: Change | None = None  # the topology change it revealed, for the shell to fan out
    rebootstrap: Action = Action.NONE
    close_after: bool = False  # close once this response is written (legacy policy)


class RequestHandler(Protocol):
    def request(self, conn: ConnectionState, peek: RequestPeek,
                body: memoryview) -> RequestDecision: ...


class ResponseHandler(Protocol):
    def wants(self, api_version: int) -> bool:
        """Whether responses at this version must be seen whole (else they cut through)."""

    def response(self, conn: ConnectionState, api_version: int, upstream_version: int,
                 body: memoryview) -> Handled: ...


class ResponseStream(Protocol):
    """A response relayed as it arrives yet rewritten (``policies.handlers.FetchStream``)."""

    walk: FetchWalk

    def finish(self, tail: bytes | memoryview) -> tuple[bytes | memoryview, Handled]: ...


class ResponseObserver(Protocol):
    def observe(self, conn: ConnectionState, api_version: int, body: memoryview | bytes,
                complete: bool) -> None:
        """A response relayed as bytes: whole, or (not ``complete``) only its head, when
        it is passed through as it arrives. Reads only; the response goes out unchanged."""


@dataclass(frozen=True)
class Handlers:
    requests: Mapping[int, RequestHandler] = field(default_factory=dict)
    responses: Mapping[int, ResponseHandler] = field(default_factory=dict)
    observers: Mapping[int, ResponseObserver] = field(default_factory=dict)


# Of a response passed through, at most this much of its head is shown to an observer.
OBSERVED_HEAD_BYTES = 64 * 1024


# ----------------------------------------------------------------------------- state


class ConnectionState:
    # Slots: one per open connection; weak references for the status page's push times.
    __slots__ = (
        "__weakref__",
        "_observers",
        "_requests",
        "_responses",
        "api_versions_used",
        "authenticated",
        "backend_metadata_max",
        "connected_epoch",
        "ended_by_change",
        "follow_ups",
        "handlers",
        "info",
        "listener",
        "metadata_version",
        "node_id",
        "pending",
        "principal",
        "reached_relisted",
        "sasl",
        "session_expiry",
        "shared",
        "telemetry_held_until",
        "topology_epoch",
        "upstream",
    )

    def __init__(self, shared: ProxyState, handlers: Handlers, listener: str,
                 node_id: int | None, peer: tuple[str, int]) -> None:
        self.shared = shared
        self.handlers = handlers
        self.listener = listener
        self.node_id = node_id  # None on the bootstrap listener
        self.info = ClientInfo(*peer)
        self.connected_epoch = shared.epoch
        # The epoch of the view this client last received here (at its Metadata
        # responses), the Metadata version it speaks, what the broker behind it serves.
        self.topology_epoch: int | None = None
        self.metadata_version: int | None = None
        self.backend_metadata_max: int | None = None
        self.upstream: HostPort | None = None  # the broker it is connected to, once it is
        # A bootstrap connection that reached a reload's new list before that reload's
        # change landed: the epoch it reached it at (``ProxyState.relisted_at``).
        self.reached_relisted: int | None = None
        # Set when a backend change ended it (the outcome was counted): the answers
        # still in flight are relayed, but nobody is told twice.
        self.ended_by_change = False
        # SASL passes through and the broker's answer is noted, or (``shared.sasl_gate``)
        # the proxy logs the client in: then its principal, the exchange under way, and
        # when the session ends (KIP-368, the gate's clock; None: never).
        self.authenticated = False
        self.principal: str | None = None
        self.sasl: Any = None
        self.session_expiry: float | None = None
        self.api_versions_used: dict[int, int] = {}  # highest version used per API
        # After a push refused as INVALID_RECORD, which a client must take as the end of
        # its telemetry: until then (the telemetry clock, ms; 0 none) this connection's
        # telemetry requests are held and refused (``TelemetryService``).
        self.telemetry_held_until = 0
        # Requests a handler keeps until their response, by correlation id (bounded by
        # the handler): group tracking needs the request's group id at the response.
        self.pending: dict[int, tuple[int, dict[str, Any]]] = {}
        # Responses a filter rewrites (``Forward.then``), by correlation id: one per
        # request in flight at most, so bounded by max_inflight.
        self.follow_ups: dict[int, tuple[int, FollowUp]] = {}
        self._requests = handlers.requests
        self._responses = handlers.responses
        self._observers = handlers.observers

    def set_handlers(self, handlers: Handlers) -> None:
        """A reloaded filter chain: this connection's next frames go through it."""
        self.handlers = handlers
        self._requests = handlers.requests
        self._responses = handlers.responses
        self._observers = handlers.observers

    # ------------------------------------------------------------------ events in

    def request(self, peek: RequestPeek, body: memoryview) -> RequestDecision:
        """A request arrived; None means relay it as received."""
        used = self.api_versions_used
        if used.get(peek.api_key, -1) < peek.api_version:
            used[peek.api_key] = peek.api_version
        if peek.client_id is not None:
            self.info.client_id = peek.client_id
        gate = self.shared.sasl_gate
        if gate is not None and peek.api_key not in SASL_OPEN_APIS:
            refused: Close | None = gate(self, peek.api_key)
            if refused is not None:
                return refused
        handler = self._requests.get(peek.api_key)
        if handler is None:
            return None
        decision = handler.request(self, peek, body)
        if (isinstance(decision, Forward) and decision.then is not None
                and peek.expects_response):  # acks=0: no response to follow
            if peek.correlation_id in self.follow_ups:
                return Close("correlation id reused in flight", "protocol", "a client reused "
                             "a correlation id still in flight; connection closed")
            self.follow_ups[peek.correlation_id] = (peek.api_key, decision.then)
        return decision

    def handles_request(self, api_key: int) -> bool:
        """Whether a handler reads requests of ``api_key`` (else they may go as bytes);
        with SASL at the proxy, every request until a login, and all of a session
        that expires."""
        if self.shared.sasl_gate is not None and (
                not self.authenticated or self.session_expiry is not None):
            return True
        return api_key in self._requests

    def in_lane(self, api_key: int) -> bool:
        """Whether a request of ``api_key`` is decided without waiting, so the express
        lane may take it: no handler, or one that says so (``decides_now``: whatever it
        returns is applied as returned, never asked again). Never with SASL at the
        proxy."""
        if self.shared.sasl_gate is not None:
            return False
        handler = self._requests.get(api_key)
        return handler is None or getattr(handler, "decides_now", False)

    def wants_response(self, api_key: int, api_version: int) -> bool:
        """Whether a response must be seen whole; every other one is relayed as bytes."""
        handler = self._responses.get(api_key)
        if handler is not None and handler.wants(api_version):
            return True
        return bool(self.follow_ups) and self._followed(api_key)  # no call, usually

    def _followed(self, api_key: int) -> bool:
        """A follow-up waits on a response of ``api_key`` (it reads the response whole)."""
        return any(key == api_key for key, _ in self.follow_ups.values())

    def response_stream(self, api_key: int, api_version: int, upstream_version: int,
                        size: int) -> ResponseStream | None:
        """How a response it ``wants_response`` can be relayed as it arrives, rewritten
        on the way; None when it must be received whole."""
        if api_version != upstream_version or self._followed(api_key):
            return None
        stream = getattr(self._responses.get(api_key), "stream", None)
        return None if stream is None else stream(self, api_version, size)

    def response(self, api_key: int, api_version: int, upstream_version: int,
                 body: memoryview) -> Handled:
        """A whole response to a request of ``api_key``/``api_version`` (``wants_response``)."""
        handled = self.response_if_wanted(api_key, api_version, upstream_version, body)
        return Handled() if handled is None else handled

    def response_if_wanted(self, api_key: int, api_version: int, upstream_version: int,
                           body: memoryview) -> Handled | None:
        """``response`` when the response is wanted whole (``wants_response``), else None
        (it is relayed as received): both questions in one call, as every whole response
        asks them."""
        handler = self._responses.get(api_key)
        if handler is not None and handler.wants(api_version):
            handled = handler.response(self, api_version, upstream_version, body)
        elif self.follow_ups and self._followed(api_key):
            handled = Handled()
        else:
            return None
        if self.follow_ups:
            follow = self.follow_ups.pop(int.from_bytes(body[:4], "big", signed=True), None)
            if follow is not None:
                current = body if handled.body is None else memoryview(handled.body)
                handled.body = follow[1](current, api_version)
        return handled

    def observe(self, api_key: int, api_version: int, body: memoryview) -> None:
        """A whole response relayed as bytes (no handler wanted it)."""
        observer = self._observers.get(api_key)
        if observer is not None:
            observer.observe(self, api_version, body, True)

    def observe_head(self, api_key: int, api_version: int,
                     parts: Sequence[memoryview | bytes]) -> None:
        """The first bytes (size prefix included) of a response passed through."""
        observer = self._observers.get(api_key)
        if observer is None:
            return
        head = bytearray()
        for part in parts:
            head += part[: OBSERVED_HEAD_BYTES + 4 - len(head)]
            if len(head) >= OBSERVED_HEAD_BYTES + 4:
                break
        observer.observe(self, api_version, memoryview(head)[4:], False)

    def connected(self, upstream: HostPort) -> bool:
        """Records the broker reached; False when it must not be used.

        A bootstrap connect that began before a reload can complete to a server the new
        list dropped (another cluster, perhaps): the session ends that connection, as it
        would have ended had it been open at the change.
        """
        self.upstream = upstream
        shared = self.shared
        if self.node_id is not None:
            return True
        if upstream not in shared.upstream_servers:
            return False
        if shared.relisted_at == shared.epoch:
            self.reached_relisted = shared.epoch
        return True

    def on_change(self, change: Change) -> str | None:
        """The backend changed: the outcome to count if this connection must end."""
        if self.reached_relisted is not None and change.epoch == self.reached_relisted + 1:
            # The reload's own change (its discovery, or the forced bump): what this
            # connection's client read came from the new list already.
            self.connected_epoch = change.epoch
            if self.topology_epoch is not None:
                self.topology_epoch = change.epoch
        self.reached_relisted = None
        shared = self.shared
        outcome = on_change(change, self.connected_epoch, self.node_id, self.upstream,
                            shared.upstream_servers, self.metadata_version,
                            shared.legacy_clients)
        self.ended_by_change = self.ended_by_change or outcome is not None
        return outcome

    # ------------------------------------------------------------------ for handlers

    def saw_topology(self) -> int:
        """The epoch this connection held before a Metadata response; a first one is current."""
        if self.topology_epoch is None:
            self.topology_epoch = self.shared.epoch
        return self.topology_epoch

    def log_fields(self) -> dict[str, object]:
        info = self.info
        return {"listener": self.listener, "client": f"{info.source_address}:"
                f"{info.source_port}", "client_id": info.client_id}
