"""How a session ends, as exceptions: one family per cause, converted once at the edge.

``SessionClosed``: the proxy decided to close (a limit, a timeout, a refused request,
an undecodable frame). ``PeerGone``: the other side went away (end of stream, reset,
broken pipe) — transports raise it for every such error, so the session never sees a
raw ``OSError`` or trio stream error. ``ProtocolViolation``: a peer broke the
protocol's rules without the bytes being undecodable (a response nobody asked for).
"""

from __future__ import annotations


class SessionClosed(Exception):
    """Ends a session; the message says why, for the log."""


class PeerGone(Exception):
    """The peer closed or reset the connection, or it broke under us."""


class ProtocolViolation(Exception):
    """Well-formed bytes that break the protocol's rules (e.g. response ordering)."""
