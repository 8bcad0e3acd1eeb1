"""Combining the /metrics of several kproxy workers into one exposition.

Each worker is a process with its own registry; the supervisor scrapes them all and
serves one text in the Prometheus format, one line per series. Series with the same
name and labels are combined by what they mean:

- the proxy's counters, histograms and additive gauges (connections, bytes held,
  limits, series counts): summed — each worker counts its own share;
- gauges that describe the one backend or a state all workers share (topology epoch,
  brokers known, listeners), and counters of an event each worker sees for itself
  (topology changes, reloads): the highest; readiness: the lowest; ``_created``: the
  earliest;
- client telemetry (every family not named ``kproxy_*``): a client's series live in
  the worker that holds its connection, and in two workers only after it reconnected
  to another one; clients push cumulative values by default, so the highest is the
  newest (with delta temporality, ``sum_clients``: each worker holds the deltas it
  received, so they add up). One line per series either way: no duplicates.

``kproxy.metrics.worker_merge`` picks the lines this combines: a client instance's
from the worker with its newest push, the consumer-group families merged from the
workers' facts, and the carried values that keep counters from going backwards.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# Proxy gauges that are not a per-worker share.
MAX_GAUGES = frozenset({"kproxy_topology_epoch", "kproxy_backend_brokers",
                        "kproxy_broker_listeners", "kproxy_open_file_limit",
                        # the supervisor's global figure; each worker's own is never above it
                        "kproxy_max_connections_effective",
                        # the longest of any worker's, not a share
                        "kproxy_telemetry_decode_longest_step_cpu_seconds",
                        "kproxy_scrape_seconds", "kproxy_scrape_longest_slice_seconds",
                        "kproxy_scrape_longest_slice_cpu_seconds"})
MIN_GAUGES = frozenset({"kproxy_ready"})
# Counters of one event every worker sees for itself (a backend change, a reload on
# SIGHUP): the proxy saw it once, so the highest count, as one process would show.
# (The text format names a counter's family after its samples, ``_total`` included;
# OpenMetrics without it.)
SHARED_EVENT_COUNTERS = frozenset({"kproxy_topology_changes", "kproxy_topology_changes_total",
                                   "kproxy_config_reloads", "kproxy_config_reloads_total"})
SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?$")
_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created", "_info")


def family_of(sample: str, types: dict[str, str],
              suffixes: tuple[str, ...] = _SUFFIXES) -> str:
    """The family a sample belongs to (``x_bucket`` belongs to histogram ``x``)."""
    if sample in types:
        return sample
    for suffix in suffixes:
        if sample.endswith(suffix) and sample[: -len(suffix)] in types:
            return sample[: -len(suffix)]
    return sample


def _combine(family: str, sample: str, kind: str, values: list[float],
             sum_clients: bool) -> float:
    if sample.endswith("_created"):
        return min(values)  # when the first worker's series began
    if not family.startswith("kproxy_"):
        if sum_clients and kind in ("counter", "histogram", "summary"):
            return sum(values)  # delta temporality: each worker's deltas
        return max(values)  # client telemetry: the newest cumulative value
    if family in MAX_GAUGES or family in SHARED_EVENT_COUNTERS:
        return max(values)
    if family in MIN_GAUGES:
        return min(values)
    return sum(values)


def merge_expositions(texts: Iterable[str], sum_clients: bool = False,
                      passed: dict[str, list[str]] | None = None) -> str:
    """One Prometheus text exposition out of several, each series once.

    ``passed``: per family, sample lines known to be the only ones of their series
    (``worker_merge`` decides): written after the family's combined samples as they are.
    """
    help_: dict[str, str] = {}
    types: dict[str, str] = {}
    order: list[str] = []  # families, first seen first
    series: dict[str, dict[tuple[str, str], list[float]]] = {}
    for text in texts:
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                parts = line.split(" ", 3)
                if len(parts) < 4:
                    continue
                name = parts[2]
                (help_ if parts[1] == "HELP" else types).setdefault(name, parts[3])
                if name not in series:
                    series[name] = {}
                    order.append(name)
                continue
            match = SAMPLE_LINE.match(line)
            if match is None:
                continue
            sample, labels, value = match.group(1), match.group(2) or "", match.group(3)
            family = family_of(sample, types)
            if family not in series:
                series[family] = {}
                order.append(family)
            try:
                number = float(value)
            except ValueError:
                continue
            series[family].setdefault((sample, labels), []).append(number)
    out: list[str] = []
    for family in order:
        if family in help_:
            out.append(f"# HELP {family} {help_[family]}")
        if family in types:
            out.append(f"# TYPE {family} {types[family]}")
        kind = types.get(family, "untyped")
        for (sample, labels), values in series[family].items():
            value = _combine(family, sample, kind, values, sum_clients)
            out.append(f"{sample}{labels} {_format(value)}")
        if passed and family in passed:
            out.extend(passed.pop(family))
    for lines in (passed or {}).values():  # no header seen: as they came
        out.extend(lines)
    return "\n".join(out) + "\n"


def _format(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    if value == float("-inf"):
        return "-Inf"
    return repr(float(value))
