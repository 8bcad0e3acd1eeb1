"""A worker's full collections walk what is new; the whole heap once an interval.

``commands.collector.FullCollections`` freezes what survived each full collection and
thaws everything once per interval. What must hold: a frozen object that nothing
refers to any more is freed at once, as ever; a cycle among objects frozen alive
survives the collections between two thaws and is freed by the whole walk after the
next thaw; and the histogram names each walk.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from kproxy.commands.collector import FullCollections, manage_full_collections


class Node:
    """Something the collector tracks, that can be in a cycle and be watched dying."""

    def __init__(self) -> None:
        self.other: Node | None = None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def policy() -> Iterator[tuple[FullCollections, Clock, CollectorRegistry]]:
    clock, registry = Clock(), CollectorRegistry()
    installed = FullCollections(600.0, registry, clock)
    installed.install()
    try:
        yield installed, clock, registry
    finally:
        installed.uninstall()
        gc.unfreeze()  # this test process's objects: back where the collector walks them
        gc.collect()


def _walks(registry: CollectorRegistry, walk: str) -> float:
    value = registry.get_sample_value("kproxy_gc_full_collection_seconds_count",
                                      {"walk": walk})
    return value or 0.0


def _cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_what_survives_a_full_collection_is_frozen_and_freed_when_unreferenced(
        policy: tuple[FullCollections, Clock, CollectorRegistry]) -> None:
    _, _, registry = policy
    kept = Node()
    watched = weakref.ref(kept)
    gc.collect()
    assert gc.get_freeze_count() > 0
    assert not any(o is kept for o in gc.get_objects())  # out of the walks
    del kept  # no cycle: freed at once, frozen or not
    assert watched() is None
    assert _walks(registry, "recent") >= 1 and _walks(registry, "whole") == 0


def test_a_cycle_of_frozen_objects_waits_for_the_whole_walk_after_the_next_thaw(
        policy: tuple[FullCollections, Clock, CollectorRegistry]) -> None:
    _, clock, registry = policy
    young = _cycle()  # a cycle nothing refers to, made since the last full collection
    assert young() is not None
    gc.collect()  # found by the next one, as ever
    assert young() is None

    holder = [Node()]
    holder[0].other = Node()
    holder[0].other.other = holder[0]
    old = weakref.ref(holder[0])
    gc.collect()  # the cycle is alive (``holder``): frozen with the rest
    holder.clear()  # now garbage, but frozen: the walks between thaws never meet it
    for _ in range(3):
        gc.collect()
    assert old() is not None
    clock.now += 600.0
    gc.collect()  # a recent walk, at whose end everything is thawed
    assert old() is not None and _walks(registry, "whole") == 0
    gc.collect()  # the whole walk: the old cycle is found
    assert old() is None
    assert _walks(registry, "whole") == 1
    gc.collect()  # frozen again after the whole walk: recent walks from here
    assert _walks(registry, "whole") == 1 and gc.get_freeze_count() > 0


def test_young_collections_are_left_alone(
        policy: tuple[FullCollections, Clock, CollectorRegistry]) -> None:
    _, _, registry = policy
    frozen = gc.get_freeze_count()
    gc.collect(0)
    gc.collect(1)
    assert gc.get_freeze_count() == frozen
    assert _walks(registry, "recent") == _walks(registry, "whole") == 0


def test_an_interval_of_zero_leaves_the_collector_as_cpython_runs_it() -> None:
    """Nothing frozen: every full collection walks everything, and is timed as such."""
    registry = CollectorRegistry()
    timed = manage_full_collections(0, registry)
    try:
        frozen = gc.get_freeze_count()
        kept = Node()
        gc.collect()
        assert gc.get_freeze_count() == frozen
        assert any(o is kept for o in gc.get_objects())  # still in the walks
        assert _walks(registry, "whole") == 1 and _walks(registry, "recent") == 0
    finally:
        timed.uninstall()
