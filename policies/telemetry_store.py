"""Client metrics as Prometheus series: naming, typing, accumulation and a series cap.

Pure state: OTLP points go in (``ingest``), a snapshot comes out at scrape time.
Monotonic sums become counters, gauges and non-monotonic sums gauges, explicit-
bucket histograms histograms. With delta temporality the values are accumulated
here, so Prometheus always sees cumulative series. The total number of series is
capped; what does not fit is dropped and counted, never grown.
"""

from __future__ import annotations

import functools
import re
import uuid
from dataclasses import dataclass, field
from typing import Literal

from kproxy.codecs import otlp

Kind = Literal["counter", "gauge", "histogram"]
Labels = tuple[tuple[str, str], ...]
INSTANCE_LABELS = ("client_instance_id", "client_id", "client_software_name",
                   "client_software_version")
_BAD_CHARS = re.compile(r"[^a-zA-Z0-9_]")
# Label names and values come from clients: cut short, so that the series cap also
# bounds the bytes of a scrape (50,000 series of 30 KB client ids would be 1.5 GB).
MAX_LABEL_NAME = 128
MAX_LABEL_VALUE = 256


@functools.lru_cache(maxsize=4096)  # a fleet sends the same few hundred names
def metric_name(prefix: str, otlp_name: str) -> str:
    name = _BAD_CHARS.sub("_", prefix + otlp_name)
    return "_" + name if name[:1].isdigit() else name


@functools.lru_cache(maxsize=4096)
def label_name(key: str) -> str:
    name = _BAD_CHARS.sub("_", key[:MAX_LABEL_NAME])
    if name[:1].isdigit() or name.startswith("__"):
        name = "attr_" + name.lstrip("_")
    return "attr_" + name if name in INSTANCE_LABELS else name


def label_value(value: otlp.AttrValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)[:MAX_LABEL_VALUE]  # ints (librdkafka's node.id) keep their digits


@dataclass
class Series:
    value: float = 0.0
    count: float = 0.0  # histograms
    sum: float = 0.0
    bounds: tuple[float, ...] = ()
    buckets: list[float] = field(default_factory=list)  # per bucket, not cumulative

    def cumulative_buckets(self) -> list[tuple[str, float]]:
        out, running = [], 0.0
        for bound, n in zip((*self.bounds, float("inf")), self.buckets, strict=False):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out


@dataclass
class Family:
    name: str
    kind: Kind
    help: str
    unit: str = ""


@dataclass
class IngestStats:
    points: int = 0
    dropped_by_cap: int = 0
    type_conflicts: int = 0
    unsupported: int = 0


class MetricsStore:
    def __init__(self, prefix: str = "", max_series: int = 50_000) -> None:
        self.prefix = prefix
        self.max_series = max_series
        self.families: dict[str, Family] = {}
        self.series: dict[uuid.UUID, dict[tuple[str, Labels], Series]] = {}
        self.total = 0

    def forget(self, instance_id: uuid.UUID) -> None:
        gone = self.series.pop(instance_id, None)
        if gone:
            self.total -= len(gone)

    def ingest(self, instance_id: uuid.UUID, instance_labels: dict[str, str],
               resources: list[otlp.ResourceMetrics], delta: bool) -> IngestStats:
        stats = IngestStats()
        own = self.series.setdefault(instance_id, {})
        base = tuple((k, instance_labels.get(k, "")[:MAX_LABEL_VALUE]) for k in INSTANCE_LABELS)
        for rm in resources:
            for scope in rm.scopes:
                for metric in scope.metrics:
                    self._ingest_metric(own, base, metric, delta, stats)
        return stats

    def _family(self, metric: otlp.Metric, stats: IngestStats) -> Family | None:
        kind: Kind
        if metric.kind == "sum":
            kind = "counter" if metric.monotonic else "gauge"
        elif metric.kind in ("gauge", "histogram"):
            kind = metric.kind
        else:
            stats.unsupported += len(metric.points) or 1
            return None
        name = metric_name(self.prefix, metric.name)
        if kind == "counter" and name.endswith("_total"):
            name = name[: -len("_total")]  # the exposition adds it back
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = Family(name, kind, metric.description or metric.name,
                                                  metric.unit)
        elif family.kind != kind:
            stats.type_conflicts += len(metric.points)
            return None
        return family

    def _ingest_metric(self, own: dict[tuple[str, Labels], Series], base: Labels,
                       metric: otlp.Metric, delta: bool, stats: IngestStats) -> None:
        family = self._family(metric, stats)
        if family is None:
            return
        accumulate = delta and metric.temporality == "delta"
        for point in metric.points:
            attrs = tuple(sorted((label_name(k), label_value(v))
                                 for k, v in point.attributes.items()))
            key = (family.name, base + attrs)
            series = own.get(key)
            if series is None:
                if self.total >= self.max_series:
                    stats.dropped_by_cap += 1
                    continue
                series = own[key] = Series()
                self.total += 1
            stats.points += 1
            if isinstance(point, otlp.HistogramPoint):
                _histogram(series, point, accumulate)
            elif isinstance(point, otlp.NumberPoint):
                series.value = series.value + point.value if accumulate and (
                    family.kind == "counter" or metric.kind == "sum") else float(point.value)

    def snapshot(self) -> list[tuple[Family, list[tuple[Labels, Series]]]]:
        grouped: dict[str, list[tuple[Labels, Series]]] = {}
        for own in self.series.values():
            for (name, labels), series in own.items():
                grouped.setdefault(name, []).append((labels, series))
        return [(self.families[name], rows) for name, rows in sorted(grouped.items())]


def _histogram(series: Series, point: otlp.HistogramPoint, accumulate: bool) -> None:
    bounds = tuple(point.explicit_bounds)
    counts = [float(c) for c in point.bucket_counts]
    if len(counts) != len(bounds) + 1:
        counts = (counts + [0.0] * (len(bounds) + 1))[: len(bounds) + 1]
    if accumulate and series.bounds == bounds and series.buckets:
        series.buckets = [a + b for a, b in zip(series.buckets, counts, strict=True)]
        series.count += point.count
        series.sum += point.sum or 0.0
    else:
        series.bounds, series.buckets = bounds, counts
        series.count, series.sum = float(point.count), point.sum or 0.0
