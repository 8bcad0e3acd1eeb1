"""When a client must bootstrap again (KIP-1102), and how to tell it.

The backend view has an epoch that moves whenever the broker set, a broker's
address or the cluster id changes. A client remembers the epoch it last saw in a
Metadata response; the proxy remembers it per client, keyed by (source address,
client id), so that a client reconnecting after its old connections were closed
is still recognised as holding stale metadata. A stale client's next Metadata
response at v13+ carries REBOOTSTRAP_REQUIRED once; a client below v13 cannot
understand it and is either disconnected (so it reconnects through the bootstrap
listener) or left alone, as configured.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum

REBOOTSTRAP_REQUIRED = 129
FIRST_VERSION_WITH_TOP_LEVEL_ERROR = 13

ClientKey = tuple[str, str]  # (source address, client id)


class Action(Enum):
    NONE = "none"  # up to date: a normal response
    INJECT = "inject"  # v13+: top-level ErrorCode = 129
    CLOSE = "close"  # below v13, legacy policy close: send, then close the connection
    IGNORE = "ignore"  # below v13, legacy policy ignore: a normal response, counted


@dataclass
class RebootstrapPolicy:
    legacy_clients: str = "close"  # "close" | "ignore"
    max_clients: int = 100_000
    epoch: int = 0

    def __post_init__(self) -> None:
        self._seen: OrderedDict[ClientKey, int] = OrderedDict()

    def bump(self, epoch: int) -> None:
        self.epoch = max(self.epoch, epoch)

    def epoch_for_new_connection(self, key: ClientKey) -> int:
        """A new connection inherits what its client last saw; a new client is current."""
        return self._seen.get(key, self.epoch)

    def remember(self, key: ClientKey, epoch: int) -> None:
        self._seen[key] = epoch
        self._seen.move_to_end(key)
        while len(self._seen) > self.max_clients:
            self._seen.popitem(last=False)

    def metadata_response(self, key: ClientKey, connection_epoch: int,
                          client_version: int) -> tuple[Action, int]:
        """What to do with a Metadata response; returns the action and the new epoch."""
        if connection_epoch >= self.epoch:
            self.remember(key, self.epoch)
            return Action.NONE, self.epoch
        self.remember(key, self.epoch)
        if client_version >= FIRST_VERSION_WITH_TOP_LEVEL_ERROR:
            return Action.INJECT, self.epoch
        return (Action.CLOSE if self.legacy_clients == "close" else Action.IGNORE), self.epoch
