"""The filter chain: built-in and configured filters composed into one handler table.

A connection dispatches on a table by API key (``policies.connection.Handlers``). The
chain builds that table: for each API key, the configured filters that read it, in
their configured order, then the built-in filter that owns it (closest to the broker:
it rewrites what the broker must see, e.g. Metadata v13 sent as v12). Responses go the
other way: the built-in first (addresses rewritten), then the configured filters in
reverse order, so each filter sees the client's view of both directions.

An API key only built-ins read gets the built-in handler itself: frames no configured
filter declares cost what they cost before the chain. Configured filters fail closed
(see ``api``) and each decision is counted (``DecisionCounts``); built-ins are not
counted (their effects have metrics of their own).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kproxy.codecs.api_keys import api_name
from kproxy.codecs.errors import CodecError
from kproxy.codecs.peek import RequestPeek
from kproxy.codecs.schema import MAX_VERSION, Versions
from kproxy.policies.connection import (
    Answer,
    AnswerLater,
    Close,
    ConnectionState,
    FollowUp,
    Forward,
    Handled,
    Handlers,
    Refuse,
    RequestDecision,
    RequestHandler,
    ResponseHandler,
    ResponseObserver,
)
from kproxy.policies.filters.api import Filter

DECISIONS = ("forward", "changed", "answer", "close", "error", "denied")


class DecisionCounts:
    """Decisions per (filter, decision), plain numbers; kept across reloads. Filter names
    come from the config, so the table is bounded by it."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}

    def add(self, name: str, decision: str) -> None:
        key = (name, decision)
        self.counts[key] = self.counts.get(key, 0) + 1


@dataclass(frozen=True)
class BuiltinFilter:
    """Handlers the proxy always runs (address rewriting, ApiVersions, telemetry), named
    so the chain and the status page show them beside the configured ones."""

    name: str
    handlers: Handlers
    description: str


class FilterChain:
    """Built-in filters plus the configured ones, as one ``Handlers`` table."""

    def __init__(self, builtins: Iterable[BuiltinFilter], filters: Iterable[Filter],
                 counts: DecisionCounts | None = None) -> None:
        self.builtins = list(builtins)
        self.filters = list(filters)
        self.counts = counts or DecisionCounts()
        self.handlers = self._compose()

    def _compose(self) -> Handlers:
        requests: dict[int, RequestHandler] = {}
        responses: dict[int, ResponseHandler] = {}
        observers: dict[int, ResponseObserver] = {}
        for builtin in self.builtins:
            requests.update(builtin.handlers.requests)
            responses.update(builtin.handlers.responses)
            observers.update(builtin.handlers.observers)
        for key in sorted({k for f in self.filters for k in f.requests}):
            stages = [f for f in self.filters if key in f.requests]
            requests[key] = ChainedRequest(key, stages, requests.get(key), self.counts)
        for key in sorted({k for f in self.filters for k in f.responses}):
            stages = [f for f in reversed(self.filters) if key in f.responses]
            responses[key] = ChainedResponse(key, stages, responses.get(key), self.counts)
        return Handlers(requests, responses, observers)

    def caps(self, base: dict[int, int]) -> dict[int, int]:
        """``base`` (API key → highest version advertised) lowered to what every
        configured filter can read of the APIs it declares."""
        caps = dict(base)
        for flt in self.filters:
            for key, versions in (*flt.requests.items(), *flt.responses.items()):
                caps[key] = min(caps.get(key, MAX_VERSION), versions.hi)
        return caps

    def describe(self) -> list[dict[str, object]]:
        """The chain as the status page lists it: configured filters first (client side)."""
        rows: list[dict[str, object]] = []
        for flt in self.filters:
            rows.append({"name": flt.name, "type": flt.kind or type(flt).__name__,
                         "builtin": False, "apis": _apis(flt), "description": flt.describe(),
                         "decisions": {d: n for (name, d), n in self.counts.counts.items()
                                       if name == flt.name}})
        for builtin in self.builtins:
            keys = {*builtin.handlers.requests, *builtin.handlers.responses,
                    *builtin.handlers.observers}
            rows.append({"name": builtin.name, "type": "built-in", "builtin": True,
                         "apis": ", ".join(api_name(k) for k in sorted(keys)),
                         "description": builtin.description, "decisions": {}})
        return rows


