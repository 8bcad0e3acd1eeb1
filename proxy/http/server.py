"""A small HTTP/1.1 server on h11 for the status page, /healthz, /readyz and /metrics."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import h11
import trio

log = logging.getLogger("kproxy.http")
MAX_REQUEST_BYTES = 64 * 1024
MAX_HEADER_BYTES = 16 * 1024
READ_TIMEOUT = 10.0
# Connections served at once; more are closed at once. Scrapers and probes keep one or
# two each, and the open-file budget (kproxy.runtime.admission) reserves this many.
MAX_CONNECTIONS = 32


@dataclass
class HttpResponse:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)
    # A large body in pieces, sent one after another instead of joined (a /metrics
    # of tens of MB is never copied into one string on the event loop).
    parts: list[bytes] | None = None


@dataclass
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    peer: str = ""  # the caller's address:port, for the audit log


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


class HttpServer:
    def __init__(self, routes: dict[str, Handler]) -> None:
        self.routes = routes
        self.active = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        if self.active >= MAX_CONNECTIONS:
            await trio.aclose_forcefully(stream)
            return
        self.active += 1
        try:
            await self._handle(stream)
        finally:
            self.active -= 1

    async def _handle(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
        try:
            with trio.fail_after(READ_TIMEOUT):
                request, body = await self._read_request(conn, stream)
            path = request.target.decode("ascii", "replace").split("?", 1)[0]
            method = request.method.decode("ascii", "replace")
            headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                       for k, v in request.headers}
            handler = self.routes.get(path)
            if handler is None:
                resp = HttpResponse(404, b"not found\n")
            else:
                resp = await handler(HttpRequest(method, path, headers, body, _peer(stream)))
            await self._send(conn, stream, resp, head=method == "HEAD")
        except (h11.RemoteProtocolError, trio.TooSlowError) as exc:
            log.debug("bad HTTP request: %r", exc)
            status = 408 if isinstance(exc, trio.TooSlowError) else (
                exc.error_status_hint if isinstance(exc, h11.RemoteProtocolError) else 400)
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                with trio.move_on_after(2):
                    await self._send(conn, stream, HttpResponse(status, b"bad request\n"))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    async def _read_request(self, conn: h11.Connection,
                            stream: trio.SocketStream) -> tuple[h11.Request, bytes]:
        request: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(16384)
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                size = len(event.target) + sum(len(k) + len(v) for k, v in event.headers)
                if size > MAX_HEADER_BYTES:
                    raise h11.RemoteProtocolError("request headers too large",
                                                  error_status_hint=431)
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_REQUEST_BYTES:
                    raise h11.RemoteProtocolError("request body too large")
            elif isinstance(event, h11.EndOfMessage) and request is not None:
                return request, bytes(body)
            elif isinstance(event, h11.ConnectionClosed):
                raise trio.BrokenResourceError("client went away")

    async def _send(self, conn: h11.Connection, stream: trio.SocketStream, resp: HttpResponse,
                    head: bool = False) -> None:
        parts = resp.parts if resp.parts is not None else [resp.body]
        headers = [("content-type", resp.content_type),
                   ("content-length", str(sum(len(p) for p in parts))),
                   ("connection", "close"), *resp.headers]
        data = conn.send(h11.Response(status_code=resp.status, headers=headers)) or b""
        if head:
            parts = []
        elif len(parts) == 1 and len(parts[0]) < 65536:  # small: one write
            data += conn.send(h11.Data(data=parts[0])) or b""
            parts = []
        await stream.send_all(data)
        for part in parts:
            for chunk in conn.send_with_data_passthrough(h11.Data(data=part)) or []:
                await stream.send_all(chunk)
        await stream.send_all(conn.send(h11.EndOfMessage()) or b"")


def _peer(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
    except (OSError, ValueError, TypeError):
        return ""
    return f"{host}:{port}"
