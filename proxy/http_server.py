"""A small HTTP/1.1 server on h11 for /healthz, /readyz and /metrics."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import h11
import trio

log = logging.getLogger("kproxy.http")
MAX_REQUEST_BYTES = 64 * 1024
READ_TIMEOUT = 10.0


@dataclass
class HttpResponse:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


Handler = Callable[[str, bytes], Awaitable[HttpResponse]]  # (method, body) -> response


class HttpServer:
    def __init__(self, routes: dict[str, Handler]) -> None:
        self.routes = routes

    async def handle(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
        try:
            with trio.fail_after(READ_TIMEOUT):
                request, body = await self._read_request(conn, stream)
            path = request.target.decode("ascii", "replace").split("?", 1)[0]
            method = request.method.decode("ascii", "replace")
            handler = self.routes.get(path)
            if handler is None:
                resp = HttpResponse(404, b"not found\n")
            else:
                resp = await handler(method, body)
            await self._send(conn, stream, resp, head=method == "HEAD")
        except (h11.RemoteProtocolError, trio.TooSlowError) as exc:
            log.debug("bad HTTP request: %r", exc)
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await self._send(conn, stream, HttpResponse(400, b"bad request\n"))
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
        headers = [("content-type", resp.content_type),
                   ("content-length", str(len(resp.body))), ("connection", "close")]
        data = conn.send(h11.Response(status_code=resp.status, headers=headers)) or b""
        if not head:
            data += conn.send(h11.Data(data=resp.body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        await stream.send_all(data)
