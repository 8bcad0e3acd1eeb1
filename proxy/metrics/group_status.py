"""Consumer groups as the status page lists them: pure, from the merged group model.

One process and a supervisor of several workers both hold ``MergedGroup``s
(``group_merge``); this turns them into the rows of ``status.json``'s ``groups``: at
most ``MAX_LISTED`` groups, those in a rebalance storm first, then those rebalancing
now, the rest counted. Each row: protocol, state as the proxy sees it, members with
their client ids and software, generation, the last rebalance (when, how long, why),
total lag and the worst partitions. Group and member ids are the clients' own
strings, already cut to the tracker's label bound; the page escapes them.
"""

from __future__ import annotations

from typing import Any

from kproxy.metrics.group_merge import MergedGroup

MAX_LISTED = 10  # groups listed on the page and in status.json
MAX_MEMBERS = 10  # members listed per group
WORST_PARTITIONS = 3  # partitions listed per group, by lag
STORM_WINDOW = 300.0  # seconds: rebalances completed within this long count ...
STORM_REBALANCES = 3  # ... towards a storm when there are at least this many


def state_of(g: MergedGroup) -> str:
    """What the proxy sees, not the coordinator's word: a round in progress, members, none."""
    if g.rebalancing_since is not None:
        return "rebalancing"
    return "stable" if g.members else "empty"


def recent_rebalances(g: MergedGroup, now: float) -> int:
    return sum(1 for _, ended, _, _ in g.completed if now - ended <= STORM_WINDOW)


def total_lag(g: MergedGroup) -> int | None:
    return sum(lag for _, _, lag in g.lag) if g.lag else None


def _rank(g: MergedGroup, now: float) -> tuple[Any, ...]:
    recent = recent_rebalances(g, now)
    return (recent < STORM_REBALANCES, g.rebalancing_since is None, -recent,
            -(total_lag(g) or 0), -len(g.members), g.group_id)


def rows(groups: list[MergedGroup], now: float, wall: float,
         listed: int = MAX_LISTED) -> dict[str, Any]:
    """``now`` monotonic (the facts' clock), ``wall`` the same moment as Unix time."""
    ranked = sorted(groups, key=lambda g: _rank(g, now))
    out = []
    for g in ranked[:listed]:
        recent = recent_rebalances(g, now)
        last = g.completed[-1] if g.completed else None
        by_id = sorted(g.members.items(), key=lambda kv: kv[0])
        members = []
        for member_id, (_seen, generation, assigned) in by_id[:MAX_MEMBERS]:
            client_id, software = g.clients.get(member_id, ("", ""))
            members.append({"member_id": member_id, "client_id": client_id,
                            "software": software, "generation": generation,
                            "assigned_partitions": assigned})
        worst = sorted(g.lag, key=lambda x: (-x[2], x[0], x[1]))[:WORST_PARTITIONS]
        out.append({
            "group_id": g.group_id, "protocol": g.protocol, "protocol_type": g.protocol_type,
            "assignor": g.assignor, "state": state_of(g),
            "storm": recent >= STORM_REBALANCES, "rebalances_recent": recent,
            "rebalances": g.rebalances, "generation": g.generation,
            "rebalancing_for_s": None if g.rebalancing_since is None
            else round(max(0.0, now - g.rebalancing_since), 1),
            "members_count": len(g.members), "members": members,
            "members_more": max(0, len(by_id) - MAX_MEMBERS),
            "last_rebalance": None if last is None else {
                "generation": last[0], "at": round(wall - (now - last[1]), 3),
                "seconds": round(last[2], 3), "reason": last[3]},
            "lag": total_lag(g),
            "worst_partitions": [{"topic": t, "partition": p, "lag": lag}
                                 for t, p, lag in worst],
        })
    return {"tracked": len(groups), "listed": out, "more": max(0, len(ranked) - listed)}


def history_figures(groups: list[MergedGroup]) -> list[tuple[str, int | None, int]]:
    """Per group what the history ring keeps: (group, total lag, rebalances so far)."""
    return [(g.group_id, total_lag(g), g.rebalances) for g in groups]
