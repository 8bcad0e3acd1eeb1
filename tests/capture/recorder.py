"""A recording TCP relay that captures Kafka frames between a real client and broker.

This is the helper behind ``tests/vectors/``: it sits on a loopback port, relays
bytes untouched in both directions, and records each complete frame together with
the api key and version (responses are matched to requests by correlation id).
It is test tooling, not the product, so it uses plain threads and sockets.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from dataclasses import dataclass, field

from kproxy.codecs.framing import FrameReader
from kproxy.codecs.peek import peek_correlation_id, peek_request


@dataclass
class Captured:
    direction: str  # "request" or "response"
    api_key: int
    api_version: int
    frame: bytes  # body without the 4-byte size prefix


@dataclass
class Recorder:
    upstream: tuple[str, int]
    host: str = "127.0.0.1"
    frames: list[Captured] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((self.host, 0))
        self._sock.listen(16)
        self.port: int = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> Recorder:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            inflight: dict[int, tuple[int, int]] = {}
            threading.Thread(target=self._pump, args=(client, server, inflight, True),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, inflight, False),
                             daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, inflight: dict[int, tuple[int, int]],
              is_request: bool) -> None:
        reader = FrameReader()
        try:
            while data := src.recv(65536):
                reader.feed(data)
                for body in reader.frames():
                    self._record(body, inflight, is_request)
                    dst.sendall(struct.pack(">i", len(body)) + body)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def _record(self, body: bytes, inflight: dict[int, tuple[int, int]], is_request: bool) -> None:
        with self._lock:
            if is_request:
                peek = peek_request(body)
                inflight[peek.correlation_id] = (peek.api_key, peek.api_version)
                self.frames.append(Captured("request", peek.api_key, peek.api_version, body))
            else:
                key, version = inflight.pop(peek_correlation_id(body), (-1, -1))
                self.frames.append(Captured("response", key, version, body))
