"""Full collections that walk what is new, and the whole heap once an interval.

CPython's full collection walks every object its cyclic garbage collector tracks, with
the event loop held. A worker's long-lived objects (a telemetry fleet's client
instances, connections open for hours) are walked again at every full collection, and
the walk touches each one's fields, cold in memory by then: at 20,000 client instances
(one worker, a scratch run) 51 to 63 ms a collection, every few seconds to a minute
while the fleet is busy, every connection waiting.

So after each full collection what survived it is frozen (``gc.freeze``), and the full
collections after it walk only what was made since. A frozen object is still freed the
moment nothing refers to it; what freezing defers is finding *cycles* among objects
that were frozen alive and died later (a long connection's tasks once it closes, say).
So every ``interval`` seconds everything is thawed (``gc.unfreeze``): the next full
collection walks the whole heap once, finds such cycles, and what survives is frozen
again. Memory held by cycles of old objects lasts at most about one interval; the long
walk comes once an interval instead of at every full collection.

``kproxy_gc_full_collection_seconds`` shows both kinds of walk (``walk="recent"`` and
``"whole"``). ``gc_sweep_interval = 0`` leaves the collector as CPython runs it: every
full collection walks everything, and the histogram counts each as ``whole``.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Histogram

# Seconds: a young collection is well under the first bucket; a whole walk of a large
# fleet's heap reaches the last ones.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class FullCollections:
    """Freezes what survived each full collection; thaws everything once an interval
    (an interval of 0: freezes nothing, only times the collections)."""

    def __init__(self, interval: float, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._thaw_at = clock() + interval
        # The collection under way walks everything (thawed before it, or never frozen).
        self._whole = interval <= 0
        self._started = 0.0
        self.seconds = Histogram(
            "kproxy_gc_full_collection_seconds", "Full collections of the cyclic garbage "
            "collector, the event loop held: walk=recent (what was made since the last "
            "one) or whole (the heap, once per gc_sweep_interval)", ["walk"],
            buckets=BUCKETS, registry=registry)

    def install(self) -> None:
        gc.callbacks.append(self._on_collection)

    def uninstall(self) -> None:
        if self._on_collection in gc.callbacks:
            gc.callbacks.remove(self._on_collection)

    def _on_collection(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
            return
        walked = "whole" if self._whole else "recent"
        self.seconds.labels(walked).observe(time.perf_counter() - self._started)
        if self.interval <= 0:
            return
        now = self._clock()
        if now >= self._thaw_at:
            gc.unfreeze()  # the next full collection walks everything
            self._thaw_at = now + self.interval
            self._whole = True
        else:
            gc.freeze()  # what survived this one: left out of the walks until the thaw
            self._whole = False


def manage_full_collections(interval: float, registry: CollectorRegistry) -> FullCollections:
    """Installs the policy in this process (a worker, once started)."""
    policy = FullCollections(interval, registry)
    policy.install()
    return policy
