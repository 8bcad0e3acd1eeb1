"""What the proxy knows of each consumer group, from the membership traffic it relays.

Pure state, fed one observation at a time with the time passed in: a JoinGroup or
SyncGroup exchange, a heartbeat's error, a LeaveGroup, a KIP-848 heartbeat, a commit,
a high watermark. A *rebalance* runs from the first JoinGroup of a round to the last
SyncGroup response of the generation it makes (KIP-848: from a member joining, leaving
or the epoch moving until every member has reached the new epoch); each completed one
is handed to ``on_rebalance``. Everything keyed by client input is bounded: groups and
the members, errors and partitions of each are LRU-capped, label values truncated.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

from kproxy.codecs.error_codes import ErrorCode, error_name
from kproxy.policies.group_model import (
    DEFAULT_REBALANCE_TIMEOUT,
    MAX_ERROR_NAMES,
    RECENT_GENERATIONS,
    Group,
    GroupLimits,
    Member,
    Rebalance,
    clip,
    touch,
)

__all__ = ["RECENT_GENERATIONS", "Group", "GroupLimits", "GroupTracker", "Member",
           "Rebalance", "clip"]

class GroupTracker:
    """Every group the proxy has seen recently; see the module docstring."""

    def __init__(self, limits: GroupLimits | None = None,
                 on_rebalance: Callable[[Rebalance], None] | None = None) -> None:
        self.limits = limits or GroupLimits()
        self.on_rebalance = on_rebalance
        self.groups: OrderedDict[str, Group] = OrderedDict()
        # High watermarks by (topic, partition), from Fetch responses; LRU-bounded.
        self.watermarks: OrderedDict[tuple[str, int], int] = OrderedDict()
        self.watermark_at: dict[tuple[str, int], float] = {}  # when each was last seen
        self.evicted_groups = 0
        self.decode_failures = 0

    # ------------------------------------------------------------------ helpers

    def group(self, group_id: str, now: float) -> Group:
        g, evicted = touch(self.groups, clip(group_id, self.limits), now, Group,
                            self.limits.max_groups)
        self.evicted_groups += evicted
        return g

    def _member(self, g: Group, member_id: str, now: float) -> Member | None:
        if not member_id:
            return None
        return touch(g.members, clip(member_id, self.limits), now, Member,
                      self.limits.max_members)[0]

    def _drop(self, g: Group, member_id: str, now: float) -> bool:
        """A member gone (left, unknown, fenced): removed, and remembered as departed."""
        key = clip(member_id, self.limits)
        g.departed[key] = now
        g.departed.move_to_end(key)
        while len(g.departed) > self.limits.max_members:
            g.departed.popitem(last=False)
        return g.members.pop(key, None) is not None

    def error(self, group_id: str, code: int, now: float) -> None:
        """A member was answered with an error (counted by name)."""
        if code == ErrorCode.NONE:
            return
        g = self.group(group_id, now)
        name = error_name(code)
        if name in g.errors or len(g.errors) < MAX_ERROR_NAMES:
            g.errors[name] = g.errors.get(name, 0) + 1

    def _start_round(self, g: Group, now: float, reason: str) -> None:
        if g.round_started is not None:
            return
        g.round_started = now
        g.round_members_before = g.generation_size
        g.round_reason = reason
        g.round_generation = -1
        g.round_expected = None
        g.round_joined = set()
        g.round_synced = set()

    def _complete(self, g: Group, now: float, generation: int) -> None:
        assert g.round_started is not None
        g.rebalances += 1
        g.generation_size = len(g.members)
        reason = g.round_reason or "unknown"
        g.completed.append((generation, now, max(0.0, now - g.round_started), reason))
        event = Rebalance(g.group_id, generation, g.round_members_before, len(g.members),
                          max(0.0, now - g.round_started), reason, g.protocol, g.assignor, now)
        g.round_started = None
        g.left_since_round = 0
        if self.on_rebalance is not None:
            self.on_rebalance(event)

    # ------------------------------------------------------------------ classic protocol

    def join_request(self, group_id: str, member_id: str, protocol_type: str,
                     reason: str | None, now: float, rebalance_timeout_ms: int = -1) -> None:
        g = self.group(group_id, now)
        g.protocol_type = clip(protocol_type, self.limits)
        longest = 2 * (rebalance_timeout_ms / 1000 if rebalance_timeout_ms > 0
                       else DEFAULT_REBALANCE_TIMEOUT)
        if g.round_started is not None and now - g.round_started > longest:
            # A round we never saw complete (some members' SyncGroups went through
            # another proxy, or were lost): abandon it rather than time the next one
            # from its start.
            g.round_started = None
            g.abandoned_rounds += 1
        if g.round_started is None:
            why = reason or ("member left" if g.left_since_round
                             else "new member" if not member_id or member_id not in g.members
                             else "member rejoined")
            self._start_round(g, now, clip(why, self.limits))

    def join_response(self, group_id: str, error_code: int, generation: int,
                      protocol_name: str | None, leader: str, member_id: str,
                      members: list[str] | None, now: float) -> None:
        """``members`` is the full member list, sent to the leader only."""
        if error_code != ErrorCode.NONE:
            self.error(group_id, error_code, now)
            return
        g = self.group(group_id, now)
        self._start_round(g, now, "join")  # a round whose first JoinGroup we missed
        if generation != g.round_generation:
            g.round_generation = generation
            g.round_joined = set()
            g.round_synced = set()
            g.round_expected = None
        if protocol_name:
            g.assignor = clip(protocol_name, self.limits)
        key = clip(member_id, self.limits)
        g.round_joined.add(key)
        if members is not None:
            g.round_expected = {clip(m, self.limits) for m in members}
            g.roster = (generation, frozenset(g.round_expected), now)
        self._member(g, member_id, now)

    def sync_response(self, group_id: str, member_id: str, generation: int, error_code: int,
                      assigned: int | None, now: float) -> None:
        """A member's SyncGroup response; ``assigned`` partitions when its assignment
        was readable."""
        if error_code != ErrorCode.NONE:
            self.error(group_id, error_code, now)
            return
        g = self.group(group_id, now)
        m = self._member(g, member_id, now)
        if m is not None:
            m.generation = generation
            m.assigned = assigned
        if g.round_started is None or generation != g.round_generation:
            return
        g.round_synced.add(clip(member_id, self.limits))
        expected = g.round_expected if g.round_expected is not None else g.round_joined
        if g.round_synced >= expected:
            # The generation is complete: members not in it have gone.
            keep = g.round_expected if g.round_expected is not None else None
            if keep is not None:
                for gone in [k for k in g.members if k not in keep]:
                    del g.members[gone]
            g.generation = generation
            self._complete(g, now, generation)

    def heartbeat(self, group_id: str, member_id: str, error_code: int, now: float) -> None:
        g = self.group(group_id, now)
        self._member(g, member_id, now)
        if error_code == ErrorCode.NONE:
            return
        self.error(group_id, error_code, now)
        if error_code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID):
            self._drop(g, member_id, now)

    def leave(self, group_id: str, member_ids: Iterable[str], error_code: int,
              now: float) -> None:
        if error_code != ErrorCode.NONE:
            self.error(group_id, error_code, now)
            return
        g = self.group(group_id, now)
        for member_id in member_ids:
            if self._drop(g, member_id, now):
                g.left_since_round += 1

    # ------------------------------------------------------------------ KIP-848

    def consumer_heartbeat(self, group_id: str, request_member_id: str, request_epoch: int,
                           assignor: str | None, error_code: int, member_id: str | None,
                           member_epoch: int, assigned: int | None, now: float,
                           protocol: str = "consumer") -> None:
        """One heartbeat exchange (request and response together) of a group whose
        coordinator assigns: ConsumerGroupHeartbeat, or the same epoch rules for
        ``protocol`` "share" (ShareGroupHeartbeat) and "streams" (StreamsGroupHeartbeat,
        whose tasks count as its assigned partitions)."""
        g = self.group(group_id, now)
        g.kip848 = True
        g.protocol = g.protocol_type = protocol
        if assignor:
            g.assignor = clip(assignor, self.limits)
        elif not g.assignor:
            g.assignor = "server"
        if error_code != ErrorCode.NONE:
            self.error(group_id, error_code, now)
            if error_code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH):
                self._drop(g, request_member_id, now)
            return
        if request_epoch < 0:  # -1: leaving; -2: a static member leaving for now
            if self._drop(g, request_member_id, now):
                self._start_round(g, now, "member left")
                g.left_since_round += 1
            self._check_epochs(g, now)
            return
        who = member_id or request_member_id
        is_new = request_epoch == 0 or clip(who, self.limits) not in g.members
        if is_new:
            self._start_round(g, now, "new member")
        m = self._member(g, who, now)
        if m is None:
            return
        m.generation = member_epoch
        if assigned is not None:
            m.assigned = assigned
        if member_epoch > g.round_generation:
            if g.round_generation >= 0 or is_new:
                self._start_round(g, now, "epoch bump")
            g.round_generation = member_epoch
        self._check_epochs(g, now)

    def _check_epochs(self, g: Group, now: float) -> None:
        """A KIP-848 round is over when every member has reached the newest epoch."""
        if g.round_started is None or not g.members:
            return
        target = max(m.generation for m in g.members.values())
        if all(m.generation == target for m in g.members.values()):
            g.generation = target
            self._complete(g, now, target)

    def identify(self, group_id: str, member_id: str | None, client_id: str | None,
                 software: str, now: float) -> None:
        """Who a member is: its connection's client id and software. A member is not made
        here (nor the group): only one the traffic above made is labelled."""
        g = self.groups.get(clip(group_id, self.limits))
        m = g.members.get(clip(member_id, self.limits)) if g and member_id else None
        if m is not None:
            m.client_id = clip(client_id, self.limits)
            m.software = clip(software, self.limits)

    # ------------------------------------------------------------------ offsets

    def committed(self, group_id: str, offsets: Iterable[tuple[str, int, int]],
                  now: float) -> None:
        """Offsets the coordinator accepted: (topic, partition, next offset to consume)."""
        g = self.group(group_id, now)
        cap = self.limits.max_partitions
        for topic, partition, offset in offsets:
            key = (clip(topic, self.limits), partition)
            g.committed[key] = (offset, now)
            g.committed.move_to_end(key)
            while len(g.committed) > cap:
                g.committed.popitem(last=False)

    def high_watermarks(self, marks: Iterable[tuple[str, int, int]],
                        now: float = 0.0) -> None:
        wm = self.watermarks
        cap = self.limits.max_partitions
        for topic, partition, hwm in marks:
            if hwm < 0:
                continue
            key = (clip(topic, self.limits), partition)
            wm[key] = hwm
            self.watermark_at[key] = now
            wm.move_to_end(key)
            while len(wm) > cap:
                self.watermark_at.pop(wm.popitem(last=False)[0], None)

    # ------------------------------------------------------------------ reading

    def expire(self, now: float) -> None:
        """Forget groups, members and commits not seen within the expiry."""
        horizon = now - self.limits.expiry_seconds
        for key in [k for k, g in self.groups.items() if g.last_seen < horizon]:
            del self.groups[key]
        for g in self.groups.values():
            for gone in [k for k, m in g.members.items() if m.last_seen < horizon]:
                del g.members[gone]
            for key2 in [k for k, (_, t) in g.committed.items() if t < horizon]:
                del g.committed[key2]
            for gone in [k for k, t in g.departed.items() if t < horizon]:
                del g.departed[gone]

    def lag(self, g: Group) -> list[tuple[str, int, int]]:
        """(topic, partition, lag) where both a commit and a high watermark were seen."""
        out = []
        for (topic, partition), (offset, _) in g.committed.items():
            hwm = self.watermarks.get((topic, partition))
            if hwm is not None and offset >= 0:
                out.append((topic, partition, max(0, hwm - offset)))
        return out
