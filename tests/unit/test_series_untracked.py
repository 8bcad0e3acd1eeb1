"""Client series held cost the cyclic garbage collector nothing per series.

A full collection visits every tracked object, and every reference a tracked
container holds, with the event loop held: one object per series made it ~100 ms at
250,000 series. So what the store keeps per series (values, histogram state, keys,
label text) must stay untracked, once ingested, updated and labelled by a scrape.
"""

from __future__ import annotations

import gc
import types
import uuid

from kproxy.codecs.otlp.model import ResourceMetrics, decode_metrics_data
from kproxy.metrics.exposition import Exposition
from kproxy.metrics.proxy_metrics import ProxyMetrics
from kproxy.telemetry.exposition import (
    INSTANCES_PER_PIECE,
    LABELS_PER_COLLECTION,
    PIECE_ROWS,
    ClientMetricsCollector,
    label_new_series,
)
from kproxy.telemetry.service import TelemetryService

from ..otlp_samples import librdkafka_like_payload
from ..support import make_config

INSTANCES = 20


def _labels(iid: uuid.UUID) -> dict[str, str]:
    return {"client_instance_id": str(iid), "client_id": "app"}


def _held(per_instance: int) -> tuple[TelemetryService, int]:
    """A service holding ``INSTANCES`` x ``per_instance`` series, ingested cumulative,
    labelled by a scrape, then updated by delta pushes (histograms replaced); and how
    many tracked objects it added."""
    service = _filled(per_instance)
    # A pass untracks a tuple whose items are untracked when it comes to it, and a dict
    # whose keys and values are; dicts wait for a full collection.
    gc.collect()
    return service, _tracked_from(service.store)


def _ingested(per_instance: int
              ) -> tuple[TelemetryService, ProxyMetrics, list[ResourceMetrics]]:
    """A service holding ``INSTANCES`` x ``per_instance`` series, ingested cumulative,
    never scraped; the metrics its exposition is made of; and what was ingested."""
    cfg = make_config("127.0.0.1:1", telemetry_max_series=INSTANCES * per_instance,
                      telemetry_max_series_bytes=2**32)
    metrics = ProxyMetrics()
    service = TelemetryService(cfg.telemetry, metrics)
    resources = decode_metrics_data(librdkafka_like_payload(points=per_instance - 2))
    for iid in _ids():
        service.store.ingest(iid, _labels(iid), resources, False)
    return service, metrics, resources


def _ids() -> list[uuid.UUID]:
    return [uuid.UUID(int=i + 1) for i in range(INSTANCES)]


def _filled(per_instance: int) -> TelemetryService:
    """``_held``'s service, before any collection of its own."""
    service, metrics, resources = _ingested(per_instance)
    ids = _ids()
    collector = next(s for s in metrics.piece_sources if isinstance(s, ClientMetricsCollector))
    for _ in collector():  # a whole scrape: every series gets its label text
        pass
    for iid in ids:
        stats = service.store.ingest(iid, _labels(iid), resources, True)
        # Every point updated a series it had (none new: the cap is reached).
        assert stats.points and stats.dropped_by_cap == stats.dropped_by_bytes == 0
    assert service.store.total == INSTANCES * per_instance
    del resources, collector, metrics  # the decoded points: an object each
    return service


def _tracked_from(root: object) -> int:
    """Tracked objects reachable from ``root``: what a collection visits for it. Counted
    from the store, not the whole process, so that whatever else the test process holds
    or frees meanwhile (other tests' leftovers, their threads) does not count."""
    seen: set[int] = set()
    stack = [root]
    tracked = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.FunctionType,
                                               types.CodeType, types.MethodType)):
            continue
        seen.add(id(obj))
        tracked += gc.is_tracked(obj)
        stack.extend(gc.get_referents(obj))
    return tracked


def test_series_held_add_tracked_objects_per_instance_not_per_series() -> None:
    small, few = _held(per_instance=10)
    large, many = _held(per_instance=400)
    # 7,800 more series: with an object per series, 7,800 more tracked objects.
    assert many - few < INSTANCES, (few, many)
    for service in (small, large):
        for own in service.store.series.values():
            assert len(own.heads) == len(own.tails) == len(own.slot_of) == len(own)
            assert own.hists  # the payload's histogram, replaced by the second pushes
            for part in (own.slot_of, own.hists, own.heads, own.tails,
                         *own.slot_of, *own.hists.values()):
                assert not gc.is_tracked(part), part


def test_new_series_leave_the_young_generations_untracked() -> None:
    """What a series adds is untracked by the young collections it goes through, so it
    never reaches the oldest generation tracked: there, while a fleet grows, every new
    series would count towards the next full collection and be walked by it, the loop
    held (nested keys did: a full collection every few hundred new series, each up to
    tens of ms)."""
    enabled = gc.isenabled()
    gc.disable()  # everything made below is young: the two collections below meet it all
    try:
        service = _filled(per_instance=100)
        gc.collect(0)
        gc.collect(1)
        for own in service.store.series.values():
            assert own.hists
            for part in (*own.slot_of, *own.hists.values(), own.heads, own.tails):
                assert not gc.is_tracked(part), part
        # Per instance a handful of objects stay tracked (its id, its series' holder, a
        # dict or two until the next full collection), none per series.
        assert _tracked_from(service.store) < 8 * INSTANCES
    finally:
        if enabled:
            gc.enable()


