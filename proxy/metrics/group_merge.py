"""One consumer-group model out of several workers' views.

A group's members may connect through different workers, and each worker sees only
the traffic of its own connections. Each worker therefore hands the supervisor the
raw facts of its ``GroupTracker`` (``group_facts``, served on its loopback HTTP port
at ``/internal/facts``), and the supervisor merges them with one rule
(``GroupMerge``), so that ``/metrics`` shows what one process would:

- **generation**: the newest generation any worker saw completed wins;
- **rebalances**: counted once per (group, generation), whichever and however many
  workers saw that generation complete; the supervisor keeps its own counter, which
  never goes backwards (a restarted worker forgets, the supervisor does not), and
  observes each rebalance's duration once (the longest a worker saw: the one that
  saw the round start earliest);
- **members**: every member some worker holds, minus those that left or were fenced
  (through any worker) after it was last seen, minus those missing from the newest
  member list a leader was sent, if last seen before that list;
- **lag**, per partition: the newest high watermark minus the newest committed offset;
- protocol type and assignor: from the worker that saw the group last.

Workers share the machine's monotonic clock (one host), so their times compare.
Pure: no I/O, the time passed in. Bounded: the supervisor keeps per group only its
counter and the generations it counted (``KEPT_GENERATIONS``), for at most
``max_groups`` groups, each forgotten after ``expiry_seconds`` unreported.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from kproxy.metrics.exposition import value_text
from kproxy.policies.groups import RECENT_GENERATIONS, GroupLimits, GroupTracker

REBALANCE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
KEPT_GENERATIONS = 2 * RECENT_GENERATIONS
# The families the merge writes; a worker's own lines for them are left out.
FAMILIES = frozenset({
    "kproxy_group_rebalances", "kproxy_group_generation", "kproxy_group_members",
    "kproxy_group_info", "kproxy_group_assigned_partitions", "kproxy_group_lag",
    "kproxy_group_tracked", "kproxy_group_rebalance_seconds"})
Facts = dict[str, Any]


def group_facts(tracker: GroupTracker, now: float) -> Facts:
    """What a worker knows of its groups, as JSON-ready data (bounded as the tracker is)."""
    tracker.expire(now)
    groups: dict[str, Facts] = {}
    for g in tracker.groups.values():
        groups[g.group_id] = {
            "seen": g.last_seen, "protocol_type": g.protocol_type, "assignor": g.assignor,
            "generation": g.generation, "protocol": g.protocol,
            "round_started": g.round_started,
            "members": [[m.member_id, m.last_seen, m.generation, m.assigned, m.client_id,
                         m.software] for m in g.members.values()],
            "departed": [[k, t] for k, t in g.departed.items()],
            "roster": None if g.roster is None else [
                g.roster[0], sorted(g.roster[1]), g.roster[2]],
            "completed": [list(c) for c in g.completed],
            "committed": [[t, p, offset, at] for (t, p), (offset, at) in g.committed.items()],
        }
    # Every high watermark held (bounded by the tracker's partition cap), not only those
    # of partitions this worker saw committed: a consumer's fetches and its commits
    # often go through different workers.
    marks = [[t, p, hwm, tracker.watermark_at.get((t, p), 0.0)]
             for (t, p), hwm in tracker.watermarks.items()]
    return {"groups": groups, "watermarks": marks}


@dataclass
class _Counted:
    """The supervisor's memory of one group: its counter and the generations counted."""

    rebalances: int = 0
    generations: set[int] = field(default_factory=set)
    reported_at: float = 0.0

    def count(self, generation: int) -> bool:
        """True the first time ``generation`` is offered (older than all kept: counted)."""
        if generation in self.generations or (
                len(self.generations) >= KEPT_GENERATIONS and generation < min(self.generations)):
            return False
        self.generations.add(generation)
        while len(self.generations) > KEPT_GENERATIONS:
            self.generations.discard(min(self.generations))
        self.rebalances += 1
        return True


@dataclass
class MergedGroup:
    group_id: str
    generation: int
    members: dict[str, tuple[float, int, int | None]]  # member -> (seen, generation, assigned)
    protocol_type: str
    assignor: str
    lag: list[tuple[str, int, int]]
    rebalances: int
    protocol: str = "classic"  # classic, consumer, share or streams
    rebalancing_since: float | None = None  # a round in progress: when it started (monotonic)
    # Recent completed rebalances, newest last: (generation, ended at, seconds, reason).
    completed: list[tuple[int, float, float, str]] = field(default_factory=list)
    clients: dict[str, tuple[str, str]] = field(default_factory=dict)  # member -> (id, software)


