"""What one client instance's metric series are held in, and a series' histogram state.

Split from ``store`` (which names, caps and ingests series) because of what
this part is for: a fleet's series stay for minutes, and a full collection of the
cyclic garbage collector walks every tracked object with the loop held. So nothing
here is tracked per series, and an instance is one tracked object.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from kproxy.codecs.otlp import model as otlp

Labels = tuple[tuple[str, str], ...]
# A series' key: its family's name, then its labels' names and values in turn (the
# instance's labels, then the point's attributes, sorted). Flat, of strings only, as is
# ``Hist``: the collector untracks such a tuple in the first young collection it
# survives. A tuple of tuples stays tracked until every level below it is untracked
# (a collection a level, the outer first), so nested keys reached the oldest generation
# still tracked, one per series: while a fleet grew, full collections came every few
# hundred new series and walked them all with the loop held.
SeriesKey = tuple[str, ...]
# A histogram series' count, sum, bounds and per-bucket (not cumulative) counts, one
# more bucket than bounds, in one flat tuple of floats (``hist_parts`` takes it apart).
Hist = tuple[float, ...]
NO_HIST: Hist = ()

if TYPE_CHECKING:
    _Doubles = array[float]
else:
    _Doubles = array  # not subscriptable at run time before Python 3.12


def cumulative_buckets(bounds: tuple[float, ...],
                       buckets: tuple[float, ...]) -> list[tuple[str, float]]:
    """A histogram's ``le`` label text and cumulative count, bucket by bucket."""
    out, running = [], 0.0
    for bound, n in zip((*bounds, float("inf")), buckets, strict=False):
        running += n
        out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
    return out


class InstanceSeries(_Doubles):
    """One instance's series, held column-wise so the cyclic garbage collector never
    walks a series: a full collection visits every tracked object and every reference
    a tracked container holds, with the loop held, and one object per series made it
    ~100 ms at 250,000 series. An instance is one tracked object here: at 20,000
    instances, two (this and a separate array) made about 40,000 of the 100,000 a full
    collection walked.

    A series is a slot ``i``, given in order as series are added and never freed (a
    series only goes with its instance). The object *is* the counters' and gauges'
    values, an array of doubles (``own[i]``: no object inside for a collection to
    visit); ``slot_of`` finds a slot by its key (a flat tuple of strings: untracked after
    a young collection, and the dict after the next full one); ``hists`` holds a
    histogram's state (a flat tuple of floats, replaced whole). ``heads`` and ``tails``
    hold the label text of the slots a scrape labelled, in slot order, as tuples of
    strings (untracked): ``head`` the instance's labels (one string shared), ``tail``
    the point's attributes with a leading comma. Compared and hashed by identity, as
    the store's bookkeeping is, never by its values.
    """

    __slots__ = ("heads", "hists", "slot_of", "tails")
    # By identity, as the store compares it (an array is unhashable: its values change).
    __hash__ = object.__hash__  # type: ignore[assignment]

    def __new__(cls) -> InstanceSeries:
        return cast(InstanceSeries, super().__new__(cls, "d"))

    def __init__(self) -> None:
        self.slot_of: dict[SeriesKey, int] = {}
        self.hists: dict[int, Hist] = {}
        self.heads: tuple[str, ...] = ()
        self.tails: tuple[str, ...] = ()

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    def add(self, key: SeriesKey) -> int:
        """A new series' slot."""
        i = self.slot_of[key] = len(self)
        self.append(0.0)
        return i

    def series(self, i: int) -> Series:
        return Series(self[i], *hist_parts(self.hists.get(i, NO_HIST)))


@dataclass(frozen=True, slots=True)
class Series:
    """One series' values at one moment, as ``MetricsStore.snapshot`` reads them; the
    store itself keeps none of these (see ``InstanceSeries``)."""

    value: float = 0.0
    count: float = 0.0  # histograms
    sum: float = 0.0
    bounds: tuple[float, ...] = ()
    buckets: tuple[float, ...] = ()  # per bucket, not cumulative

    def cumulative_buckets(self) -> list[tuple[str, float]]:
        return cumulative_buckets(self.bounds, self.buckets)


def hist_parts(hist: Hist) -> tuple[float, float, tuple[float, ...], tuple[float, ...]]:
    """A histogram state's count, sum, bounds and per-bucket counts."""
    if not hist:
        return 0.0, 0.0, (), ()
    bounds = (len(hist) - 3) // 2
    return hist[0], hist[1], hist[2:2 + bounds], hist[2 + bounds:]


def hist_buckets(hist: Hist) -> int:
    """How many buckets a histogram state holds."""
    return (len(hist) - 1) // 2 if hist else 0


def histogram_state(old: Hist | None, point: otlp.HistogramPoint, accumulate: bool) -> Hist:
    """A histogram series' new state: a new flat tuple of floats (see ``Hist``)."""
    bounds = tuple(point.explicit_bounds)
    counts = [float(c) for c in point.bucket_counts]
    if len(counts) != len(bounds) + 1:
        counts = (counts + [0.0] * (len(bounds) + 1))[: len(bounds) + 1]
    if accumulate and old:
        count, total, kept, buckets = hist_parts(old)
        if kept == bounds:
            return (count + point.count, total + (point.sum or 0.0), *kept,
                    *(a + b for a, b in zip(buckets, counts, strict=True)))
    return float(point.count), point.sum or 0.0, *bounds, *counts
