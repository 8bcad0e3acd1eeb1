"""The consumer-group model: what the proxy remembers of a group and its members.

Plain data with their bounds; ``policies.groups``' ``GroupTracker`` changes it as the
membership traffic it observes says. Split out so that each stays small enough to read.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

MAX_ERROR_NAMES = 32  # distinct error names kept per group
# Completed generations remembered per group, for a supervisor to count each once
# (``kproxy.metrics.group_merge``): more than can complete between two scrapes.
RECENT_GENERATIONS = 16
# JoinGroup v0 has no rebalance timeout: the coordinator then uses the session timeout;
# for abandoning a round we never saw complete, the consumer's default is long enough.
DEFAULT_REBALANCE_TIMEOUT = 300.0


@dataclass(frozen=True)
class GroupLimits:
    max_groups: int = 1_000
    max_members: int = 1_000  # per group; assigned-partition series are per member
    max_partitions: int = 10_000  # committed offsets per group, and watermarks overall
    max_label_chars: int = 128
    expiry_seconds: float = 600.0  # a group (or a committed offset) silent this long goes


_Entry = TypeVar("_Entry", "Group", "Member")


def touch(entries: OrderedDict[str, _Entry], key: str, now: float,
           make: Callable[[str, float], _Entry], limit: int) -> tuple[_Entry, int]:
    """The entry under ``key``, made if new, as the most recently seen; the least
    recently seen beyond ``limit`` are dropped. Returns it and how many were dropped."""
    entry = entries.get(key)
    if entry is not None:
        entries.move_to_end(key)
        entry.last_seen = now
        return entry, 0
    entry = entries[key] = make(key, now)
    evicted = 0
    while len(entries) > limit:
        entries.popitem(last=False)
        evicted += 1
    return entry, evicted


def clip(value: str | None, limits: GroupLimits) -> str:
    """A label value: client-chosen strings are truncated, never unbounded."""
    if not value:
        return ""
    return value if len(value) <= limits.max_label_chars else value[: limits.max_label_chars]


@dataclass
class Member:
    member_id: str
    last_seen: float
    generation: int = -1  # the generation (KIP-848: member epoch) it last reached
    assigned: int | None = None  # partitions assigned, once an assignment was seen
    client_id: str = ""  # of the connection it last spoke on, cut to the label bound
    software: str = ""  # "name version" from that connection's ApiVersions, if it said


@dataclass(frozen=True)
class Rebalance:
    """One completed rebalance, as logged and archived."""

    group: str
    generation: int
    members_before: int
    members_after: int
    seconds: float
    reason: str
    protocol: str  # "classic", "consumer" (KIP-848), "share" (KIP-932), "streams" (KIP-1071)
    assignor: str
    ended_at: float


@dataclass
class Group:
    group_id: str
    last_seen: float
    protocol_type: str = ""
    assignor: str = ""
    kip848: bool = False  # members heartbeat with epochs (consumer, share, streams)
    protocol: str = "classic"  # classic, consumer, share or streams
    generation: int = -1
    members: OrderedDict[str, Member] = field(default_factory=OrderedDict)
    rebalances: int = 0
    abandoned_rounds: int = 0
    generation_size: int = 0  # members of the last completed generation
    errors: dict[str, int] = field(default_factory=dict)
    # The round in progress: when it started, who was in before, why, and for the
    # classic protocol who must still receive its SyncGroup response.
    round_started: float | None = None
    round_members_before: int = 0
    round_reason: str = ""
    round_generation: int = -1
    round_expected: set[str] | None = None  # from the leader's JoinGroup response
    round_joined: set[str] = field(default_factory=set)
    round_synced: set[str] = field(default_factory=set)
    left_since_round: int = 0
    committed: OrderedDict[tuple[str, int], tuple[int, float]] = field(
        default_factory=OrderedDict)
    # What several workers' views are merged from (``kproxy.metrics.group_merge``):
    # the newest member list a leader was sent (generation, members, when), the recent
    # completed generations (generation, ended at, seconds, reason), and members that left or
    # were fenced, by when: a member one worker still holds may have left through another.
    roster: tuple[int, frozenset[str], float] | None = None
    completed: deque[tuple[int, float, float, str]] = field(
        default_factory=lambda: deque(maxlen=RECENT_GENERATIONS))
    departed: OrderedDict[str, float] = field(default_factory=OrderedDict)