class GroupMerge:
    """The supervisor's side: merges workers' facts at each scrape (see module doc)."""

    def __init__(self, limits: GroupLimits | None = None) -> None:
        self.limits = limits or GroupLimits()
        self.counted: OrderedDict[str, _Counted] = OrderedDict()
        self.buckets = [0] * len(REBALANCE_BUCKETS)
        self.observed = 0
        self.seconds = 0.0

    def merge(self, facts: list[Facts], now: float) -> list[MergedGroup]:
        by_group: dict[str, list[Facts]] = {}
        marks: dict[tuple[str, int], tuple[float, int]] = {}
        for worker in facts:
            for gid, g in list(worker.get("groups", {}).items())[: self.limits.max_groups]:
                by_group.setdefault(gid, []).append(g)
            for topic, partition, hwm, at in worker.get("watermarks", []):
                key = (topic, int(partition))
                if key not in marks or at >= marks[key][0]:
                    marks[key] = (at, int(hwm))
        out = [self._one(gid, views, marks, now) for gid, views in by_group.items()]
        horizon = now - self.limits.expiry_seconds
        for gid in [k for k, c in self.counted.items() if c.reported_at < horizon]:
            del self.counted[gid]
        return out

    def _one(self, gid: str, views: list[Facts], marks: dict[tuple[str, int], tuple[float, int]],
             now: float) -> MergedGroup:
        counted = self.counted.get(gid)
        if counted is None:
            counted = self.counted[gid] = _Counted()
            while len(self.counted) > self.limits.max_groups:
                self.counted.popitem(last=False)
        self.counted.move_to_end(gid)
        counted.reported_at = now
        longest: dict[int, tuple[float, float, str]] = {}  # generation -> (seconds, ended, why)
        for v in views:
            for row in v.get("completed", []):
                generation, ended, seconds = int(row[0]), float(row[1]), float(row[2])
                why = str(row[3]) if len(row) > 3 else "unknown"
                if generation not in longest or seconds > longest[generation][0]:
                    longest[generation] = (seconds, ended, why)
        for generation in sorted(longest):
            if counted.count(generation):
                self._observe(longest[generation][0])
        newest = max(views, key=lambda v: v.get("seen", 0.0))
        members = _members(views, self.limits.max_members)
        completed = [(gen, ended, seconds, why) for gen, (seconds, ended, why)
                     in sorted(longest.items())][-KEPT_GENERATIONS:]
        # A round in progress: the earliest start some worker saw after the newest
        # completed generation ended (a worker that missed the end still holds its round).
        done = completed[-1][1] if completed else -math.inf
        starts = [float(s) for v in views if (s := v.get("round_started")) is not None
                  and float(s) >= done]
        return MergedGroup(gid, max(int(v.get("generation", -1)) for v in views), members,
                           newest.get("protocol_type", ""), newest.get("assignor", ""),
                           _lag(views, marks), counted.rebalances,
                           protocol=newest.get("protocol", "classic"),
                           rebalancing_since=min(starts, default=None), completed=completed,
                           clients=_clients(views, members))

    def _observe(self, seconds: float) -> None:
        self.observed += 1
        self.seconds += seconds
        for i, le in enumerate(REBALANCE_BUCKETS):
            if seconds <= le:
                self.buckets[i] += 1

    def exposition(self, groups: list[MergedGroup]) -> str:
        """The group families in the text format, from ``merge``'s result."""
        fam: dict[str, list[str]] = {name: [] for name in (
            "rebalances", "generation", "members", "info", "assigned_partitions", "lag")}
        for g in groups:
            q = _quote(g.group_id)
            fam["rebalances"].append(f'kproxy_group_rebalances_total{{group="{q}"}} '
                                     f"{g.rebalances}")
            if g.generation >= 0:
                fam["generation"].append(f'kproxy_group_generation{{group="{q}"}} '
                                         f"{g.generation}")
            fam["members"].append(f'kproxy_group_members{{group="{q}"}} {len(g.members)}')
            fam["info"].append(f'kproxy_group_info{{group="{q}",protocol="{_quote(g.protocol)}",'
                               f'protocol_type="{_quote(g.protocol_type)}",'
                               f'assignor="{_quote(g.assignor)}"}} 1')
            for member, (_seen, _gen, assigned) in g.members.items():
                if assigned is not None:
                    fam["assigned_partitions"].append(
                        f'kproxy_group_assigned_partitions{{group="{q}",member='
                        f'"{_quote(member)}"}} {assigned}')
            for topic, partition, lag in g.lag:
                fam["lag"].append(f'kproxy_group_lag{{group="{q}",topic="{_quote(topic)}",'
                                  f'partition="{partition}"}} {lag}')
        head = {
            "rebalances": ("counter", "Completed rebalances, counted once per generation "
                           "whichever workers saw it"),
            "generation": ("gauge", "Newest completed generation any worker saw"),
            "members": ("gauge", "Members of the group, merged over every worker"),
            "info": ("gauge", "1 per group: its protocol, protocol type and chosen assignor"),
            "assigned_partitions": ("gauge", "Partitions assigned to each member"),
            "lag": ("gauge", "Newest high watermark seen minus newest committed offset, "
                    "per partition"),
        }
        out: list[str] = []
        for name, lines in fam.items():
            kind, text = head[name]
            # Named as the workers' text names it (a counter's family ends in _total).
            family = f"kproxy_group_{name}" + ("_total" if kind == "counter" else "")
            out += [f"# HELP {family} {text}", f"# TYPE {family} {kind}", *lines]
        out += ["# HELP kproxy_group_tracked Consumer groups currently tracked",
                "# TYPE kproxy_group_tracked gauge", f"kproxy_group_tracked {len(groups)}",
                "# HELP kproxy_group_rebalance_seconds Duration of completed rebalances, "
                "each generation once", "# TYPE kproxy_group_rebalance_seconds histogram"]
        for le, n in zip(REBALANCE_BUCKETS, self.buckets, strict=True):
            out.append(f'kproxy_group_rebalance_seconds_bucket{{le="{le}"}} {n}')
        out += [f'kproxy_group_rebalance_seconds_bucket{{le="+Inf"}} {self.observed}',
                f"kproxy_group_rebalance_seconds_count {self.observed}",
                f"kproxy_group_rebalance_seconds_sum {value_text(self.seconds)}"]
        return "\n".join(out) + "\n"


