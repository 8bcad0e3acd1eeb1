"""The exporter's trio+h11 HTTP client against small loopback servers written here
(raw sockets, so each can misbehave exactly one way)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio

from kproxy.http.client import MAX_RESPONSE_BYTES, Endpoint, HttpClient, HttpError

Serve = Callable[[trio.SocketStream, int], Awaitable[None]]


async def read_request(stream: trio.SocketStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += await stream.receive_some(65536)
    return head + b"\r\n\r\n" + body


async def start(nursery: trio.Nursery, serve: Serve) -> int:
    """Serve each connection with ``serve(stream, connection_number)``; returns the port."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    count = 0

    async def handler(stream: trio.SocketStream) -> None:
        nonlocal count
        count += 1
        async with stream:
            await serve(stream, count)

    nursery.start_soon(trio.serve_listeners, handler, listeners)
    return int(listeners[0].socket.getsockname()[1])


def ok(body: bytes = b"", extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-length: " + str(len(body)).encode() + b"\r\n"
            + extra + b"\r\n" + body)


async def test_keep_alive_and_a_server_that_closed_the_idle_connection(
        nursery: trio.Nursery) -> None:
    seen: list[tuple[int, bytes]] = []

    async def serve(stream: trio.SocketStream, n: int) -> None:
        # Connection 1 answers twice, then closes while idle; connection 2 answers on.
        for _ in range(2 if n == 1 else 10):
            req = await read_request(stream)
            if not req:
                return
            seen.append((n, req))
            await stream.send_all(ok(b"fine"))

    port = await start(nursery, serve)
    client = HttpClient(Endpoint.parse(f"http://127.0.0.1:{port}/v1/metrics"))
    for i in range(4):
        answer = await client.post(f"body-{i}".encode(), [("x-test", "1")], 10)
        assert (answer.status, answer.body) == (200, b"fine")
    await client.aclose()
    assert [n for n, _ in seen] == [1, 1, 2, 2]  # reused, then a new connection once
    head = seen[0][1].split(b"\r\n\r\n")[0].lower()
    assert b"post /v1/metrics http/1.1" in head and b"x-test: 1" in head
    assert seen[2][1].endswith(b"body-2")  # the request the closed connection lost


async def test_large_answer_is_cut_and_connection_close_is_honoured(
        nursery: trio.Nursery) -> None:
    connections: list[int] = []

    async def serve(stream: trio.SocketStream, n: int) -> None:
        connections.append(n)
        await read_request(stream)
        await stream.send_all(ok(b"x" * (MAX_RESPONSE_BYTES * 2), b"connection: close\r\n"))

    port = await start(nursery, serve)
    client = HttpClient(Endpoint.parse(f"http://127.0.0.1:{port}/"))
    for _ in range(2):
        answer = await client.post(b"b", [], 10)
        assert answer.status == 200 and len(answer.body) == MAX_RESPONSE_BYTES
    assert connections == [1, 2]


async def test_no_answer_refused_and_bad_answer_are_http_errors(nursery: trio.Nursery) -> None:
    async def silent(stream: trio.SocketStream, n: int) -> None:
        await read_request(stream)
        await trio.sleep_forever()

    async def garbage(stream: trio.SocketStream, n: int) -> None:
        await read_request(stream)
        await stream.send_all(b"NOT HTTP AT ALL\r\n\r\n")

    silent_port = await start(nursery, silent)
    with pytest.raises(HttpError, match=r"no answer within 0\.5s"):
        await HttpClient(Endpoint.parse(f"http://127.0.0.1:{silent_port}/")).post(b"", [], 0.5)
    garbage_port = await start(nursery, garbage)
    with pytest.raises(HttpError):
        await HttpClient(Endpoint.parse(f"http://127.0.0.1:{garbage_port}/")).post(b"", [], 5)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    closed_port = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()  # nothing listens there now
    with pytest.raises(HttpError):
        await HttpClient(Endpoint.parse(f"http://127.0.0.1:{closed_port}/")).post(b"", [], 5)


def test_endpoint_parsing() -> None:
    ep = Endpoint.parse("https://collector.example:4318/v1/metrics?x=1")
    assert (ep.scheme, ep.host, ep.port, ep.target) == ("https", "collector.example", 4318,
                                                        "/v1/metrics?x=1")
    assert ep.host_header == "collector.example:4318"
    assert Endpoint.parse("http://h").port == 80 and Endpoint.parse("http://h").target == "/"
    assert Endpoint.parse("https://[::1]/").host_header == "[::1]"
    for bad in ("ftp://h/", "http:///x", "http://h:99999/"):
        with pytest.raises(ValueError):
            Endpoint.parse(bad)
