"""The per-API figures read on /metrics exactly as prometheus_client's would."""

from __future__ import annotations

import random

import trio
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as om_generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families as text_parse

from kproxy.codecs.api_keys import API_KEYS, api_name
from kproxy.metrics.api_metrics import LATENCY_BUCKETS, PIECE_APIS, ApiFigures
from kproxy.metrics.exposition import Exposition

_FAMILIES = {"kproxy_requests", "kproxy_request_bytes", "kproxy_response_bytes",
             "kproxy_request_latency_seconds"}
Sample = tuple[str, frozenset[tuple[str, str]], float]


def _samples(text: str, openmetrics: bool) -> set[Sample]:
    parse = om_parse if openmetrics else text_parse
    return {(s.name, frozenset(s.labels.items()), s.value) for family in parse(text)
            if family.name in _FAMILIES for s in family.samples
            if not s.name.endswith("_created")}


def _reference(observed: list[tuple[int, int, int, float]]) -> CollectorRegistry:
    """The same figures kept by prometheus_client, as the proxy kept them before."""
    r = CollectorRegistry()
    families = [Counter(n, "h", ["api"], registry=r)
                for n in ("kproxy_requests", "kproxy_request_bytes", "kproxy_response_bytes")]
    latency = Histogram("kproxy_request_latency_seconds", "h", ["api"], registry=r,
                        buckets=LATENCY_BUCKETS)
    for key, req, resp, seconds in observed:
        name = api_name(key) if key in API_KEYS else "unknown"
        families[0].labels(name).inc()
        families[1].labels(name).inc(req)
        families[2].labels(name).inc(resp)
        latency.labels(name).observe(seconds)
    return r


def _render(figures: ApiFigures, openmetrics: bool) -> str:
    exposition = Exposition(CollectorRegistry(), [figures.pieces])

    async def scrape() -> bytes:
        headers = {"accept": "application/openmetrics-text"} if openmetrics else {}
        parts = (await exposition.response(headers)).parts
        assert parts is not None  # /metrics answers in pieces
        return b"".join(parts)

    return trio.run(scrape).decode()


def test_every_api_in_both_formats_matches_prometheus_client() -> None:
    rng = random.Random(7)
    keys = [*API_KEYS, 30_000, 4_444]  # every known API, and two made-up keys
    bounds = [*LATENCY_BUCKETS, 0.0, 100.0]  # values on a bound fall in that bucket
    observed = [(rng.choice(keys), rng.randrange(10, 10_000), rng.randrange(10, 10_000),
                 rng.choice(bounds) if rng.random() < 0.3 else rng.expovariate(200))
                for _ in range(5_000)]
    figures = ApiFigures()
    for key, req, resp, seconds in observed:
        api = figures.api(key)
        api.request(req)
        api.response(resp, seconds)
    assert len(figures.labels()) > PIECE_APIS * 4  # rendered in many pieces
    for openmetrics in (False, True):
        render = om_generate_latest if openmetrics else generate_latest
        want = _samples(render(_reference(observed)).decode(), openmetrics)
        got = _render(figures, openmetrics)
        assert _samples(got, openmetrics) == want
        assert got.count("# TYPE kproxy_request_latency_seconds histogram") == 1


def test_no_api_seen_still_names_the_families() -> None:
    text = _render(ApiFigures(), False)
    for name in ("kproxy_requests_total", "kproxy_request_bytes_total",
                 "kproxy_response_bytes_total"):
        assert f"# TYPE {name} counter" in text
    assert "# TYPE kproxy_request_latency_seconds histogram" in text
    assert not [ln for ln in text.splitlines() if ln.startswith(("kproxy_req", "kproxy_resp"))]