def _members(views: list[Facts], cap: int) -> dict[str, tuple[float, int, int | None]]:
    seen: dict[str, tuple[float, int, int | None]] = {}
    departed: dict[str, float] = {}
    roster: tuple[int, float, frozenset[str]] | None = None
    for v in views:
        for row in v.get("members", []):
            member, at, generation, assigned = row[:4]
            if member not in seen or at >= seen[member][0]:
                seen[member] = (at, int(generation), assigned)
        for member, at in v.get("departed", []):
            departed[member] = max(departed.get(member, -math.inf), at)
        r = v.get("roster")
        if r is not None and (roster is None or (r[0], r[2]) > roster[:2]):
            roster = (int(r[0]), float(r[2]), frozenset(r[1]))
    alive = {}
    for member, (at, generation, assigned) in seen.items():
        if departed.get(member, -math.inf) >= at:
            continue  # left (or was fenced) through some worker after it was last seen
        if roster is not None and member not in roster[2] and at < roster[1]:
            continue  # not in the newest generation's member list, not seen since
        alive[member] = (at, generation, assigned)
        if len(alive) >= cap:
            break
    return alive


def _clients(views: list[Facts], members: dict[str, tuple[float, int, int | None]]
             ) -> dict[str, tuple[str, str]]:
    """Each listed member's client id and software, from the worker that saw it last."""
    out: dict[str, tuple[float, str, str]] = {}
    for v in views:
        for row in v.get("members", []):
            if len(row) >= 6 and row[0] in members and (row[4] or row[5]) and (
                    row[0] not in out or row[1] >= out[row[0]][0]):
                out[row[0]] = (row[1], str(row[4]), str(row[5]))
    return {m: (cid, sw) for m, (_, cid, sw) in out.items()}


def _lag(views: list[Facts], marks: dict[tuple[str, int], tuple[float, int]]
         ) -> list[tuple[str, int, int]]:
    committed: dict[tuple[str, int], tuple[float, int]] = {}
    for v in views:
        for topic, partition, offset, at in v.get("committed", []):
            key = (topic, int(partition))
            if key not in committed or at >= committed[key][0]:
                committed[key] = (at, int(offset))
    return [(t, p, max(0, marks[(t, p)][1] - offset))
            for (t, p), (_, offset) in committed.items() if (t, p) in marks and offset >= 0]


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
