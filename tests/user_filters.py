"""A user's filter, loaded by import path in the tests (``type = "tests.user_filters:..."``):
written only against kproxy's filter API, as a filter in another package would be."""

from __future__ import annotations

from kproxy.codecs import api_keys
from kproxy.codecs.peek import RequestPeek
from kproxy.policies.connection import Close, ConnectionState, RequestDecision
from kproxy.policies.filters.api import Filter, FilterConfigError, Versions


class ClientIdGate(Filter):
    """Closes connections whose Metadata requests come from the client id ``refuse``."""

    requests = {api_keys.METADATA: Versions(0, 13)}

    def __init__(self, refuse: str) -> None:
        if not refuse:
            raise FilterConfigError("refuse", "a client id is needed")
        self.refuse = refuse

    def on_request(self, conn: ConnectionState, peek: RequestPeek,
                   body: memoryview) -> RequestDecision:
        topics = self.decode(body).get("topics") or []  # decoded, as a filter may need
        if peek.client_id == self.refuse:
            return Close(f"client id {self.refuse} refused", "client_id_gate",
                         f"client id {self.refuse!r} refused ({len(topics)} topics asked)",
                         "Metadata")
        return None

    def describe(self) -> str:
        return f"closes connections of client id {self.refuse!r}"
