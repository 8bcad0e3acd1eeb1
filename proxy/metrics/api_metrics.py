"""Per-API request figures: plain numbers on the relay's path, rendered in pieces.

Every request and every response touches these: a count and its bytes each way, and
the time to answer. As prometheus_client children each touch took a lock and a few
calls, and at a scrape their families were collected and rendered in one go: with
every API in use, the latency histogram alone (18 lines an API) held the event loop
for milliseconds, and every connection with it. Here a touch is a few additions (the
relay is one thread; each worker process has its own), and the families are a piece
source of ``kproxy.metrics.exposition``, written a few APIs at a time between which the relay
runs. The series read exactly as prometheus_client's counters and histogram would,
without their ``_created`` samples.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client.core import Metric

from kproxy.codecs.api_keys import API_KEYS, api_name
from kproxy.metrics.exposition import Piece, value_text

UNKNOWN_API = -1  # every api key the proxy does not know shares one label, "unknown"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0, 30.0)
PIECE_APIS = 4  # APIs per piece of the exposition (a histogram is 18 lines an API)

_LE = [value_text(b) for b in LATENCY_BUCKETS] + ["+Inf"]


class ApiStats:
    """One API's figures since start; counters only grow."""

    __slots__ = ("buckets", "label", "latency_sum", "name", "request_bytes", "requests",
                 "response_bytes")

    def __init__(self, name: str) -> None:
        self.name = name
        self.label = f'api="{name}"'  # API names are the protocol's: nothing to escape
        self.requests = 0
        self.request_bytes = 0
        self.response_bytes = 0
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)  # per bucket, the last +Inf
        self.latency_sum = 0.0

    def request(self, size: int) -> None:
        self.requests += 1
        self.request_bytes += size

    def response(self, size: int, seconds: float) -> None:
        """A response of ``size`` bytes left, ``seconds`` after its request arrived."""
        self.response_bytes += size
        self.latency_sum += seconds
        # The first bucket whose bound is at least the value, as Prometheus counts.
        self.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1


class ApiFigures:
    """The per-API figures, one ``ApiStats`` per API key seen, and their exposition."""

    FAMILIES = (
        ("kproxy_requests", "Requests relayed or answered, by API", "requests"),
        ("kproxy_request_bytes", "Request bytes from clients, by API", "request_bytes"),
        ("kproxy_response_bytes", "Response bytes to clients, by API", "response_bytes"),
    )
    LATENCY = ("kproxy_request_latency_seconds", "Time from a request's arrival to its "
               "response leaving the proxy")

    def __init__(self) -> None:
        self._by_key: dict[int, ApiStats] = {}

    def api(self, api_key: int) -> ApiStats:
        """The figures of one API; a key a client made up gets no label of its own."""
        found = self._by_key.get(api_key)
        if found is None:
            if api_key not in API_KEYS:
                api_key = UNKNOWN_API
            found = self._by_key.get(api_key)
            if found is None:
                found = ApiStats(api_name(api_key) if api_key != UNKNOWN_API else "unknown")
                self._by_key[api_key] = found
        return found

    def totals(self) -> tuple[int, int, int, list[int]]:
        """Over every API: requests, request bytes, response bytes, latency bucket counts
        (per bucket of ``LATENCY_BUCKETS``, the last +Inf), for the status page's history."""
        stats = list(self._by_key.values())
        buckets = [sum(col) for col in zip(*(s.buckets for s in stats), strict=True)] \
            if stats else [0] * (len(LATENCY_BUCKETS) + 1)
        return (sum(s.requests for s in stats), sum(s.request_bytes for s in stats),
                sum(s.response_bytes for s in stats), buckets)

    def labels(self) -> set[str]:
        """The ``api`` label values in use (made-up keys share ``unknown``)."""
        return {s.name for s in self._by_key.values()}

    def pieces(self) -> Iterator[Piece]:
        """The four families, in the order the APIs were first seen."""
        stats = list(self._by_key.values())
        for name, help_text, attr in self.FAMILIES:
            yield Metric(name, help_text, "counter")
            for start in range(0, len(stats), PIECE_APIS):
                yield "".join([f"{name}_total{{{s.label}}} {value_text(getattr(s, attr))}\n"
                               for s in stats[start : start + PIECE_APIS]])
        name, help_text = self.LATENCY
        yield Metric(name, help_text, "histogram")
        for start in range(0, len(stats), PIECE_APIS):
            yield "".join(_histogram_lines(name, s) for s in stats[start : start + PIECE_APIS])


def _histogram_lines(name: str, s: ApiStats) -> str:
    out = []
    running = 0
    for le, n in zip(_LE, s.buckets, strict=True):
        running += n
        out.append(f'{name}_bucket{{{s.label},le="{le}"}} {value_text(running)}\n')
    out.append(f"{name}_count{{{s.label}}} {value_text(running)}\n")
    out.append(f"{name}_sum{{{s.label}}} {value_text(s.latency_sum)}\n")
    return "".join(out)
