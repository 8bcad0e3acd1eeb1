"""A FAKE OpenTelemetry collector: an OTLP/HTTP metrics receiver for the tests.

No collector binary can be installed here, so this stands in for one: it accepts
``POST /v1/metrics`` with a protobuf ``ExportMetricsServiceRequest`` (gzip or not),
decodes it with the ``opentelemetry-proto`` package and keeps it for the test to
inspect. A script of answers makes it misbehave: ``503`` then ``200`` (with
Retry-After), or ``hang`` (read the request, never answer).
"""

from __future__ import annotations

import gzip
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes  # as sent (gzip or not)
    request: metrics_service_pb2.ExportMetricsServiceRequest
    answered: int | str  # status sent, or "hang"


@dataclass
class FakeCollector:
    port: int
    script: list[int | str] = field(default_factory=list)  # answers in turn, then `default`
    default: int | str = 200
    retry_after: str | None = None
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)  # ends every hang

    scheme: str = "http"
    peer_certs: list[dict[str, Any]] = field(default_factory=list)  # with TLS: who posted

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/v1/metrics"

    def next_answer(self) -> int | str:
        with self.lock:
            return self.script.pop(0) if self.script else self.default

    def record(self, item: Received) -> None:
        with self.lock:
            self.received.append(item)

    def snapshot(self) -> list[Received]:
        with self.lock:
            return list(self.received)


def _handler(fake: FakeCollector) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a real collector

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            body = self.rfile.read(length)
            raw = gzip.decompress(body) if self.headers.get(
                "content-encoding") == "gzip" else body
            request = metrics_service_pb2.ExportMetricsServiceRequest()
            request.ParseFromString(raw)
            answer = fake.next_answer()
            if isinstance(self.connection, ssl.SSLSocket):
                fake.peer_certs.append(self.connection.getpeercert() or {})
            fake.record(Received(self.path, {k.lower(): v for k, v in self.headers.items()},
                                 body, request, answer))
            if answer == "hang":
                fake.release.wait(120)
                self.close_connection = True
                return
            assert isinstance(answer, int)
            reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
            self.send_response(answer)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(reply)))
            if answer != 200 and fake.retry_after is not None:
                self.send_header("retry-after", fake.retry_after)
            self.end_headers()
            self.wfile.write(reply)

    return Handler


@contextmanager
def fake_collector(script: list[int | str] | None = None, default: int | str = 200,
                   retry_after: str | None = None,
                   tls: ssl.SSLContext | None = None) -> Iterator[FakeCollector]:
    """``tls``: a server context, for an https:// receiver (it may require a client cert)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    fake = FakeCollector(server.server_address[1], list(script or []), default, retry_after)
    fake.scheme = "https" if tls is not None else "http"
    server.RequestHandlerClass = _handler(fake)
    thread = threading.Thread(target=server.serve_forever, name="fake-otlp", daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.release.set()
        server.shutdown()
        server.server_close()
        thread.join(10)
