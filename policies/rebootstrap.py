"""When a client must bootstrap again (KIP-1102), and how to tell it.

The backend view (``policies.topology``) holds the one topology epoch; it moves
whenever the broker set, a broker's address or the cluster id changes. Each client
connection records the epoch of the view its client last received through it: the
epoch current at its first Metadata response, then at every later one. A connection
whose recorded epoch is older than the view's learns of the change once, in its next
Metadata response: at v13+ as the top-level ``REBOOTSTRAP_REQUIRED``; below v13 a
client cannot read that, and is either disconnected (it reconnects through the
bootstrap listener) or left alone, as configured.

A connection opened after a change (or whose first Metadata response comes after
it) starts at the current epoch: its client bootstrapped after the change, and
telling it again would make it bootstrap twice for one change. Connections to a
backend that is gone are closed rather than told (``on_change``).
"""

from __future__ import annotations

from collections.abc import Collection
from enum import Enum

from kproxy.codecs.error_codes import ErrorCode
from kproxy.policies.metadata_bridge import BRIDGED_VERSION
from kproxy.policies.topology import Change

REBOOTSTRAP_REQUIRED = ErrorCode.REBOOTSTRAP_REQUIRED
HostPort = tuple[str, int]


class Action(Enum):
    NONE = "none"  # up to date: a normal response
    INJECT = "injected"  # v13+: top-level ErrorCode = 129
    CLOSE = "legacy_closed"  # below v13, legacy policy close: send, then close
    IGNORE = "legacy_ignored"  # below v13, legacy policy ignore: a normal response, counted


def metadata_action(connection_epoch: int, current_epoch: int, client_version: int,
                    legacy_clients: str) -> Action:
    """What a Metadata response on a connection that last saw ``connection_epoch`` gets."""
    if connection_epoch >= current_epoch:
        return Action.NONE
    if client_version >= BRIDGED_VERSION:
        return Action.INJECT
    return Action.CLOSE if legacy_clients == "close" else Action.IGNORE


def on_change(change: Change, connected_epoch: int, node_id: int | None,
              upstream: HostPort | None, servers: Collection[HostPort],
              metadata_version: int | None, legacy_clients: str) -> str | None:
    """Whether a connection must end (stop reading, finish what is in flight) on ``change``.

    Returns the outcome to count (``upstream_gone``, ``legacy_closed``) or None to keep
    it open; kept v13+ connections learn of the change in their next Metadata response.
    """
    if connected_epoch >= change.epoch:
        return None  # opened after the change: it already talks to the new backend
    if node_id is not None:
        gone = change.cluster_id is not None or node_id in change.invalid_nodes
    elif upstream is None:
        # A bootstrap connection still connecting: it reaches a current server (the
        # session checks, ``reached_current``), so its client's first Metadata answer
        # already describes the new backend; closing it would bootstrap the client twice.
        return None
    else:
        gone = change.cluster_id is not None or upstream not in servers
    if gone:
        return "upstream_gone"
    if (legacy_clients == "close" and metadata_version is not None
            and metadata_version < BRIDGED_VERSION):
        return "legacy_closed"
    return None
