"""Many client telemetry series in a running kproxy, made the way a fleet makes them.

Real KIP-714 requests over plain sockets: each synthetic client instance gets its
subscription (GetTelemetrySubscriptions) and pushes one OTLP payload shaped like
librdkafka's (a counter, a histogram and a gauge per broker node), so it exports
``per_instance`` series. Shared by the scrape tests and ``make bench``.
"""

from __future__ import annotations

import socket
import struct
import time
import urllib.request
import uuid

from kproxy.codecs.framing import FrameReader
from kproxy.codecs.messages import decode_response

from .otlp_samples import librdkafka_like_payload
from .support import encode_request

BATCH = 200  # requests written at once per connection


def _roundtrips(sock: socket.socket, reader: FrameReader, frames: list[bytes]) -> list[bytes]:
    sock.sendall(b"".join(frames))
    out: list[bytes] = []
    while len(out) < len(frames):
        frame = reader.next_frame()
        if frame is None:
            data = sock.recv(1 << 20)
            if not data:
                raise ConnectionError("kproxy closed the telemetry connection")
            reader.feed(data)
            continue
        out.append(bytes(frame))
    return out


def fill_series(bootstrap: str, instances: int, per_instance: int) -> None:
    """Add ``instances`` client instances of ``per_instance`` series each (>= 3)."""
    host, port = bootstrap.rsplit(":", 1)
    payload = librdkafka_like_payload(points=per_instance - 2)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        reader = FrameReader(64 * 1024 * 1024)
        for start in range(0, instances, BATCH):
            n = min(BATCH, instances - start)
            gets = [encode_request(71, 0, i, {"client_instance_id": uuid.UUID(int=0)})
                    for i in range(n)]
            pushes = []
            for i, frame in enumerate(_roundtrips(sock, reader, gets)):
                got = decode_response(frame, 71, 0).body
                assert got["error_code"] == 0, got
                pushes.append(encode_request(72, 0, i, {
                    "client_instance_id": got["client_instance_id"],
                    "subscription_id": got["subscription_id"], "terminating": False,
                    "compression_type": 0, "metrics": payload}))
            for frame in _roundtrips(sock, reader, pushes):
                error = struct.unpack_from(">h", frame, 4 + 1 + 4)[0]  # corr, tags, throttle
                assert error == 0, f"push refused with error {error}"


def scrape(http_port: int, gzip: bool = True, timeout: float = 300) -> tuple[float, int]:
    """One /metrics scrape as Prometheus makes it: (seconds, bytes received)."""
    req = urllib.request.Request(f"http://127.0.0.1:{http_port}/metrics",
                                 headers={"accept-encoding": "gzip"} if gzip else {})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        n = len(resp.read())
    return time.perf_counter() - t0, n


def metric_value(http_port: int, name: str) -> float:
    """A sample's value by exact name (first match), from an uncompressed scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=300) as resp:
        for line in resp.read().decode().splitlines():
            if line.split("{", 1)[0].split(" ", 1)[0] == name:
                return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)
