"""A small HTTP/1.1 client on trio and h11, for one endpoint: POSTs (the OTLP exporter)
and GETs (a JWKS for OAUTHBEARER).

One connection, kept alive between requests and opened again when the server closed
it or a request failed. TLS through the standard ``ssl`` module. Every request is
bounded in time (connect, send and answer together) and the answer in bytes.
"""

from __future__ import annotations

import ssl
import urllib.parse
from dataclasses import dataclass

import h11
import trio

MAX_RESPONSE_BYTES = 64 * 1024  # an export answer is tiny; anything beyond is discarded
RECV_BYTES = 16 * 1024


class HttpError(Exception):
    """No answer: the connection failed, broke, or the time ran out. The message says which."""


@dataclass(frozen=True)
class Endpoint:
    scheme: str
    host: str
    port: int
    target: str  # path and query

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise ValueError(f"bad port in {url!r} ({exc})") from None
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(parts.scheme, parts.hostname, port, target)

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes  # at most the client's max_response_bytes
    truncated: bool = False  # the server sent more than that; the rest was discarded


class HttpClient:
    def __init__(self, endpoint: Endpoint, tls: ssl.SSLContext | None = None,
                 max_response_bytes: int = MAX_RESPONSE_BYTES) -> None:
        if endpoint.scheme == "https" and tls is None:
            tls = ssl.create_default_context()
        self.endpoint = endpoint
        self.max_response_bytes = max_response_bytes
        self.tls = tls if endpoint.scheme == "https" else None
        self._stream: trio.abc.Stream | None = None
        self._conn: h11.Connection | None = None

    async def post(self, body: bytes, headers: list[tuple[str, str]],
                   timeout: float) -> HttpAnswer:
        """POST ``body``; the answer, or HttpError when none came within ``timeout``."""
        return await self._request("POST", body, headers, timeout)

    async def get(self, headers: list[tuple[str, str]], timeout: float) -> HttpAnswer:
        """GET the endpoint; the answer, or HttpError when none came within ``timeout``."""
        return await self._request("GET", b"", headers, timeout)

    async def _request(self, method: str, body: bytes, headers: list[tuple[str, str]],
                       timeout: float) -> HttpAnswer:
        try:
            with trio.fail_after(timeout):
                return await self._post(method, body, headers)
        except trio.TooSlowError:
            await self.aclose()
            raise HttpError(f"no answer within {timeout:g}s") from None
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError,
                h11.ProtocolError, ssl.SSLError) as exc:
            await self.aclose()
            raise HttpError(_describe(exc)) from None

    async def _post(self, method: str, body: bytes,
                    headers: list[tuple[str, str]]) -> HttpAnswer:
        reused = self._conn is not None and self._conn.our_state is h11.IDLE
        if reused:
            try:
                return await self._exchange(method, body, headers)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                # The server may close an idle kept-alive connection just as it is reused:
                # one more try on a new connection (a POST it never answered).
                await self.aclose()
        else:
            await self.aclose()
        await self._connect()
        return await self._exchange(method, body, headers)

    async def _exchange(self, method: str, body: bytes,
                        headers: list[tuple[str, str]]) -> HttpAnswer:
        assert self._conn is not None and self._stream is not None
        conn, stream = self._conn, self._stream
        all_headers = [("host", self.endpoint.host_header), ("user-agent", "kproxy"), *headers]
        if method == "POST":
            all_headers.insert(1, ("content-length", str(len(body))))
        data = conn.send(h11.Request(method=method, target=self.endpoint.target,
                                     headers=all_headers)) or b""
        if body:
            data += conn.send(h11.Data(data=body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        await stream.send_all(data)
        answer = await self._read_answer(conn, stream)
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()  # keep-alive
        else:
            await self.aclose()
        return answer

    async def _connect(self) -> None:
        ep = self.endpoint
        stream: trio.abc.Stream = await trio.open_tcp_stream(ep.host, ep.port)
        if self.tls is not None:
            tls_stream = trio.SSLStream(stream, self.tls, server_hostname=ep.host,
                                        https_compatible=True)
            try:
                await tls_stream.do_handshake()
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
            stream = tls_stream
        self._stream = stream
        self._conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=64 * 1024)

    async def _read_answer(self, conn: h11.Connection, stream: trio.abc.Stream) -> HttpAnswer:
        response: h11.Response | None = None
        body = bytearray()
        truncated = False
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = bytes(await stream.receive_some(RECV_BYTES))
                if not data and response is None:
                    raise trio.BrokenResourceError("the server closed the connection "
                                                   "without answering")
                conn.receive_data(data)  # b"" after a response: its body ends at close
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                room = self.max_response_bytes - len(body)
                truncated = truncated or len(event.data) > room
                if room > 0:
                    body += event.data[:room]
            elif isinstance(event, h11.EndOfMessage) and response is not None:
                headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                           for k, v in response.headers}
                return HttpAnswer(response.status_code, headers, bytes(body), truncated)
            elif isinstance(event, h11.ConnectionClosed):
                raise trio.BrokenResourceError("the server closed the connection")
            # h11.InformationalResponse (100 Continue): wait for the real one

    async def aclose(self) -> None:
        stream, self._stream, self._conn = self._stream, None, None
        if stream is not None:
            await trio.aclose_forcefully(stream)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
