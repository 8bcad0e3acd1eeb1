"""The HTTP port's bearer token: who may call /admin/* and, optionally, read status.

Routes named protected answer 401 without ``Authorization: Bearer TOKEN`` matching
the admin token (compared in constant time), which the caller passes as a function
giving the token now (``kproxy.auth.admin_token``: it follows a rotated file). Without
a token configured, /admin/* is open, which start-up allows only on a loopback HTTP
port (``kproxy.config.identity``). Every call to /admin/*, allowed or not, is handed
to ``audit``.

A supervisor calls its workers with a secret of its own (``worker_link``), not with
the admin token, so a rotation that one process sees a moment before another fails
none of their calls; such a call says so in a header and is not audited twice. The
header alone proves nothing: with the admin token instead of the secret, a call is
audited like any other.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from kproxy.http.server import Handler, HttpRequest, HttpResponse

STATUS_PATHS = frozenset({"/", "/status.json", "/internal/facts", "/internal/sample"})
FORWARDED = "x-kproxy-forwarded"  # set by a supervisor passing a call on to a worker

Audit = Callable[[dict[str, object]], None]
Token = Callable[[], str | None]  # the admin token now; None: none configured


def bearer_ok(req: HttpRequest, token: str) -> bool:
    given = req.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        value.strip().encode(), token.encode())


def guard(routes: dict[str, Handler], token: Token, status_auth: bool,
          audit: Audit | None, forwarded_by: str | None = None) -> dict[str, Handler]:
    """``routes`` with /admin/* (and the status routes, with ``status_auth``) behind
    the token; /metrics, /healthz and /readyz are left as they are. ``forwarded_by``:
    a worker's supervisor's secret, which these routes accept too."""
    out = dict(routes)
    for path, handler in routes.items():
        admin = path.startswith("/admin/")
        if admin or (status_auth and path in STATUS_PATHS):
            out[path] = _guarded(path, handler, token, admin, audit, forwarded_by)
    return out


def _guarded(path: str, handler: Handler, token: Token, admin: bool,
             audit: Audit | None, forwarded_by: str | None) -> Handler:
    async def guarded(req: HttpRequest) -> HttpResponse:
        forwarded = (forwarded_by is not None and req.headers.get(FORWARDED) == "1"
                     and bearer_ok(req, forwarded_by))
        current = token()
        ok = forwarded or current is None or bearer_ok(req, current)
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
