"""A hostile telemetry client, run as its own process: tiny pushes that expand hugely.

``python -m tests.hostile_pusher PORT [CONNECTIONS [INTERVAL_MS]]`` opens CONNECTIONS
connections to the proxy and on each repeats, as fast as the proxy answers (or, with
INTERVAL_MS, at most once every INTERVAL_MS milliseconds): a
GetTelemetrySubscriptions with a zero instance id (a fresh instance, so no push is
throttled), then a PushTelemetry whose few kilobytes of zstd expand to just under
the proxy's decompression bound of empty data points. It prints ``pushing`` once
the first push has been answered, and when its stdin closes prints
``answered <n> errors <code>=<count>,...`` and exits.

A separate process, so that its work never competes for the measuring process's
interpreter lock.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

from kproxy.codecs import compression
from kproxy.codecs.framing import FrameReader
from kproxy.codecs.messages import decode_response

from .support import encode_request, push_body

# One ResourceMetrics > ScopeMetrics > Metric > Gauge holding empty data points
# (field 1, length 0: two bytes each), about 15 MiB in all.
_POINTS = 7_800_000


def bomb(points: int = _POINTS) -> bytes:
    """MetricsData with ``points`` empty gauge points, zstd-compressed."""
    def field(number: int, body: bytes) -> bytes:
        return varint(number << 3 | 2) + varint(len(body)) + body

    gauge = b"\x0a\x00" * points
    metric = field(1, b"bomb") + field(5, gauge)
    data = field(1, field(2, field(2, metric)))
    return compression.compress(4, data)


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append(n & 0x7F | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


class Conn:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.reader = FrameReader()
        self.cid = 0

    def request(self, api_key: int, body: dict[str, object]) -> dict[str, object]:
        self.cid += 1
        self.sock.sendall(encode_request(api_key, 0, self.cid, body, client_id="hostile"))
        while (frame := self.reader.next_frame()) is None:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("proxy closed the connection")
            self.reader.feed(data)
        return decode_response(frame, api_key, 0).body


def main() -> None:
    port = int(sys.argv[1])
    conns = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    interval = int(sys.argv[3]) / 1000 if len(sys.argv) > 3 else 0.0
    payload = bomb()
    stop = threading.Event()
    lock = threading.Lock()
    errors: Counter[int] = Counter()
    first = threading.Event()

    def run() -> None:
        c = Conn(port)
        due = time.monotonic()
        while not stop.wait(max(0.0, due - time.monotonic())):
            due = max(due, time.monotonic()) + interval  # never a burst to catch up
            got = c.request(71, {"client_instance_id": uuid.UUID(int=0)})
            if got["error_code"]:
                with lock:
                    errors[-int(str(got["error_code"]))] += 1
                continue
            answer = c.request(72, push_body(got, payload, 4))
            with lock:
                errors[int(str(answer["error_code"]))] += 1
            first.set()

    threads = [threading.Thread(target=run, daemon=True) for _ in range(conns)]
    for t in threads:
        t.start()
    first.wait(60)
    print(f"pushing {len(payload)}", flush=True)
    sys.stdin.read()  # until the test closes our stdin
    stop.set()
    for t in threads:
        t.join(60)
    total = sum(errors.values())
    summary = ",".join(f"{code}={n}" for code, n in sorted(errors.items()))
    print(f"answered {total} errors {summary}", flush=True)


def start(port: int, connections: int = 2, interval_ms: int = 0) -> subprocess.Popen[str]:
    """The pusher as a process of its own, once its first push has been answered."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.hostile_pusher", str(port),
                             str(connections), str(interval_ms)],
                            cwd=Path(__file__).resolve().parents[1], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "pushing" once a push has been answered
    if not line.startswith("pushing"):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the hostile pusher did not start: {line!r}")
    return proc


def stop(proc: subprocess.Popen[str]) -> dict[int, int]:
    """Stop a pusher from ``start``: how many of its requests got each error code."""
    out, _ = proc.communicate("", timeout=60)
    words = out.split()
    if not words or words[0] != "answered":
        raise RuntimeError(f"the hostile pusher ended without its summary: {out!r}")
    return {int(k): int(v) for k, v in (kv.split("=") for kv in words[3].split(",") if kv)}


if __name__ == "__main__":
    main()