async def test_a_scrape_collects_new_label_text_in_doses_as_it_makes_it() -> None:
    """A series' label text, made at its first scrape, comes in two tuples an instance
    with a reference a series; the young collection that meets them walks them. The
    scrape collects them a few instances at a time as it makes them: all left to the
    collection after the walk, 600 new clients' held the loop 2.3 to 3.6 ms in one go."""
    per_instance = 300
    service, metrics, _ = _ingested(per_instance)
    owners = list(service.store.series.values())
    met: list[int] = []  # label tuples still tracked (young) as each collection starts

    def watch(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            met.append(sum(gc.is_tracked(own.heads) + gc.is_tracked(own.tails)
                           for own in owners))

    enabled = gc.isenabled()
    gc.enable()  # as in the proxy: the scrape pauses it for its walk
    gc.callbacks.append(watch)
    try:
        await Exposition(metrics.registry, metrics.piece_sources).response({})
    finally:
        gc.callbacks.remove(watch)
        if not enabled:
            gc.disable()
    assert all(len(own.tails) == len(own.slot_of) == per_instance for own in owners)
    assert not any(gc.is_tracked(own.heads) or gc.is_tracked(own.tails) for own in owners)
    # At most the instances labelled between two collections (4 here), 2 tuples each;
    # one collection for all would meet the 20 instances' 40.
    assert met and max(met) <= 2 * (LABELS_PER_COLLECTION // per_instance + 1), met


def _fleet(instances: int) -> TelemetryService:
    """A service that handed ``instances`` instances their subscriptions and holds ten
    series of each, collected until what can be untracked is."""
    cfg = make_config("127.0.0.1:1", telemetry_max_series=instances * 10,
                      telemetry_max_series_bytes=2**32)
    service = TelemetryService(cfg.telemetry, ProxyMetrics())
    resources = decode_metrics_data(librdkafka_like_payload(points=8))
    for i in range(instances):
        got = service.state.get_subscriptions(uuid.UUID(int=0), _labels(uuid.UUID(int=i)),
                                              1000 + i)
        assert got.instance is not None
        service.store.ingest(got.instance.instance_id, got.instance.attrs, resources, False)
    del resources
    for _ in range(3):  # nested tuples are untracked a level a pass; dicts in a full one
        gc.collect()
    assert len(service.state.instances) == len(service.store.series) == instances
    return service


def test_a_client_instance_is_one_tracked_object_in_the_state_and_one_in_the_store() -> None:
    """A fleet's instances live for minutes, and a full collection walks every tracked
    object with the loop held: at 20,000 instances of five objects each (the instance,
    its UUID, its subscription, its series' holder and their values' array), 100,000
    objects, 62-82 ms a collection in a running proxy. An instance is now its
    ``ClientInstance`` and its ``InstanceSeries``, whatever its subscription and series:
    twice the instances, exactly that many more tracked objects in each."""
    few, many = _fleet(INSTANCES), _fleet(2 * INSTANCES)
    assert _tracked_from(many.state) - _tracked_from(few.state) == INSTANCES
    assert _tracked_from(many.store) - _tracked_from(few.store) == INSTANCES


def test_a_scrape_offers_the_loop_a_turn_every_few_instances_it_looks_over() -> None:
    """A scrape looks over every instance twice before it writes a sample: whether it
    needs label text, then which families its series belong to. The first pass made no
    piece for instances already labelled, so a fleet of 20,000 was looked over in one
    slice; the second none for instances the series cap left with no series. Each pass
    now makes a piece (a turn, once the slice's budget is spent) at least every
    ``INSTANCES_PER_PIECE`` instances."""
    instances = 4 * INSTANCES_PER_PIECE
    cfg = make_config("127.0.0.1:1", telemetry_max_series=instances,
                      telemetry_max_series_bytes=2**32)
    metrics = ProxyMetrics()
    service = TelemetryService(cfg.telemetry, metrics)
    resources = decode_metrics_data(librdkafka_like_payload(points=1))  # 3 series
    for i in range(instances):  # the cap keeps a third of them; the rest hold none
        iid = uuid.UUID(int=i + 1)
        service.store.ingest(iid, _labels(iid), resources, False)
    owners = list(service.store.series.values())
    assert len(owners) == instances and sum(len(own) == 0 for own in owners) > instances // 2
    collector = next(s for s in metrics.piece_sources if isinstance(s, ClientMetricsCollector))
    for _ in collector():  # every series labelled
        pass
    first_pass = list(label_new_series(owners, {}, {}))
    assert first_pass == [None] * (instances // INSTANCES_PER_PIECE)
    pieces = list(collector())
    header = next(i for i, p in enumerate(pieces) if getattr(p, "name", "").startswith(
        "org_apache"))
    turns = sum(p is None for p in pieces[:header])
    # Expiry's steps, the first pass's pieces, then the second pass's: a piece every
    # PIECE_ROWS series, an instance with none counting as one.
    empty = sum(len(own) == 0 for own in owners)
    assert turns >= len(first_pass) + (service.store.total + empty) // PIECE_ROWS, turns
