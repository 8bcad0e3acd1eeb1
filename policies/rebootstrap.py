"""When a client must bootstrap again (KIP-1102), and how to tell it.

The backend view has an epoch that moves whenever the broker set, a broker's
address or the cluster id changes. A client remembers the epoch it last saw in a
Metadata response; the proxy remembers it per client, keyed by (source address,
client id), so that a client reconnecting after its old connections were closed
is still recognised as holding stale metadata. A stale client's next Metadata
response at v13+ carries REBOOTSTRAP_REQUIRED once; a client below v13 cannot
understand it and is either disconnected (so it reconnects through the bootstrap
listener) or left alone, as configured.

The memory is bounded in count (``max_clients``, least recently seen out first)
and in bytes: the client id in a key is shortened to ``MAX_KEY_CHARS`` (a prefix
and a digest), so a flood of distinct long client ids costs a few hundred bytes
per remembered client at most.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum

from kproxy.policies.bounds import MAX_KEY_CHARS, bounded

REBOOTSTRAP_REQUIRED = 129
FIRST_VERSION_WITH_TOP_LEVEL_ERROR = 13

ClientKey = tuple[str, str]  # (source address, client id)
DEFAULT_MAX_CLIENTS = 100_000


def bounded_key(key: ClientKey) -> ClientKey:
    """The key as remembered: the client id (chosen by the client) shortened."""
    address, client_id = key
    return bounded(address, MAX_KEY_CHARS), bounded(client_id, MAX_KEY_CHARS)


class Action(Enum):
    NONE = "none"  # up to date: a normal response
    INJECT = "inject"  # v13+: top-level ErrorCode = 129
    CLOSE = "close"  # below v13, legacy policy close: send, then close the connection
    IGNORE = "ignore"  # below v13, legacy policy ignore: a normal response, counted


@dataclass
class RebootstrapPolicy:
    legacy_clients: str = "close"  # "close" | "ignore"
    max_clients: int = DEFAULT_MAX_CLIENTS
    epoch: int = 0

    def __post_init__(self) -> None:
        self._seen: OrderedDict[ClientKey, int] = OrderedDict()

    def bump(self, epoch: int) -> None:
        self.epoch = max(self.epoch, epoch)

    def epoch_for_new_connection(self, key: ClientKey) -> int:
        """A new connection inherits what its client last saw; a new client is current."""
        return self._seen.get(bounded_key(key), self.epoch)

    def __len__(self) -> int:
        return len(self._seen)

    def remember(self, key: ClientKey, epoch: int) -> None:
        key = bounded_key(key)
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
