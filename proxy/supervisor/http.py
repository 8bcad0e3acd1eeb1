"""The supervisor's status page and /metrics: the whole proxy, answered as one process.

The supervisor holds no connection, so both are made from what the workers answer on
their loopback HTTP ports. ``/`` and ``/status.json``: every worker's status
snapshot merged by ``kproxy.http.status_merge``, rendered by the one process's page.
``/metrics``: every worker's exposition merged by ``kproxy.metrics.merge``, in the
format the scraper asked for (OpenMetrics when its Accept header names it, each
worker asked in that same format so the families read alike; gzip when accepted),
with the supervisor's own families rendered by prometheus_client in that format, so
every family has its HELP and TYPE.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.openmetrics import exposition as openmetrics

from kproxy.http.auth import FORWARDED
from kproxy.http.history import STEP, Sample
from kproxy.http.server import Handler, HttpRequest, HttpResponse
from kproxy.http.status_merge import WorkerInfo, merge
from kproxy.http.status_page import render
from kproxy.metrics import group_status
from kproxy.metrics.exposition import GZIP_LEVEL, _collector_paused

if TYPE_CHECKING:
    from kproxy.supervisor.workers import Supervisor

log = logging.getLogger("kproxy.status")
OPENMETRICS = "application/openmetrics-text"
ASK_TIMEOUT = 10.0
_EOF = "# EOF\n"


async def ask_all(sup: Supervisor, path: str, headers: dict[str, str] | None = None,
                  method: str = "GET") -> list[tuple[int, bytes]]:
    """Every worker's answer to ``method path``, in worker order; (0, b"") when none. A
    worker not running is not asked: its listener stays open for its restart, and a
    connection to it would wait out the timeout (one starting is asked, and answers
    once it accepts)."""
    answers: list[tuple[int, bytes]] = [(0, b"")] * len(sup.workers)
    # The workers guard what the supervisor guards; its calls carry its own secret.
    headers = {**(headers or {}), "authorization": f"Bearer {sup.secret}", FORWARDED: "1"}

    def fetch(port: int) -> tuple[int, bytes]:
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers,
                                     method=method, data=b"" if method == "POST" else None)
        try:
            with urllib.request.urlopen(req, timeout=ASK_TIMEOUT) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except OSError:
            return 0, b""

    async def one(i: int, port: int) -> None:
        answers[i] = await trio.to_thread.run_sync(fetch, port, limiter=sup._limiter)

    async with trio.open_nursery() as nursery:
        for i, worker in enumerate(sup.workers):
            if worker.running:
                nursery.start_soon(one, i, worker.http_port)
    return answers


def worker_infos(sup: Supervisor) -> list[WorkerInfo]:
    """What the supervisor knows of each worker process (its own view, not HTTP)."""
    out = []
    for w in sup.workers:
        proc = w.process
        alive = w.running
        out.append(WorkerInfo(w.index, w.http_port, proc.pid if proc is not None else None, alive,
                              w.restarts))
    return out


def global_limit_rows(sup: Supervisor) -> list[dict[str, Any]]:
    """The limits the supervisor itself keeps for the whole proxy (the connection
    counts); the others are derived from the workers' snapshots."""
    return sup.limit_rows()


async def snapshot(sup: Supervisor) -> dict[str, Any]:
    answers = await ask_all(sup, "/status.json")
    snaps: list[dict[str, Any] | None] = []
    for status, body in answers:
        try:
            snaps.append(json.loads(body) if status == 200 else None)
        except ValueError:
            snaps.append(None)
    now = time.time()
    # The groups as the last history step (or scrape) merged them: at most STEP old.
    groups = group_status.rows(sup.merger.last_groups, time.monotonic(), now)
    history = sup.history.as_json([g["group_id"] for g in groups["listed"]])
    return merge(snaps, worker_infos(sup), now, global_limit_rows(sup), groups, history)


async def history_step(sup: Supervisor) -> None:
    """One step of the whole proxy's history: every worker's counters and group facts
    (``/internal/sample``), the groups merged as ``/metrics`` merges them."""
    samples: list[Sample | None] = []
    facts: list[dict[str, Any]] = []
    for status, body in await ask_all(sup, "/internal/sample"):
        found = _json(body) if status == 200 else None
        samples.append(None if found is None else Sample.from_json(found.get("sample", {})))
        if found is not None and isinstance(found.get("groups"), dict):
            facts.append(found["groups"])
    mono = time.monotonic()
    groups = await trio.to_thread.run_sync(sup.merger.merge_groups, facts, mono) \
        if facts else []
    sup.history.record(time.time(), samples, group_status.history_figures(groups))


