"""What a filter is: a sans-IO class that sees the requests and responses it declares.

A filter names the APIs it must read (``requests``, ``responses``: API key → the
versions it can read). Only frames of those APIs reach it; every other frame keeps
the proxy's pass-through path and costs nothing more. A client is never offered a
version above what a filter can read: the proxy caps it in ApiVersions (or removes the
API when even its lowest version is above). A request at a version outside the
declared range still closes the connection (fail closed), so a client that skipped
ApiVersions, or negotiated before a reload added the filter, reconnects and learns.

Decisions are the connection's (``policies.connection``): ``None`` forward unchanged,
``Forward`` forward changed (with ``then`` to rewrite the response on its way back),
``Answer`` answer with this response instead, ``Close`` end the connection. A filter
that raises fails closed: the connection is closed and the error counted.

A filter is built from its ``[[filters]]`` table: the class is called with the
table's other keys as keyword arguments; a bad value raises ``FilterConfigError``
naming its key. No trio, no sockets, no clock of its own: a filter is per-proxy and
its per-connection state, if any, lives in what it returns (``Forward.then``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kproxy.codecs.interpreter import Message
from kproxy.codecs.messages import decode_request
from kproxy.codecs.peek import RequestPeek
from kproxy.codecs.schema import Versions
from kproxy.policies.connection import ConnectionState, RequestDecision

__all__ = ["Filter", "FilterConfigError", "Versions"]


class FilterConfigError(ValueError):
    """A bad value in a filter's table; ``key`` names it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


class Filter:
    """Subclass this; override ``on_request`` and/or ``on_response``."""

    # The config's ``type``, shown on the status page (a user filter's import path).
    kind: str = ""
    requests: Mapping[int, Versions] = {}
    responses: Mapping[int, Versions] = {}
    name: str = ""  # from the config table; set by the proxy

    @classmethod
    def from_config(cls, options: Mapping[str, Any], base: Path) -> Filter:
        """Build from the ``[[filters]]`` table's own keys (``name`` and ``type`` taken
        out); ``base`` is the config file's folder, for relative paths."""
        return cls(**options)

    def on_request(self, conn: ConnectionState, peek: RequestPeek,
                   body: memoryview) -> RequestDecision:
        """A request of a declared API and version (``body``: header included)."""
        return None

    def on_response(self, conn: ConnectionState, api_key: int, api_version: int,
                    body: memoryview) -> bytes | None:
        """A whole response of a declared API, at the client's version; None: unchanged."""
        return None

    def describe(self) -> str:
        """One line for the status page: what this filter does."""
        return ""

    @staticmethod
    def decode(body: memoryview) -> Message:
        """The body of a request of an API the proxy has a schema for (``codecs/registry``)."""
        return decode_request(body).body
