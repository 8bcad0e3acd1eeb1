"""Client metrics as Prometheus series: naming, typing, accumulation and a series cap.

Pure state: OTLP points go in (``ingest``), a snapshot comes out at scrape time.
Monotonic sums become counters, gauges and non-monotonic sums gauges, explicit-
bucket histograms histograms. With delta temporality the values are accumulated
here, so Prometheus always sees cumulative series. The total number of series is
capped; what does not fit is dropped and counted, never grown.

Everything here is keyed by what clients send, so every dimension is bounded:
names and label values are shortened (``policies.bounds``), a point keeps at most
``MAX_POINT_LABELS`` attributes, the series are capped in count (``max_series``)
and in estimated bytes (``max_series_bytes``), and so are the metric families
(``max_families``); a family goes when its last series does.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Literal, cast

from kproxy.codecs.otlp import model as otlp
from kproxy.policies.bounds import (
    MAX_HELP_CHARS,
    MAX_LABEL_CHARS,
    MAX_NAME_CHARS,
    MAX_UNIT_CHARS,
    bounded,
    clipped,
)
from kproxy.policies.telemetry.series import (
    InstanceSeries,
    Labels,
    Series,
    SeriesKey,
    histogram_state,
)

# What names an instance's series: ``TelemetryState``'s id (an int, not tracked).
InstanceKey = Hashable
Kind = Literal["counter", "gauge", "histogram"]
INSTANCE_LABELS = ("client_instance_id", "client_id", "client_software_name",
                   "client_software_version")
INSTANCE_LABELS_END = 1 + 2 * len(INSTANCE_LABELS)  # where a key's attributes start
_BAD_CHARS = re.compile(r"[^a-zA-Z0-9_]")
DEFAULT_MAX_SERIES_BYTES = 32 * 1024 * 1024  # estimated, see series_size
DEFAULT_MAX_FAMILIES = 10_000
MAX_POINT_LABELS = 32  # attributes of one point that become labels; the rest are dropped
SERIES_OVERHEAD = 400  # bytes per series beside its label strings and their text
TAIL_OVERHEAD = 50  # a string's header: the series' attributes as exposition text
STEP_POINTS = 32  # points ingested between two yields of MetricsStore.ingest_steps


def metric_name(prefix: str, otlp_name: str) -> str:
    """The Prometheus name; shortened first, so the cache below never keeps a long one."""
    return _metric_name(prefix, bounded(otlp_name, MAX_NAME_CHARS))


def label_name(key: str) -> str:
    return _label_name(bounded(key, MAX_NAME_CHARS))


@functools.lru_cache(maxsize=4096)  # a fleet sends the same few hundred names
def _metric_name(prefix: str, otlp_name: str) -> str:
    name = _BAD_CHARS.sub("_", prefix + otlp_name)
    return "_" + name if name[:1].isdigit() else name


@functools.lru_cache(maxsize=4096)
def _label_name(key: str) -> str:
    name = _BAD_CHARS.sub("_", key)
    if name[:1].isdigit() or name.startswith("__"):
        name = "attr_" + name.lstrip("_")
    return "attr_" + name if name in INSTANCE_LABELS else name


def label_value(value: otlp.AttrValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return bounded(value, MAX_LABEL_CHARS)
    return str(value)  # ints (librdkafka's node.id) keep their value as digits


@dataclass
class Family:
    name: str
    kind: Kind
    help: str
    unit: str = ""
    series: int = 0  # how many series (across instances) belong to it


@dataclass(frozen=True, slots=True)
class Landing:
    """The series each number point of one push updated (its slot in the instance's
    ``InstanceSeries``), in push order, and whether it adds up under delta
    temporality: a later push shaped the same (the same metrics and attributes, see
    ``codecs.otlp.shape``) updates the same series.

    A point the series cap kept out has no series (-1); ``capped`` holds its
    family, which must still be the one registered for a repeat to be dropped the
    same way (a family of another kind would count a type conflict instead).
    """

    own: InstanceSeries  # the instance's series when it was noted
    series: tuple[int, ...]  # plain ints: a landing adds nothing the collector tracks
    summed: tuple[bool, ...]
    capped: tuple[Family, ...] = ()


# A Landing's series, flags and capped families, growing during an ingest.
Noted = tuple[list[int], list[bool], list[Family]]


@dataclass
class IngestStats:
    points: int = 0
    dropped_by_cap: int = 0
    type_conflicts: int = 0
    unsupported: int = 0
    dropped_by_bytes: int = 0  # series not added: the byte bound was reached
    dropped_families: int = 0  # points of a new metric name beyond max_families
    labels_dropped: int = 0  # attributes beyond MAX_POINT_LABELS on a point


def series_size(key: SeriesKey) -> int:
    """Estimated bytes one series holds: its labels, their exposition text and a fixed
    overhead. Of the text, the attributes' part (its ``tail``) is the series' own;
    the instance's part is one string per instance, already paid for by counting the
    instance's label strings in each of its series, which share them."""
    attrs = key[INSTANCE_LABELS_END:]
    return (SERIES_OVERHEAD + sum(map(len, key))
            + TAIL_OVERHEAD + sum(map(len, attrs)) + 2 * len(attrs))


