"""Client telemetry on /metrics: the series of ``kproxy.telemetry``'s store, in pieces.

Kept apart from the push handlers: this side only reads the store, at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, cast

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString as _untyped_float_text

from kproxy.exposition import Piece
from kproxy.policies.telemetry_store import INSTANCE_LABELS, Family, Labels, Series

if TYPE_CHECKING:
    from kproxy.telemetry import TelemetryService

PIECE_ROWS = 32  # series per piece of the /metrics exposition


class ClientMetricsCollector:
    """Reads the telemetry state at scrape time, in pieces; expired clients vanish here.

    A piece source for ``kproxy.exposition``: the loop runs between pieces and keeps
    changing the store, so the walk copies what it iterates (the instances, then each
    instance's series, between pieces) and reads a series' values only when the piece
    holding it is written, within one slice. Sample lines are formatted here rather
    than by prometheus_client's generic renderer, which costs ~10x more per series;
    family headers still come from prometheus_client, in the format asked for.
    """

    def __init__(self, service: TelemetryService, piece_rows: int = PIECE_ROWS) -> None:
        self.service = service
        self.piece_rows = piece_rows

    def __call__(self) -> Iterator[Piece]:
        service = self.service
        service.state.expire(service.clock_ms())
        # Counted after expiry, so they agree with the series below in the same scrape.
        yield GaugeMetricFamily("kproxy_telemetry_client_instances",
                                "Client instances remembered", len(service.state.instances))
        yield GaugeMetricFamily("kproxy_telemetry_series", "Client metric series exported",
                                service.store.total)
        store = service.store
        # Family name -> its series, as two lists of references (no new containers per
        # series: a scrape must not feed the cyclic garbage collector).
        grouped: dict[str, tuple[list[Labels], list[Series]]] = {}
        copied = 0
        for own in list(store.series.values()):
            for (name, labels), series in own.items():  # no yield inside: own is stable
                found = grouped.get(name)
                if found is None:
                    found = grouped[name] = ([], [])
                found[0].append(labels)
                found[1].append(series)
            copied += len(own)
            if copied >= self.piece_rows:
                copied = 0
                yield None
        families = dict(store.families)
        instance_text: dict[Labels, str] = {}
        for name in sorted(grouped):
            family, (all_labels, all_series) = families[name], grouped[name]
            yield Metric(family.name, family.help, family.kind, family.unit)  # the header
            for start in range(0, len(all_labels), self.piece_rows):
                end = start + self.piece_rows
                yield _sample_lines(family, all_labels[start:end], all_series[start:end],
                                    instance_text)


_float_text = cast(Callable[[float], str], _untyped_float_text)  # Prometheus' float text


def _escape(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def _label_text(pairs: tuple[tuple[str, str], ...]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)


def _sample_lines(family: Family, labels: list[Labels], series: list[Series],
                  instance_text: dict[Labels, str]) -> str:
    """Exposition lines (the same in the text format and OpenMetrics) for some series.

    A series' labels are its instance's four, then its point's attributes; the
    instance's part is formatted once per scrape (``instance_text``), which is most
    of the cost of a line.
    """
    out: list[str] = []
    name = family.name
    n = len(INSTANCE_LABELS)
    for lab, s in zip(labels, series, strict=True):
        base = lab[:n]
        head = instance_text.get(base)
        if head is None:
            head = instance_text[base] = _label_text(base)
        text = head + "".join(f',{k}="{_escape(v)}"' for k, v in lab[n:])
        if family.kind == "histogram":
            for le, count in s.cumulative_buckets():
                out.append(f'{name}_bucket{{{text},le="{le}"}} {_float_text(count)}\n')
            out.append(f"{name}_count{{{text}}} {_float_text(s.count)}\n")
            out.append(f"{name}_sum{{{text}}} {_float_text(s.sum)}\n")
        else:
            sample = name + "_total" if family.kind == "counter" else name
            out.append(f"{sample}{{{text}}} {_float_text(s.value)}\n")
    return "".join(out)
