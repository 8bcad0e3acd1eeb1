"""Client telemetry on /metrics: the series of ``kproxy.telemetry.service``'s store, in pieces.

Kept apart from the push handlers: this side only reads the store, at scrape time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from itertools import islice
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kproxy.metrics.exposition import COLLECT_YOUNG, Piece, value_text
from kproxy.policies.telemetry.series import (
    NO_HIST,
    InstanceSeries,
    cumulative_buckets,
    hist_buckets,
    hist_parts,
)
from kproxy.policies.telemetry.store import INSTANCE_LABELS_END, Family

if TYPE_CHECKING:
    from kproxy.telemetry.service import TelemetryService

# Sample lines per piece of the /metrics exposition: the loop's slices end between
# pieces, so a piece is what a slice can overrun its budget by (about 0.05 ms).
PIECE_ROWS = 32
# Series labelled between two young collections of a scrape's labelling (the tuples
# they add hold twice as many references for the collection to walk).
LABELS_PER_COLLECTION = 1024
# Instances a scrape looks over between two pieces when none needs label text made
# (about 0.25 to 0.45 ms with their memory cold, at 20,000 instances).
INSTANCES_PER_PIECE = 64


class ClientMetricsCollector:
    """Reads the telemetry state at scrape time, in pieces; expired clients vanish here.

    A piece source for ``kproxy.metrics.exposition``: the loop runs between pieces and keeps
    changing the store, so the walk copies what it iterates (the instances, then each
    instance's series, between pieces) and reads a series' values only when the piece
    holding it is written, within one slice. Sample lines are formatted here rather
    than by prometheus_client's generic renderer, which costs ~10x more per series,
    from each series' label text, made at its first scrape and kept (``InstanceSeries``'
    ``heads`` and ``tails``): a scrape formats only values. Family headers still come from
    prometheus_client, in the format asked for.
    """

    def __init__(self, service: TelemetryService, piece_rows: int = PIECE_ROWS) -> None:
        self.service = service
        self.piece_rows = piece_rows

    def __call__(self) -> Iterator[Piece]:
        service = self.service
        for _ in service.state.expire_steps(service.clock_ms()):
            yield None  # 1,000 instances looked at in one go held the loop for 2 ms
        # Counted after expiry, so they agree with the series below in the same scrape.
        yield GaugeMetricFamily("kproxy_telemetry_client_instances",
                                "Client instances remembered", len(service.state.instances))
        evicted = CounterMetricFamily(
            "kproxy_telemetry_client_instances_evicted", "Client instances forgotten to "
            "make room, by bound: instances (telemetry_max_instances) or bytes "
            "(telemetry_max_instance_bytes)", labels=["bound"])
        for bound, n in service.state.evicted.items():
            evicted.add_metric([bound], n)
        yield evicted
        yield GaugeMetricFamily("kproxy_telemetry_series", "Client metric series exported",
                                service.store.total)
        store = service.store
        instances = list(store.series.values())
        heads: dict[tuple[str, ...], str] = {}  # label text made in this scrape, shared
        tails: dict[tuple[str, ...], str] = {}
        yield from label_new_series(instances, heads, tails)
        # Family name -> its series (their instances and slots, side by side): two deques
        # per family, no new container per series (a scrape must not feed the cyclic
        # garbage collector).
        grouped: dict[str, tuple[deque[InstanceSeries], deque[int]]] = {}
        copied = 0
        for own in instances:
            if len(own.tails) < len(own.slot_of):  # arrived since the labelling above
                _label(own, heads, tails)
            for key, i in own.slot_of.items():  # no yield inside: own is stable
                found = grouped.get(key[0])
                if found is None:
                    found = grouped[key[0]] = (deque(), deque())
                found[0].append(own)
                found[1].append(i)
            copied += len(own.slot_of) or 1  # an instance the cap left no series counts too
            if copied >= self.piece_rows:
                copied = 0
                yield None
        families = dict(store.families)
        for name in sorted(grouped):
            # Taken out as they are written, a piece at a time: the references go a few
            # at a time too (letting go of 250,000 at once held the loop for ~4 ms).
            family, (owners, slots) = families[name], grouped.pop(name)
            yield Metric(family.name, family.help, family.kind, family.unit)  # the header
            # About ``piece_rows`` lines a piece: a histogram series is a line a bucket.
            lines = hist_buckets(owners[0].hists.get(slots[0], NO_HIST)) + 2 if (
                family.kind == "histogram") else 1
            step = max(1, self.piece_rows // lines)
            while slots:
                yield _sample_lines(family, [(owners.popleft(), slots.popleft())
                                             for _ in range(min(step, len(slots)))])


def label_new_series(instances: list[InstanceSeries], heads: dict[tuple[str, ...], str],
                     tails: dict[tuple[str, ...], str]) -> Iterator[Piece]:
    """Label text for the series no scrape has labelled yet, first, in pieces.

    Each instance's new text comes in two tuples of a reference a series, which the
    young collection that meets them walks once (and untracks). Collected as they are
    made, every LABELS_PER_COLLECTION series: left to the one after the walk, 600 new
    clients' (150,000 series) held the loop 2.3 to 3.6 ms in it. Instances with nothing
    to label are looked over ``INSTANCES_PER_PIECE`` a piece: without, a fleet with
    every series labelled was looked over in one slice (20,000 instances, one worker, a
    scratch run: 256 of them took 1.0 to 1.8 ms, their memory cold).
    """
    labelled = 0
    for looked, own in enumerate(instances, 1):
        if len(own.tails) < len(own.slot_of):
            labelled += _label(own, heads, tails)
            if labelled >= LABELS_PER_COLLECTION:
                labelled = 0
                yield COLLECT_YOUNG
            else:
                yield None
        elif looked % INSTANCES_PER_PIECE == 0:
            yield None
    if labelled:
        yield COLLECT_YOUNG


def _escape(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def _label(own: InstanceSeries, heads: dict[tuple[str, ...], str],
           tails: dict[tuple[str, ...], str]) -> int:
    """Label text for an instance's series not labelled yet (the last slots): its
    instance's labels, then its point's attributes. Parts made in one scrape are
    shared: an instance's series hold one ``head`` string. Returns how many it labelled."""
    new_heads, new_tails = [], []
    for key in islice(own.slot_of, len(own.tails), None):
        base, attrs = key[1:INSTANCE_LABELS_END], key[INSTANCE_LABELS_END:]
        head = heads.get(base)
        if head is None:
            head = heads[base] = ",".join(
                f'{k}="{_escape(v)}"' for k, v in zip(base[::2], base[1::2], strict=True))
        tail = tails.get(attrs)
        if tail is None:
            tail = tails[attrs] = "".join(
                f',{k}="{_escape(v)}"' for k, v in zip(attrs[::2], attrs[1::2], strict=True))
        new_heads.append(head)
        new_tails.append(tail)
    own.heads += tuple(new_heads)
    own.tails += tuple(new_tails)
    return len(new_tails)


def _sample_lines(family: Family, series: list[tuple[InstanceSeries, int]]) -> str:
    """Exposition lines (the same in the text format and OpenMetrics) for some series,
    given as their instances and slots; their values are read now."""
    name = family.name
    if family.kind == "histogram":
        out: list[str] = []
        for own, i in series:
            text = own.heads[i] + own.tails[i]
            count, total, bounds, buckets = hist_parts(own.hists.get(i, NO_HIST))
            for le, running in cumulative_buckets(bounds, buckets):
                out.append(f'{name}_bucket{{{text},le="{le}"}} {value_text(running)}\n')
            out.append(f"{name}_count{{{text}}} {value_text(count)}\n")
            out.append(f"{name}_sum{{{text}}} {value_text(total)}\n")
        return "".join(out)
    sample = name + "_total" if family.kind == "counter" else name
    return "".join([f"{sample}{{{own.heads[i]}{own.tails[i]}}} {value_text(own[i])}\n"
                    for own, i in series])
