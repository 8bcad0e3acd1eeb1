"""One benchmark workload, run in its own process so it never shares a core's
accounting with the proxy under test. Prints one JSON object.

    python tests/bench/workloads.py WORKLOAD BOOTSTRAP [options]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import sys
import time
from pathlib import Path

# tests.paced_produce, when run as a script from tests/bench/
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def tls_config() -> dict[str, str]:
    """TLS to the bootstrap server when the driver names a CA (the TLS rows)."""
    ca = os.environ.get("BENCH_TLS_CA")
    return {"security.protocol": "ssl", "ssl.ca.location": ca} if ca else {}


def wait_until(start_at: float) -> None:
    """Clients run side by side start timing together: each sets itself up (imports,
    connections, the first round trip), then waits for the agreed wall-clock time."""
    if (wait := start_at - time.time()) > 0:
        time.sleep(wait)


def produce(bootstrap: str, topic: str, count: int, size: int,
            start_at: float = 0.0) -> dict[str, float]:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": 1,
                  "queue.buffering.max.messages": 2_000_000,
                  "queue.buffering.max.kbytes": 2_000_000, "enable.metrics.push": True,
                  **tls_config()})
    value = b"x" * size
    p.produce(topic, value)
    assert p.flush(30) == 0
    failures = 0

    def report(err: object, _msg: object) -> None:
        nonlocal failures
        failures += err is not None

    wait_until(start_at)
    t0 = time.perf_counter()
    for i in range(count):
        while True:
            try:
                p.produce(topic, value, on_delivery=report)
                break
            except BufferError:
                p.poll(0.001)
        if i % 5000 == 0:
            p.poll(0)
    assert p.flush(120) == 0
    dt, end = time.perf_counter() - t0, time.time()
    return {"mb_s": count * size / dt / 1e6, "msgs_s": count / dt, "failures": failures,
            "seconds": dt, "bytes": count * size, "end": end}


def consume(bootstrap: str, topic: str, expect: int, start_at: float = 0.0
            ) -> dict[str, float]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                  "enable.partition.eof": True, "enable.auto.commit": False,
                  "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 10485760,
                  **tls_config()})
    wait_until(start_at)  # before assign: librdkafka starts fetching on assign
    c.assign([TopicPartition(topic, 0, 0)])
    got = nbytes = 0
    t0 = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        msgs = c.consume(10000, timeout=1.0)
        for m in msgs:
            if m.error():
                deadline = 0  # partition EOF: read to the end
                continue
            if t0 is None:
                t0 = time.perf_counter()
            got += 1
            nbytes += len(m.value() or b"")
    dt = time.perf_counter() - t0 if t0 is not None else 0.0  # nothing read: no time
    end = time.time()
    c.close()
    return {"mb_s": nbytes / dt / 1e6 if dt else 0.0, "messages": got,
            "complete": got >= expect, "seconds": dt, "bytes": nbytes, "end": end}


def percentiles(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(p * len(s)))] * 1000

    return {"p50_ms": q(0.50), "p99_ms": q(0.99), "p999_ms": q(0.999), "n": len(s)}


def produce_latency(bootstrap: str, topic: str, rate: int, seconds: float) -> dict[str, float]:
    """acks=1 single-message produce at a fixed rate: time to the delivery report."""
    from confluent_kafka import Producer

    from tests.paced_produce import paced_produce

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": 1})
    p.produce(topic, b"warm")
    p.flush(30)
    total = int(rate * seconds)
    delivered, failed = paced_produce(p, topic, rate, lambda i: i < total)
    return {**percentiles([latency for _, latency in delivered]), "failed": failed}


def metadata_latency(bootstrap: str, rate: int, seconds: float) -> dict[str, float]:
    """Metadata v4 round trips on one connection at a fixed rate."""
    host, port = bootstrap.rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def request(cid: int) -> None:
        body = struct.pack(">hhih", 3, 4, cid, 5) + b"bench" + struct.pack(">i", 0) + b"\x00"
        s.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", read_exactly(s, 4))[0]
        read_exactly(s, size)

    request(0)
    samples = []
    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        due = start + i / rate
        if (wait := due - time.perf_counter()) > 0:
            time.sleep(wait)  # sleep, not spin: the client must not take a core from the path
        t = time.perf_counter()
        request(i + 1)
        samples.append(time.perf_counter() - t)
    s.close()
    return percentiles(samples)


def read_exactly(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return bytes(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workload")
    parser.add_argument("bootstrap")
    parser.add_argument("--topic", default="bench")
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--start-at", type=float, default=0.0,
                        help="produce/consume: start timing at this time.time()")
    a = parser.parse_args()
    if a.workload == "produce":
        out = produce(a.bootstrap, a.topic, a.count, a.size, a.start_at)
    elif a.workload == "consume":
        out = consume(a.bootstrap, a.topic, a.count, a.start_at)
    elif a.workload == "produce_latency":
        out = produce_latency(a.bootstrap, a.topic, a.rate, a.seconds)
    else:
        out = metadata_latency(a.bootstrap, a.rate, a.seconds)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