def _apis(flt: Filter) -> str:
    keys = sorted({*flt.requests, *flt.responses})
    parts = []
    for key in keys:
        versions = flt.requests.get(key) or flt.responses[key]
        side = "+".join(s for s, table in (("requests", flt.requests),
                                           ("responses", flt.responses)) if key in table)
        parts.append(f"{api_name(key)} v{versions} ({side})")
    return ", ".join(parts)


def _then(first: FollowUp | None, second: FollowUp | None) -> FollowUp | None:
    """Follow-ups of two stages: the later stage (nearer the broker) sees the response first."""
    if first is None or second is None:
        return first or second

    def both(body: memoryview, version: int) -> bytes:
        return first(memoryview(second(body, version)), version)

    return both


def _kind(decision: Answer | AnswerLater | Close | Refuse) -> str:
    return "close" if isinstance(decision, Close | Refuse) else "answer"


class ChainedRequest:
    """One API's requests through the configured filters, then the built-in handler."""

    def __init__(self, api_key: int, filters: list[Filter], builtin: RequestHandler | None,
                 counts: DecisionCounts) -> None:
        self.api_key = api_key
        self.filters = filters
        self.builtin = builtin
        self.counts = counts

    def request(self, conn: ConnectionState, peek: RequestPeek,
                body: memoryview) -> RequestDecision:
        forward: Forward | None = None
        current = body
        api = api_name(self.api_key)
        for flt in self.filters:
            versions = flt.requests[self.api_key]
            if peek.api_version not in versions:
                self.counts.add(flt.name, "close")
                return Close(f"filter {flt.name} cannot read {api} v{peek.api_version}",
                             "filter_version", f"filter {flt.name!r} reads {api} "
                             f"v{versions} only, the client sent v{peek.api_version}; "
                             "connection closed (a new one learns the capped versions)", api)
            try:
                decision = flt.on_request(conn, peek, current)
            except Exception as exc:  # a filter that fails, fails closed
                self.counts.add(flt.name, "error")
                return Close(f"filter {flt.name} failed: {exc}", "filter_error",
                             f"filter {flt.name!r} failed on a {api} request "
                             f"({type(exc).__name__}: {exc}); connection closed", api)
            if decision is None:
                self.counts.add(flt.name, "forward")
                continue
            if not isinstance(decision, Forward):
                self.counts.add(flt.name, _kind(decision))
                return decision
            self.counts.add(flt.name, "changed")
            forward = Forward(decision.body, decision.upstream_version,
                              _then(forward.then if forward else None, decision.then))
            current = memoryview(decision.body)
        if self.builtin is not None:
            decision = self.builtin.request(conn, peek, current)
            if decision is not None and not isinstance(decision, Forward):
                return decision
            if decision is not None:
                forward = Forward(decision.body, decision.upstream_version,
                                  _then(forward.then if forward else None, decision.then))
        return forward


class ChainedResponse:
    """One API's responses through the built-in handler, then the configured filters
    (in reverse order). A response at a version a filter cannot read ends the
    connection: ``CodecError``, as for any response the proxy cannot read."""

    def __init__(self, api_key: int, filters: list[Filter], builtin: ResponseHandler | None,
                 counts: DecisionCounts) -> None:
        self.api_key = api_key
        self.filters = filters
        self.builtin = builtin
        self.counts = counts

    def wants(self, api_version: int) -> bool:
        return True

    def response(self, conn: ConnectionState, api_version: int, upstream_version: int,
                 body: memoryview) -> Handled:
        builtin = self.builtin
        handled = (builtin.response(conn, api_version, upstream_version, body)
                   if builtin is not None and builtin.wants(api_version) else Handled())
        current = body if handled.body is None else memoryview(handled.body)
        api = api_name(self.api_key)
        for flt in self.filters:
            versions: Versions = flt.responses[self.api_key]
            if api_version not in versions:
                self.counts.add(flt.name, "close")
                raise CodecError(f"filter {flt.name!r} reads {api} responses v{versions} "
                                 f"only, not v{api_version}", what=f"{api}Response")
            try:
                out = flt.on_response(conn, self.api_key, api_version, current)
            except Exception as exc:  # fails closed: the session ends
                self.counts.add(flt.name, "error")
                raise CodecError(f"filter {flt.name!r} failed on a {api} response "
                                 f"({type(exc).__name__}: {exc})",
                                 what=f"{api}Response") from None
            self.counts.add(flt.name, "forward" if out is None else "changed")
            if out is not None:
                current = memoryview(out)
                handled.body = out
        return handled