def labels_of(key: SeriesKey) -> Labels:
    """A series key's labels as (name, value) pairs."""
    return tuple(zip(key[1::2], key[2::2], strict=True))


class MetricsStore:
    def __init__(self, prefix: str = "", max_series: int = 50_000,
                 max_series_bytes: int = DEFAULT_MAX_SERIES_BYTES,
                 max_families: int = DEFAULT_MAX_FAMILIES) -> None:
        self.prefix = prefix
        self.max_series = max_series
        self.max_series_bytes = max_series_bytes
        self.max_families = max_families
        self.families: dict[str, Family] = {}
        self.series: dict[InstanceKey, InstanceSeries] = {}
        self.total = 0
        self.bytes = 0

    def forget(self, instance_id: InstanceKey) -> None:
        gone = self.series.pop(instance_id, None)
        if gone is None:
            return
        self.total -= len(gone.slot_of)
        for key in gone.slot_of:
            self.bytes -= series_size(key)
            family = self.families.get(key[0])
            if family is not None:
                family.series -= 1
                if family.series <= 0:
                    del self.families[key[0]]

    def ingest(self, instance_id: InstanceKey, instance_labels: dict[str, str],
               resources: list[otlp.ResourceMetrics], delta: bool) -> IngestStats:
        stats = IngestStats()
        for _ in self.ingest_steps(instance_id, instance_labels, resources, delta, stats):
            pass
        return stats

    def ingest_noting(self, instance_id: InstanceKey, instance_labels: dict[str, str],
                      resources: list[otlp.ResourceMetrics],
                      delta: bool) -> tuple[IngestStats, Landing | None]:
        """``ingest``, and where its points went (``land``) if each went into a series or
        was kept out by the series cap, and nothing else was dropped or not kept."""
        stats, noted = IngestStats(), cast(Noted, ([], [], []))
        own = self._own(instance_id)
        for _ in self.ingest_steps(instance_id, instance_labels, resources, delta, stats,
                                   noted):
            pass
        series, summed, capped = noted
        landed = len(series) - series.count(-1)
        if stats != IngestStats(points=landed, dropped_by_cap=len(capped)) or (
                len(series) - landed != len(capped)):
            return stats, None  # a repeat would not go the same way
        return stats, Landing(own, tuple(series), tuple(summed), tuple(capped))

    def land(self, instance_id: InstanceKey, landing: Landing, values: list[int | float],
             delta: bool) -> IngestStats | None:
        """A push shaped like the one ``landing`` noted, given its point values: what
        ``ingest`` would do, when that is sure (else None). Every noted series still
        exists while the instance's series are the ones noted (a series only goes with
        its instance); a capped point is dropped again while the cap is reached and its
        family stands (no series is added in between: each point's fate is the same)."""
        if self.series.get(instance_id) is not landing.own or len(values) != len(
                landing.series):
            return None
        if landing.capped and (self.total < self.max_series or any(
                self.families.get(family.name) is not family for family in landing.capped)):
            return None
        column = landing.own  # an array: it takes ints and floats as doubles
        if delta:
            for i, summed, value in zip(landing.series, landing.summed, values, strict=True):
                if i >= 0:
                    column[i] = column[i] + value if summed else value
        else:
            for i, value in zip(landing.series, values, strict=True):
                if i >= 0:
                    column[i] = value
        return IngestStats(points=len(values) - len(landing.capped),
                           dropped_by_cap=len(landing.capped))

    def ingest_steps(self, instance_id: InstanceKey, instance_labels: dict[str, str],
                     resources: list[otlp.ResourceMetrics], delta: bool,
                     stats: IngestStats, noted: Noted | None = None) -> Iterator[None]:
        """``ingest`` in steps of about ``STEP_POINTS`` points; yields between them.

        A step ends after the metric that crossed ``STEP_POINTS``: a metric's points
        are ingested together (the decoder's limits bound how many it can have).

        Between two steps the instance may be forgotten (expiry); the rest of the
        push is then dropped rather than written into series nobody holds.
        """
        own = self._own(instance_id)
        base = tuple(chain.from_iterable(
            (k, bounded(instance_labels.get(k, ""), MAX_LABEL_CHARS)) for k in INSTANCE_LABELS))
        for rm in resources:
            for scope in rm.scopes:
                for metric in scope.metrics:
                    for start in range(0, max(len(metric.points), 1), STEP_POINTS):
                        if self.series.get(instance_id) is not own:
                            return
                        # Looked up again after every yield: a forget may have
                        # removed the family in between.
                        family = self._family(metric, stats, counted=start == 0)
                        if family is None:
                            break
                        self._ingest_points(own, base, family, metric,
                                            metric.points[start : start + STEP_POINTS],
                                            delta, stats, noted)
                        yield

    def _own(self, instance_id: InstanceKey) -> InstanceSeries:
        own = self.series.get(instance_id)
        if own is None:
            own = self.series[instance_id] = InstanceSeries()
        return own

    def _family(self, metric: otlp.Metric, stats: IngestStats,
                counted: bool = True) -> Family | None:
        """The family a metric's points go to; None (counted once) if they go nowhere."""
        kind: Kind
        if metric.kind == "sum":
            kind = "counter" if metric.monotonic else "gauge"
        elif metric.kind in ("gauge", "histogram"):
            kind = metric.kind
        else:
            stats.unsupported += (len(metric.points) or 1) if counted else 0
            return None
        name = metric_name(self.prefix, metric.name)
        if kind == "counter" and name.endswith("_total"):
            name = name[: -len("_total")]  # the exposition adds it back
        family = self.families.get(name)
        if family is None:
            if len(self.families) >= self.max_families:
                stats.dropped_families += len(metric.points) if counted else 0
                return None
            family = self.families[name] = Family(
                name, kind, clipped(metric.description or metric.name, MAX_HELP_CHARS),
                clipped(metric.unit, MAX_UNIT_CHARS))
        elif family.kind != kind:
            stats.type_conflicts += len(metric.points) if counted else 0
            return None
        return family

    def _ingest_points(self, own: InstanceSeries, base: tuple[str, ...],
                       family: Family, metric: otlp.Metric, points: list[otlp.Point],
                       delta: bool, stats: IngestStats, noted: Noted | None) -> None:
        accumulate = delta and metric.temporality == "delta"
        summed = metric.temporality == "delta" and (family.kind == "counter"
                                                    or metric.kind == "sum")
        for point in points:
            if noted is not None:  # None until the point has its series
                noted[0].append(-1)
                noted[1].append(summed)
            items = point.attributes.items()
            if len(items) > MAX_POINT_LABELS:
                stats.labels_dropped += len(items) - MAX_POINT_LABELS
                items = list(items)[:MAX_POINT_LABELS]  # type: ignore[assignment]
            key = (family.name, *base, *chain.from_iterable(
                sorted((label_name(k), label_value(v)) for k, v in items))) if items else (
                family.name, *base)
            i = own.slot_of.get(key)
            if i is None:
                if self.total >= self.max_series:
                    stats.dropped_by_cap += 1
                    if noted is not None:
                        noted[2].append(family)
                    continue
                size = series_size(key)
                if self.bytes + size > self.max_series_bytes:
                    stats.dropped_by_bytes += 1
                    continue
                i = own.add(key)
                self.total += 1
                self.bytes += size
                family.series += 1
            stats.points += 1
            if isinstance(point, otlp.HistogramPoint):
                own.hists[i] = histogram_state(own.hists.get(i), point, accumulate)
            elif isinstance(point, otlp.NumberPoint):
                own[i] = own[i] + point.value if accumulate and summed else float(point.value)
                if noted is not None:
                    noted[0][-1] = i
        if not family.series:  # new, and nothing fitted: not kept for a name with no series
            del self.families[family.name]

    def snapshot(self) -> list[tuple[Family, list[tuple[Labels, Series]]]]:
        grouped: dict[str, list[tuple[Labels, Series]]] = {}
        for own in self.series.values():
            for key, i in own.slot_of.items():
                grouped.setdefault(key[0], []).append((labels_of(key), own.series(i)))
        return [(self.families[name], rows) for name, rows in sorted(grouped.items())]
