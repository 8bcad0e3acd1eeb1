"""Many client telemetry series in a running kproxy, made the way a fleet makes them.

Real KIP-714 requests over plain sockets: each synthetic client instance gets its
subscription (GetTelemetrySubscriptions) and pushes one OTLP payload shaped like
librdkafka's (a counter, a histogram and a gauge per broker node), so it exports
``per_instance`` series. Shared by the scrape tests and ``make bench``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kproxy.codecs.framing import FrameReader
from kproxy.codecs.messages import decode_response

from .otlp_samples import librdkafka_like_payload
from .paced_produce import paced_produce
from .support import encode_request, push_body, push_error

BATCH = 200  # requests written at once per connection

# A filled fleet pushes once. At the default 60 s push interval its instances expire
# 180 s after that push, partway through a long bench section (one run's largest size
# then held 159,770 series where it was filled to 249,770). A proxy measured over
# minutes is started with this: a push interval of an hour, so nothing expires.
KEEP_FILLED_FLEET = ("--telemetry-default-interval-ms", str(3_600_000))


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
                pushes.append(encode_request(72, 0, i, push_body(got, payload)))
            for frame in _roundtrips(sock, reader, pushes):
                error = push_error(frame)
                assert error == 0, f"push refused with error {error}"


def scrape(http_port: int, gzip: bool = True, timeout: float = 300) -> tuple[float, int]:
    """One /metrics scrape as Prometheus makes it: (seconds, bytes received)."""
    seconds, body = scrape_body(http_port, gzip, timeout)
    return seconds, len(body)


def scrape_body(http_port: int, gzip: bool = True, timeout: float = 300
                ) -> tuple[float, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{http_port}/metrics",
                                 headers={"accept-encoding": "gzip"} if gzip else {})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = resp.read()
    return time.perf_counter() - t0, body


def own_gauge(gzip_body: bytes, name: str) -> float:
    """A gauge of the proxy's own from a gzip scrape, without inflating all of it: the
    proxy's own metrics come first, before any client telemetry."""
    head = zlib.decompressobj(31).decompress(gzip_body, 64 << 10).decode(errors="replace")
    for line in head.splitlines():
        if line.split(" ", 1)[0] == name:
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def metric_value(http_port: int, name: str) -> float:
    """A sample's value by exact name (first match), from an uncompressed scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=300) as resp:
        for line in resp.read().decode().splitlines():
            if line.split("{", 1)[0].split(" ", 1)[0] == name:
                return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


# ----------------------------------------------------------------------------- relay cost


def produce_trace(bootstrap: str, topic: str, rate: int) -> None:
    """A producer at a fixed rate (acks=1, one message per request) until its stdin
    closes: prints ``ready``, then at the end one JSON list of [sent, latency]
    (perf_counter: system-wide monotonic, so the driver can place each sample in its
    windows).

    Run in a process of its own (``python -m tests.scrape_load``), so its timing shares
    no interpreter with the scraper or the driver.
    """
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": 1})
    p.produce(topic, b"warm")
    assert p.flush(30) == 0
    stop = threading.Event()

    def stop_at_eof() -> None:  # the driver closes this process's stdin to stop it
        sys.stdin.read()
        stop.set()
    threading.Thread(target=stop_at_eof, daemon=True).start()
    print("ready", flush=True)
    out, failed = paced_produce(p, topic, rate, lambda _: not stop.is_set())
    assert failed == 0, f"{failed} deliveries failed"
    print(json.dumps(out), flush=True)


@dataclass
class RelayCost:
    """Producer latency in alternating windows without and during scrapes."""

    baseline_p99: list[float]  # per round, seconds
    during_p99: list[float]
    slowest: float  # the slowest delivery sent while a scrape was running
    scrapes: list[float]  # each scrape's wall time
    body_bytes: int  # the last scrape's response
    held_cpu: list[float]  # kproxy_scrape_longest_slice_cpu_seconds after each scrape
    cores_apart: bool  # the proxy had a core of its own (``cores_apart``)

    @property
    def ratios(self) -> list[float]:
        return [d / b for b, d in zip(self.baseline_p99, self.during_p99, strict=True)]

    @property
    def ratio(self) -> float:
        """The median of the per-round ratios: each round's two windows share the
        machine's state of the moment, and one disturbed round does not decide."""
        return statistics.median(self.ratios)

    def summary(self) -> str:
        pairs = [(round(b * 1e3, 2), round(d * 1e3, 2))
                 for b, d in zip(self.baseline_p99, self.during_p99, strict=True)]
        return (f"producer p99 without / during scrapes (ms), per round: {pairs}; median ratio "
                f"{self.ratio:.2f}; slowest during a scrape {self.slowest * 1e3:.1f} ms; "
                f"scrapes {[round(s, 2) for s in self.scrapes]} s; longest slice (CPU) "
                f"{max(self.held_cpu, default=0) * 1e3:.2f} ms; proxy on a core of its own: "
                f"{self.cores_apart}")


