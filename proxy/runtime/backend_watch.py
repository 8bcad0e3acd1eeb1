"""Keeping the backend view current, and acting when it changes.

Discovery (a Metadata request every interval) and every address-bearing response a
session relays feed the view in ``ProxyState``. When the view reveals a change, the
topology epoch moves: sessions whose backend is gone stop reading and close, the
others learn it in their next Metadata response, and listeners follow the broker
set (``watchers``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from kproxy.logs import RateLimitedLog
from kproxy.metrics.proxy_metrics import ProxyMetrics
from kproxy.policies.connection import ConnectionState, Handled
from kproxy.policies.proxy_state import ProxyState
from kproxy.policies.rebootstrap import Action
from kproxy.policies.rewrite import Seen
from kproxy.policies.topology import Change
from kproxy.runtime.discovery import ROUND_FAILED, Discovery
from kproxy.runtime.upstream import BootstrapRotation

log = logging.getLogger("kproxy")


class ViewWatcher(Protocol):
    """Something that follows the broker set (the per-broker listeners)."""

    def in_step(self) -> bool:
        """Whether ``sync`` would find nothing to do (checked without waiting)."""

    async def sync(self) -> None: ...


class BackendWatch:
    def __init__(self, state: ProxyState, metrics: ProxyMetrics, ratelog: RateLimitedLog,
                 rotation: BootstrapRotation, node_id_range: tuple[int, int]) -> None:
        self.state = state
        self.metrics = metrics
        self.ratelog = ratelog
        self.rotation = rotation
        self.discovery = Discovery(rotation)
        self.node_id_range = node_id_range
        self.sessions_of: Callable[[], list[tuple[ConnectionState, Callable[[], None]]]] = (
            lambda: [])
        self.watchers: list[ViewWatcher] = []  # kept in step with the broker set
        self.last_discovery: float | None = None
        self.last_change: tuple[float, str, str] | None = None  # when, reason, what
        self._known = -1  # the brokers_known gauge's value

    async def observed(self, handled: Handled, conn: ConnectionState) -> None:
        """A session's response handler saw the backend (and maybe told a client)."""
        if self.observe_now(handled, conn):
            await self.catch_up(handled.change)

    def observe_now(self, handled: Handled, conn: ConnectionState) -> bool:
        """What ``observed`` does without waiting; True when the rest must follow
        (``catch_up``) before the response leaves. It never waits in the usual case (a
        broker set seen before): the express lane calls it from outside trio."""
        if handled.rebootstrap is not Action.NONE:
            self.metrics.rebootstrap.labels(handled.rebootstrap.value).inc()
            log.info("client told to bootstrap again" if handled.rebootstrap is Action.INJECT
                     else f"legacy client below Metadata v13: {handled.rebootstrap.value}",
                     extra={"fields": {**conn.log_fields(), "epoch": self.state.epoch}})
        return handled.seen is not None and self._seen_now(handled.seen, handled.change)

    async def seen(self, seen: Seen, change: Change | None) -> None:
        if self._seen_now(seen, change):
            await self.catch_up(change)

    def _seen_now(self, seen: Seen, change: Change | None) -> bool:
        """True when a change is to be fanned out or a watcher is out of step."""
        if seen.out_of_range:
            self.metrics.node_out_of_range.inc(len(seen.out_of_range))
            first, last = self.node_id_range
            self.ratelog(logging.WARNING, "out-of-range",
                         "backend nodes outside --node-id-range left out of responses",
                         nodes=sorted(seen.out_of_range), node_id_range=f"{first}-{last}")
        if not seen.nodes and not seen.complete:
            return False
        known = len(self.state.view.nodes)
        if known != self._known:  # a gauge set takes a lock: not on every response
            self._known = known
            self.metrics.brokers_known.set(known)
        if change is not None:
            return True
        for watcher in self.watchers:  # noqa: SIM110 (no generator: this runs per response)
            if not watcher.in_step():
                return True
        return False

    async def catch_up(self, change: Change | None) -> None:
        """Fan ``change`` out (if any) and bring every watcher in step with the view
        (after ``_seen_now`` said so)."""
        if change is not None:
            self.changed(change)
        for watcher in self.watchers:
            await watcher.sync()

    def changed(self, change: Change) -> None:
        """A new topology epoch: connections to a backend that is gone are closed."""
        reason = change.reason if change.reason != "backend" else (
            "cluster_id" if change.cluster_id else "brokers")
        log.info("backend changed: %s", change.describe(),
                 extra={"fields": {"epoch": change.epoch, "reason": reason}})
        self.last_change = (time.time(), reason, change.describe())
        self.metrics.topology_changes.labels(reason).inc()
        self.metrics.topology_epoch.set(change.epoch)
        for conn, end in self.sessions_of():
            outcome = conn.on_change(change)
            if outcome is not None:
                # In-flight requests are answered; the client's next request is not
                # forwarded and ends the connection: the client reconnects.
                self.metrics.rebootstrap.labels(outcome).inc()
                end()

    async def force(self, reason: str) -> Change:
        """An epoch bump with no visible change (operator request, new upstream list)."""
        change = self.state.view.force(reason)
        self.changed(change)
        return change

    async def _discover(self, connect_timeout: float, max_frame_bytes: int) -> Seen | None:
        """One discovery round trip; None when it failed or its answer is stale.

        An answer from a server list that was replaced while it was in flight (a reload)
        describes the old backend: taking it would swap the view back for a moment and
        close every connection to the new one.
        """
        servers = list(self.rotation.servers)
        try:
            seen = await self.discovery.discover(connect_timeout, max_frame_bytes)
        except ROUND_FAILED as exc:
            self.ratelog(logging.WARNING, "discovery", "backend discovery failed",
                         error=str(exc) or type(exc).__name__)
            return None
        except Exception:  # a bug here must not take the proxy down; retried next interval
            self.metrics.internal_errors.inc()
            log.exception("backend discovery failed unexpectedly")
            return None
        if self.rotation.servers != servers:
            log.debug("discovery answer dropped: the upstream list changed meanwhile")
            return None
        self.last_discovery = time.monotonic()
        return seen

    async def discover_once(self, connect_timeout: float, max_frame_bytes: int) -> bool:
        seen = await self._discover(connect_timeout, max_frame_bytes)
        if seen is None:
            return False
        await self.seen(seen, self.state.learn(seen))
        return True

    async def reconfigured(self, connect_timeout: float, max_frame_bytes: int) -> Change | None:
        """The upstream list changed: one epoch bump for it, whatever it leads to.

        Discovery through the new list runs first, so that a new cluster (or brokers at
        new addresses) is one change that closes what reaches the old backend, rather
        than a forced bump followed by a second one when discovery catches up: clients
        would bootstrap once for each. When the new list leads to the same backend
        (or cannot be reached yet) the bump is forced: connections to servers no longer
        listed are closed, and the others are told in their next Metadata response.

        None: the epoch moved while this discovery was in flight (the periodic discovery,
        already through the new list, learned the change first). That was the bump.
        """
        epoch = self.state.epoch  # the new list is in place: any later bump answers to it
        seen = await self._discover(connect_timeout, max_frame_bytes)
        learned = None if seen is None else self.state.learn(seen)
        if seen is not None:
            await self.seen(seen, learned)  # fans a learned change out
        if learned is not None:
            return learned
        if self.state.epoch != epoch:
            return None
        change = self.state.view.force("upstream_reconfigured")
        self.changed(change)
        return change