async def record_history(sup: Supervisor) -> None:
    """A history step every ``STEP`` seconds while the supervisor runs."""
    while True:
        try:
            await history_step(sup)
        except Exception:  # a chart is never worth the supervisor
            log.exception("status history step failed")
        await trio.sleep(STEP)


def status_routes(sup: Supervisor) -> dict[str, Handler]:
    """``/`` and ``/status.json`` for the whole proxy."""
    cache: list[tuple[float, dict[str, Any]]] = []

    async def recent() -> dict[str, Any]:
        now = time.monotonic()
        if not cache or now - cache[0][0] >= 1.0:  # as a worker's: at most one a second
            cache[:] = [(now, await snapshot(sup))]
        return cache[0][1]

    async def page(req: HttpRequest) -> HttpResponse:
        if req.method not in ("GET", "HEAD"):
            return HttpResponse(405, b"use GET\n", headers=[("allow", "GET, HEAD")])
        return HttpResponse(200, render(await recent()).encode(),
                            "text/html; charset=utf-8", [("cache-control", "no-store")])

    async def as_json(req: HttpRequest) -> HttpResponse:
        if req.method not in ("GET", "HEAD"):
            return HttpResponse(405, b"use GET\n", headers=[("allow", "GET, HEAD")])
        body = json.dumps(await recent(), indent=1, sort_keys=True).encode() + b"\n"
        return HttpResponse(200, body, "application/json", [("cache-control", "no-store")])

    return {"/": page, "/status.json": as_json}


class _OwnFamilies:
    """The supervisor's own families, read at each scrape."""

    def __init__(self, sup: Supervisor, scraped: int) -> None:
        self.sup, self.scraped = sup, scraped

    def collect(self) -> Iterator[Metric]:
        sup = self.sup
        yield GaugeMetricFamily("kproxy_workers", "Worker processes configured",
                                value=len(sup.workers))
        yield GaugeMetricFamily("kproxy_workers_alive", "Worker processes running now",
                                value=len(sup._live()))
        yield GaugeMetricFamily("kproxy_workers_scraped",
                                "Workers whose /metrics are in this scrape",
                                value=self.scraped)
        yield CounterMetricFamily("kproxy_worker_restarts",
                                  "Workers restarted after they exited",
                                  value=sum(w.restarts for w in sup.workers))
        yield from sup.hub.families()


def own_metrics(sup: Supervisor, scraped: int, open_metrics: bool) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_OwnFamilies(sup, scraped))
    if open_metrics:
        render = cast(Callable[[CollectorRegistry], bytes], openmetrics.generate_latest)
        return render(registry).decode().removesuffix(_EOF)
    return generate_latest(registry).decode()


def _json(body: bytes) -> dict[str, Any] | None:
    try:
        found = json.loads(body)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _gzip(data: bytes) -> bytes:
    packer = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
    return packer.compress(data) + packer.flush()


async def metrics(sup: Supervisor, req: HttpRequest) -> HttpResponse:
    """/metrics: every worker's exposition and the supervisor's, as one process's."""
    open_metrics = OPENMETRICS in req.headers.get("accept", "")
    asked = {"accept": f"{OPENMETRICS}; version=1.0.0"} if open_metrics else {}
    answers: list[tuple[int, bytes]] = []
    facts_answers: list[tuple[int, bytes]] = []

    async def gather(into: list[tuple[int, bytes]], path: str,
                     headers: dict[str, str] | None = None) -> None:
        into.extend(await ask_all(sup, path, headers))

    async with trio.open_nursery() as nursery:  # the workers render both at once
        nursery.start_soon(gather, answers, "/metrics", asked)
        nursery.start_soon(gather, facts_answers, "/internal/facts")
    facts = [_json(body) if status == 200 else None for status, body in facts_answers]
    texts = [body.decode("utf-8", "replace").removesuffix(_EOF) if status == 200 else None
             for status, body in answers]
    own = own_metrics(sup, sum(t is not None for t in texts), open_metrics)
    epochs = [w.restarts for w in sup.workers]

    def produce() -> bytes:
        # No cyclic collection while the merge builds a dict entry per series: at
        # 250,000 series the young-generation passes over those containers took
        # about a third of the merge's time. Nothing else runs here to need them.
        with _collector_paused():
            body = sup.merger.merge(texts, facts, epochs, own, time.monotonic())
            return (body + (_EOF if open_metrics else "")).encode()

    body = await trio.to_thread.run_sync(produce)
    headers = []
    if "gzip" in req.headers.get("accept-encoding", ""):
        body = await trio.to_thread.run_sync(_gzip, body)
        headers.append(("content-encoding", "gzip"))
    ctype = openmetrics.CONTENT_TYPE_LATEST if open_metrics else CONTENT_TYPE_LATEST
    return HttpResponse(200, body, ctype, headers)
