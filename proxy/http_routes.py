"""The HTTP endpoint's routes: health, readiness, metrics and operator actions."""

from __future__ import annotations

import gzip
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.openmetrics import exposition as openmetrics

from kproxy import status
from kproxy.http_server import Handler, HttpRequest, HttpResponse

if TYPE_CHECKING:
    from kproxy.server import Proxy


def routes(proxy: Proxy) -> dict[str, Handler]:
    async def healthz(req: HttpRequest) -> HttpResponse:
        return HttpResponse(200, b"ok\n")

    async def readyz(req: HttpRequest) -> HttpResponse:
        ok, why = proxy.ready()
        return HttpResponse(200 if ok else 503, f"{'ready' if ok else 'not ready'}: "
                            f"{why}\n".encode())

    async def metrics(req: HttpRequest) -> HttpResponse:
        return metrics_response(proxy.metrics.registry, req.headers)

    async def rebootstrap(req: HttpRequest) -> HttpResponse:
        if not proxy.config.admin:
            return HttpResponse(403, b"admin actions are disabled (start with --admin on)\n")
        if req.method != "POST":
            return HttpResponse(405, b"use POST\n", headers=[("allow", "POST")])
        change = await proxy.backend.force("operator")
        return HttpResponse(200, f"topology epoch is now {change.epoch}; clients will be "
                            f"told to bootstrap again\n".encode())

    return {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics,
            "/admin/rebootstrap": rebootstrap, **status.routes(proxy)}


def metrics_response(registry: CollectorRegistry, headers: dict[str, str]) -> HttpResponse:
    """Prometheus text, or OpenMetrics when asked for; gzip when accepted."""
    if "application/openmetrics-text" in headers.get("accept", ""):
        body = openmetrics.generate_latest(registry)  # type: ignore[no-untyped-call]
        ctype = openmetrics.CONTENT_TYPE_LATEST
    else:
        body, ctype = generate_latest(registry), CONTENT_TYPE_LATEST
    extra = []
    if "gzip" in headers.get("accept-encoding", ""):
        body = gzip.compress(body, compresslevel=5)
        extra.append(("content-encoding", "gzip"))
    return HttpResponse(200, body, ctype, extra)
