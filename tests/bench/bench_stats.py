"""Summaries of a benchmark run's repetitions: medians, paired comparisons, spreads.

A comparison between two paths is taken within each repetition first (``paired``):
every repetition runs on freshly started brokers, so what its brokers and the
machine did to that repetition as a whole cancels out. The median over the
repetitions is the figure; the spread of the per-repetition values says how far to
trust it.
"""

from __future__ import annotations

import functools
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_measure import Path_

Combine = Callable[[float, float], float]


def median(path: Path_, key: str, field_: str) -> float | None:
    vals = [r[field_] for r in path.results.get(key, []) if field_ in r]
    return statistics.median(vals) if vals else None


def paired_values(a: Path_ | None, b: Path_ | None, key: str, field_: str,
                  combine: Combine) -> list[float]:
    """``combine(a, b)`` within each repetition, in the order they ran."""
    if a is None or b is None:
        return []
    return [combine(x[field_], y[field_])
            for x, y in zip(a.results.get(key, []), b.results.get(key, []), strict=False)
            if field_ in x and y.get(field_)]


def paired(a: Path_ | None, b: Path_ | None, key: str, field_: str,
           combine: Combine) -> float | None:
    """The median over repetitions of ``combine(a, b)`` within each repetition."""
    vals = paired_values(a, b, key, field_, combine)
    return statistics.median(vals) if vals else None


def quartiles(vals: list[float]) -> tuple[float, float]:
    """Lower and upper quartile (the single value of a one-repetition run)."""
    if len(vals) < 2:
        return (vals[0], vals[0]) if vals else (float("nan"), float("nan"))
    q = statistics.quantiles(vals, n=4, method="inclusive")
    return q[0], q[2]


def round_summary(vals: list[float], fmt: str = ".2f") -> str:
    """"median (quartiles q1 to q3; lowest to highest)" of per-round values, each in
    ``fmt`` ("+.2f" for signed differences)."""
    q1, q3 = quartiles(vals)
    return (f"{statistics.median(vals):{fmt}} (quartiles {q1:{fmt}} to {q3:{fmt}}; "
            f"{min(vals):{fmt}} to {max(vals):{fmt}})")


SectionBody = Callable[[dict[str, Any]], list[str]]
Section = Callable[[dict[str, Any] | None], list[str]]


def measured_section(heading: str, key: str = "rounds") -> Callable[[SectionBody], Section]:
    """A section of the report: ``heading``, then what the decorated function makes of
    the section's data; or, when nothing was measured under ``key``, its error (or "no
    rounds") in its place."""
    def wrap(body: SectionBody) -> Section:
        @functools.wraps(body)
        def section(data: dict[str, Any] | None) -> list[str]:
            if not data or data.get("error") or not data.get(key):
                return [heading, "",
                        f"- not measured: {(data or {}).get('error', 'no rounds')}", ""]
            return [heading, "", *body(data)]
        return section
    return wrap


def spread(path: Path_, key: str, field_: str = "mb_s") -> str:
    vals = [r[field_] for r in path.results.get(key, []) if field_ in r]
    return f"{min(vals):.0f}-{max(vals):.0f}" if vals else "-"


def median_range(vals: list[float], digits: int = 2) -> str:
    """"median (lowest-highest)"; "-" when no repetition gave a value (a smoke run's
    CPU reads can all be zero where CPU is read in 10 ms ticks)."""
    if not vals:
        return "-"
    return (f"{statistics.median(vals):.{digits}f} ({min(vals):.{digits}f}-"
            f"{max(vals):.{digits}f})")


def fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"
