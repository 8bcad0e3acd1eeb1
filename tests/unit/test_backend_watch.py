"""BackendWatch: one epoch per upstream reload, stale discovery answers dropped.

The discovery round trip is replaced by a fake (``fake_discovery``): the race under
test — the upstream list replaced while a discovery is in flight — cannot be timed
deterministically against a real broker. The real round trip, and both behaviours
end to end, are exercised by tests/e2e/test_rebootstrap_clients.py (five swaps, exactly
one topology change each) and tests/e2e/test_reload.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kproxy.logs import RateLimitedLog
from kproxy.metrics.proxy_metrics import ProxyMetrics
from kproxy.policies.addressing import BrokerAddress, PortMap
from kproxy.policies.proxy_state import ProxyState
from kproxy.policies.rewrite import Seen
from kproxy.runtime.backend_watch import BackendWatch
from kproxy.runtime.discovery import Discovery
from kproxy.runtime.upstream import BootstrapRotation, UpstreamUnavailable

OLD, NEW = ("10.0.0.1", 9092), ("10.0.0.2", 9092)


def watch() -> BackendWatch:
    state = ProxyState(PortMap("proxy.local", 30000, 30000, 0, 1023), "close", False, [OLD])
    return BackendWatch(state, ProxyMetrics(), RateLimitedLog(), BootstrapRotation([OLD]),
                        (0, 1023))


def cluster(cluster_id: str, host: str) -> Seen:
    return Seen(nodes={1: BrokerAddress(host, 9092)}, complete=True, cluster_id=cluster_id)


def fake_discovery(monkeypatch: pytest.MonkeyPatch,
                   answer: Callable[[BootstrapRotation], Seen]) -> None:
    """A fake of the Metadata round trip: ``answer`` may act as if a reload happened."""
    async def discover(discovery: Discovery, *_: Any) -> Seen:
        return answer(discovery.rotation)
    monkeypatch.setattr(Discovery, "discover", discover)


async def test_an_answer_from_a_replaced_upstream_list_is_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    w = watch()
    fake_discovery(monkeypatch, lambda _: cluster("blue", "10.0.0.1"))
    assert await w.discover_once(1, 1 << 20)
    assert w.state.view.cluster_id == "blue"

    def reloaded_meanwhile(rotation: BootstrapRotation) -> Seen:
        rotation.servers = [NEW]  # a reload while the old list's answer is in flight
        return cluster("old", "10.0.0.9")
    fake_discovery(monkeypatch, reloaded_meanwhile)
    assert not await w.discover_once(1, 1 << 20)
    assert w.state.view.cluster_id == "blue" and w.state.epoch == 0


async def test_a_reload_to_another_cluster_is_one_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    w = watch()
    fake_discovery(monkeypatch, lambda _: cluster("blue", "10.0.0.1"))
    await w.discover_once(1, 1 << 20)
    w.rotation.servers = w.state.upstream_servers = [NEW]
    fake_discovery(monkeypatch, lambda _: cluster("green", "10.0.0.2"))
    change = await w.reconfigured(1, 1 << 20)
    assert change is not None
    assert change.cluster_id == ("blue", "green") and change.reason == "backend"
    assert w.state.epoch == 1  # not a forced bump and then a second one


async def test_a_reload_to_the_same_backend_or_none_is_a_forced_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    w = watch()
    fake_discovery(monkeypatch, lambda _: cluster("blue", "10.0.0.1"))
    await w.discover_once(1, 1 << 20)
    change = await w.reconfigured(1, 1 << 20)  # the same cluster through the new list
    assert change is not None and change.reason == "upstream_reconfigured" and w.state.epoch == 1

    def unreachable(_: BootstrapRotation) -> Seen:
        raise UpstreamUnavailable([(NEW, "refused")])
    fake_discovery(monkeypatch, unreachable)
    change = await w.reconfigured(1, 1 << 20)
    assert change is not None and change.reason == "upstream_reconfigured" and w.state.epoch == 2


async def test_a_reload_whose_change_the_periodic_discovery_learned_first_is_still_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The periodic discovery may start right after the new list is in place and answer
    before the reload's own discovery does (seen in CI: a swap counted as cluster_id and
    then upstream_reconfigured, so clients were told twice). Its change is the reload's
    one bump; the reload's discovery then learns nothing new and forces nothing."""
    w = watch()
    fake_discovery(monkeypatch, lambda _: cluster("blue", "10.0.0.1"))
    await w.discover_once(1, 1 << 20)
    w.rotation.servers = w.state.upstream_servers = [NEW]

    async def overtaken(discovery: Discovery, *_: Any) -> Seen:
        # The periodic discovery through the new list answers while this one is in flight.
        fake_discovery(monkeypatch, lambda _: cluster("green", "10.0.0.2"))
        assert await w.discover_once(1, 1 << 20)
        monkeypatch.setattr(Discovery, "discover", overtaken)
        return cluster("green", "10.0.0.2")
    monkeypatch.setattr(Discovery, "discover", overtaken)
    assert await w.reconfigured(1, 1 << 20) is None
    assert w.state.epoch == 1 and w.state.view.cluster_id == "green"
    assert set(w.metrics.topology_changes._metrics) == {("cluster_id",)}  # nothing forced
