"""The last 15 minutes, for the status page's charts: a bounded ring, pure (no I/O, no trio).

Every ``STEP`` seconds something (the proxy itself, or with ``--workers N`` the
supervisor, which asks each worker) hands ``History.record`` one ``Sample`` per
process: cumulative counters (requests, bytes each way, telemetry pushes, the latency
histogram's buckets) and the connections open now. The ring keeps what changed per
step, summed over processes, so it describes the whole proxy: a process seen for the
first time adds nothing that step; one whose counters went backwards restarted, and
counts from zero. p99 comes from the summed latency buckets of the step (the upper
bound of the bucket it falls in). Per group it keeps total lag and rebalances per step.

Bounded: ``POINTS`` points, and series for at most ``MAX_GROUP_SERIES`` groups (the
least recently reported dropped first), each of ``POINTS`` points.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

STEP = 5.0  # seconds between samples
SPAN = 900.0  # seconds kept: 15 minutes
POINTS = int(SPAN / STEP)
MAX_GROUP_SERIES = 50
# The latency histogram's bucket bounds (seconds), as ``kproxy.metrics.api_metrics``
# counts them; a sample's ``latency`` has one more count, for +Inf.
LATENCY_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                  2.5, 5.0, 10.0, 30.0)
COLUMNS = ("t", "connections", "requests_per_s", "bytes_in_per_s", "bytes_out_per_s",
           "p99_ms", "pushes")


@dataclass
class Sample:
    """One process's figures now: counters since its start, and open connections."""

    requests: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    pushes: int = 0
    connections: int = 0
    latency: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS) + 1))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sample:
        latency = [int(x) for x in data.get("latency", [])][: len(LATENCY_BOUNDS) + 1]
        latency += [0] * (len(LATENCY_BOUNDS) + 1 - len(latency))
        return cls(int(data.get("requests", 0)), int(data.get("bytes_in", 0)),
                   int(data.get("bytes_out", 0)), int(data.get("pushes", 0)),
                   int(data.get("connections", 0)), latency)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _since(now: Sample, before: Sample | None) -> Sample | None:
    """What changed from ``before`` to ``now``; all of ``now`` after a restart."""
    if before is None:
        return None
    counters = ("requests", "bytes_in", "bytes_out", "pushes")
    if any(getattr(now, c) < getattr(before, c) for c in counters) or any(
            a < b for a, b in zip(now.latency, before.latency, strict=True)):
        return now
    return Sample(now.requests - before.requests, now.bytes_in - before.bytes_in,
                  now.bytes_out - before.bytes_out, now.pushes - before.pushes,
                  now.connections,
                  [a - b for a, b in zip(now.latency, before.latency, strict=True)])


def p99_ms(buckets: Sequence[int]) -> float | None:
    total = sum(buckets)
    if not total:
        return None
    rank, seen = 0.99 * total, 0
    for bound, n in zip((*LATENCY_BOUNDS, LATENCY_BOUNDS[-1]), buckets, strict=True):
        seen += n
        if seen >= rank:
            return bound * 1000
    return LATENCY_BOUNDS[-1] * 1000


class History:
    def __init__(self, points: int = POINTS, max_groups: int = MAX_GROUP_SERIES) -> None:
        self.points: deque[tuple[float, int, float, float, float, float | None, int]] = deque(
            maxlen=points)
        self.max_points = points
        self.max_groups = max_groups
        self.last: dict[int, Sample] = {}
        self.last_at: float | None = None
        # group -> its points (t, total lag, rebalances in the step); and its last count.
        self.groups: OrderedDict[str, deque[tuple[float, int | None, int]]] = OrderedDict()
        self.group_counts: dict[str, int] = {}

    def record(self, now: float, samples: Sequence[Sample | None],
               groups: Sequence[tuple[str, int | None, int]] = ()) -> None:
        """One step: ``samples[i]`` is process i's (None: it did not answer), ``now`` Unix
        time; ``groups``: (group, total lag, rebalances so far) as merged."""
        elapsed = None if self.last_at is None else max(now - self.last_at, 1e-3)
        changed: list[Sample] = []
        connections = 0
        for i, s in enumerate(samples):
            if s is None:
                continue
            connections += s.connections
            delta = _since(s, self.last.get(i))
            if delta is not None:
                changed.append(delta)
            self.last[i] = s
        self.last_at = now
        if elapsed is not None:
            latency = [sum(col) for col in zip(*(d.latency for d in changed), strict=True)] \
                if changed else []
            self.points.append((
                round(now, 3), connections,
                round(sum(d.requests for d in changed) / elapsed, 2),
                round(sum(d.bytes_in for d in changed) / elapsed, 1),
                round(sum(d.bytes_out for d in changed) / elapsed, 1),
                p99_ms(latency), sum(d.pushes for d in changed)))
        for gid, lag, count in groups:
            series = self.groups.pop(gid, None)
            if series is None:
                series = deque(maxlen=self.max_points)
            self.groups[gid] = series  # most recently reported last
            before = self.group_counts.get(gid, count)
            series.append((round(now, 3), lag, count - before if count >= before else count))
            self.group_counts[gid] = count
        while len(self.groups) > self.max_groups:
            gone, _ = self.groups.popitem(last=False)
            self.group_counts.pop(gone, None)

    def as_json(self, groups: Sequence[str] = ()) -> dict[str, Any]:
        """The ring as columns, and the series of the groups named (those listed)."""
        cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
        for point in self.points:
            for c, v in zip(COLUMNS, point, strict=True):
                cols[c].append(v)
        return {"step_s": STEP, "span_s": SPAN, "series": cols,
                "groups": {g: {"t": [p[0] for p in self.groups[g]],
                               "lag": [p[1] for p in self.groups[g]],
                               "rebalances": [p[2] for p in self.groups[g]]}
                           for g in groups if g in self.groups}}
