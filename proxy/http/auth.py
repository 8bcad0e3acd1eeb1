"""The HTTP port's bearer token: who may call /admin/* and, optionally, read status.

Routes named protected answer 401 without ``Authorization: Bearer TOKEN`` matching
the token read from ``admin_token_file`` (compared in constant time). Without a token
configured, /admin/* is open, which start-up allows only on a loopback HTTP port
(``kproxy.config.identity``). Every call to /admin/*, allowed or not, is handed to
``audit``; a supervisor's call to its workers says so in a header and is not audited
twice.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from kproxy.http.server import Handler, HttpRequest, HttpResponse

STATUS_PATHS = frozenset({"/", "/status.json", "/internal/facts", "/internal/sample"})
FORWARDED = "x-kproxy-forwarded"  # set by a supervisor passing an admin call on


def bearer_ok(req: HttpRequest, token: str) -> bool:
    given = req.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        value.strip().encode(), token.encode())


def guard(routes: dict[str, Handler], token: str | None, status_auth: bool,
          audit: Callable[[dict[str, object]], None] | None) -> dict[str, Handler]:
    """``routes`` with /admin/* (and the status routes, with ``status_auth``) behind
    the token; /metrics, /healthz and /readyz are left as they are."""
    out = dict(routes)
    for path, handler in routes.items():
        admin = path.startswith("/admin/")
        if admin or (status_auth and path in STATUS_PATHS):
            out[path] = _guarded(path, handler, token, admin, audit)
    return out


def _guarded(path: str, handler: Handler, token: str | None, admin: bool,
             audit: Callable[[dict[str, object]], None] | None) -> Handler:
    async def guarded(req: HttpRequest) -> HttpResponse:
        ok = token is None or bearer_ok(req, token)
        forwarded = ok and token is not None and req.headers.get(FORWARDED) == "1"
        if not ok:
            resp = HttpResponse(401, b"a bearer token is required (Authorization: Bearer "
                                b"...)\n", headers=[("www-authenticate", 'Bearer realm="kproxy"')])
        else:
            resp = await handler(req)
        if admin and audit is not None and not forwarded:
            audit({"event": "admin", "path": path, "method": req.method,
                   "outcome": "ok" if ok and resp.status < 400 else "denied" if not ok
                   else "failed", "status": resp.status,
                   "source": req.peer})
        return resp
    return guarded
