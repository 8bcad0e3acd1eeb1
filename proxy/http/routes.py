"""The HTTP endpoint's routes: health, readiness, metrics and operator actions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kproxy.http import status
from kproxy.http.server import Handler, HttpRequest, HttpResponse

if TYPE_CHECKING:
    from kproxy.runtime.server import Proxy


def routes(proxy: Proxy) -> dict[str, Handler]:
    async def healthz(req: HttpRequest) -> HttpResponse:
        return HttpResponse(200, b"ok\n")

    async def readyz(req: HttpRequest) -> HttpResponse:
        ok, why = proxy.ready()
        return HttpResponse(200 if ok else 503, f"{'ready' if ok else 'not ready'}: "
                            f"{why}\n".encode())

    async def metrics(req: HttpRequest) -> HttpResponse:
        return await proxy.exposition.response(req.headers)

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
