"""The proxy's view of the backend: cluster id and the set of brokers, with an epoch.

Fed by the discovery task and by every response that names brokers. A change in
the broker set or the cluster id bumps the epoch; the rebootstrap policy compares
a connection's last-seen epoch against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kproxy.policies.addressing import BrokerAddress


@dataclass(frozen=True)
class Change:
    epoch: int
    added: dict[int, BrokerAddress]
    removed: dict[int, BrokerAddress]
    moved: dict[int, tuple[BrokerAddress, BrokerAddress]]
    cluster_id: tuple[str | None, str | None] | None  # (before, after) when it changed
    reason: str = "backend"

    @property
    def invalid_nodes(self) -> set[int]:
        """Nodes whose old backend address no longer serves them."""
        return set(self.removed) | set(self.moved)

    def describe(self) -> str:
        parts = [] if self.reason == "backend" else [self.reason]
        if self.cluster_id:
            parts.append(f"cluster id {self.cluster_id[0]!r} -> {self.cluster_id[1]!r}")
        if self.added:
            parts.append("added " + ", ".join(f"{n}={a.host}:{a.port}"
                                              for n, a in sorted(self.added.items())))
        if self.removed:
            parts.append("removed " + ", ".join(str(n) for n in sorted(self.removed)))
        if self.moved:
            parts.append("moved " + ", ".join(f"{n}={b.host}:{b.port}"
                                              for n, (_, b) in sorted(self.moved.items())))
        return "; ".join(parts)


@dataclass
class BackendView:
    cluster_id: str | None = None
    nodes: dict[int, BrokerAddress] = field(default_factory=dict)
    epoch: int = 0

    def address_of(self, node_id: int) -> BrokerAddress | None:
        return self.nodes.get(node_id)

    def force(self, reason: str) -> Change:
        """An epoch bump with no visible change (operator request, upstream reconfigured)."""
        self.epoch += 1
        return Change(self.epoch, {}, {}, {}, None, reason)

    def observe(self, nodes: dict[int, BrokerAddress], cluster_id: str | None,
                complete: bool) -> Change | None:
        """Merge what a response said; ``complete`` means it listed every broker.

        Returns the change (and bumps the epoch) when the broker set, a broker's
        address or the cluster id changed; racks alone do not count.
        """
        before = self.nodes
        if (not cluster_id or cluster_id == self.cluster_id) and (
                nodes is before or nodes == before if complete
                else all(before.get(n) == a for n, a in nodes.items())):
            return None  # what the view holds already, racks too: a steady cluster's answer
        # Kept as given when complete (never mutated, here or where it came from): the
        # next steady answer, a cached rewrite's same dict, is then told by identity.
        after = nodes if complete else {**before, **nodes}
        added = {n: a for n, a in after.items() if n not in before}
        removed = {n: a for n, a in before.items() if n not in after}
        moved = {n: (before[n], a) for n, a in after.items()
                 if n in before and (before[n].host, before[n].port) != (a.host, a.port)}
        cid_change = None
        if cluster_id and cluster_id != self.cluster_id:
            if self.cluster_id is not None:
                cid_change = (self.cluster_id, cluster_id)
            self.cluster_id = cluster_id
        self.nodes = after
        first_sight = not before and cid_change is None
        if not (added or removed or moved or cid_change) or first_sight:
            return None
        self.epoch += 1
        return Change(self.epoch, added, removed, moved, cid_change)