def _p99(samples: list[float]) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(0.99 * len(s)))]


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (threads it starts later inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):  # a thread ended
            os.sched_setaffinity(int(tid), cpus)


@contextlib.contextmanager
def cores_apart(proxy_pid: int | None, broker_pid: int | None) -> Iterator[bool]:
    """The proxy on one core; the broker, this thread and what it starts (the producer)
    on another; every mask restored afterwards. Yields whether that was possible (both
    pids given, two CPUs usable).

    Why: on two shared cores, any CPU the machine spends moves the p99 (an unrelated
    process busy 5% of the time in 0.5 ms bursts put this producer's p99 at 5 to 6 ms
    where quiet windows read 1.7 to 3.5 ms), so with everything free to share both
    cores the ratio measures the machine's scheduler.
    Apart, a scrape's CPU competes with the relay it shares a thread with, and the
    ratio measures whether requests wait for the scrape.
    """
    usable = sorted(os.sched_getaffinity(0))
    if proxy_pid is None or broker_pid is None or len(usable) < 2:
        yield False
        return
    saved = {pid: os.sched_getaffinity(pid) for pid in (proxy_pid, broker_pid, 0)}
    try:
        _pin(proxy_pid, {usable[0]})
        _pin(broker_pid, {usable[1]})
        os.sched_setaffinity(0, {usable[1]})
        yield True
    finally:
        for pid, cpus in saved.items():
            with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                if pid:
                    _pin(pid, cpus)
                else:
                    os.sched_setaffinity(0, cpus)


def relay_cost(bootstrap: str, http_port: int, topic: str, rounds: int = 5,
               window: float = 3.0, rate: int = 1000, proxy_pid: int | None = None,
               broker_pid: int | None = None) -> RelayCost:
    """Producer p99 in ``rounds`` pairs of windows: ``window`` s without scrapes, then
    scrapes back to back (gzip) for at least ``window`` s, each round's pair compared,
    after one pair more as a warm-up.

    One producer runs throughout, so both windows share its connections and the
    machine's load of the moment; a delivery counts as during a scrape if it was sent
    while one was being produced, as baseline if sent in a quiet window. Given both
    pids, the proxy runs on a core of its own meanwhile (``cores_apart``).
    """
    with cores_apart(proxy_pid, broker_pid) as apart:
        cost = _relay_cost(bootstrap, http_port, topic, rounds, window, rate)
    cost.cores_apart = apart
    return cost


def _relay_cost(bootstrap: str, http_port: int, topic: str, rounds: int, window: float,
                rate: int) -> RelayCost:
    proc = subprocess.Popen([sys.executable, "-m", "tests.scrape_load", bootstrap, topic,
                             str(rate)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=Path(__file__).resolve().parents[1])
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # past the producer's first requests
        quiet: list[tuple[float, float]] = []
        busy: list[list[tuple[float, float]]] = []
        body = b""
        held: list[float] = []  # each value is of the scrape before: the first is 0 or so
        for _ in range(rounds + 1):  # the first pair is a warm-up, not compared
            t0 = time.perf_counter()
            time.sleep(window)
            quiet.append((t0, time.perf_counter()))
            busy.append([])
            until = time.perf_counter() + window
            while time.perf_counter() < until:
                s0 = time.perf_counter()
                body = scrape_body(http_port)[1]
                busy[-1].append((s0, time.perf_counter()))
                held.append(own_gauge(body, "kproxy_scrape_longest_slice_cpu_seconds"))
        proc.stdin.close()  # the producer stops, flushes and prints its samples
        samples = [tuple(x) for x in json.loads(proc.stdout.read())]
    finally:
        proc.kill()
        proc.wait()
    base: list[float] = []
    during: list[float] = []
    slowest = 0.0
    for (q0, q1), intervals in zip(quiet, busy, strict=True):
        base.append(_p99([lat for at, lat in samples if q0 <= at < q1]))
        lats = [lat for at, lat in samples if any(s0 <= at < s1 for s0, s1 in intervals)]
        during.append(_p99(lats))
        slowest = max(slowest, max(lats))
    # The warm-up pair leaves the ratios (its quiet window took the proxy's first full
    # garbage collection after the fill: 135 ms at 250,000 series, a p99 of its own),
    # not the slowest delivery, the scrapes or the slices.
    return RelayCost(base[1:], during[1:], slowest, [e - s for r in busy for s, e in r],
                     len(body), held, cores_apart=False)


if __name__ == "__main__":
    produce_trace(sys.argv[1], sys.argv[2], int(sys.argv[3]))
