"""What `make bench` runs and measures: proxy processes, client workloads, idle
connections, telemetry pushes and /metrics scrapes under load.

Each workload runs in a client process of its own (``workloads.py``), so the
clients' timings share no interpreter with the driver or with each other.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import statistics
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kproxy.embedded_broker import TansuBroker, free_port, wait_for_port  # noqa: E402
from tests.support import broker_port_base  # noqa: E402
from tests.support import process_tree as support_process_tree  # noqa: E402
from tests.support import stop_process as stop_proc  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from workloads import read_exactly, tls_config  # noqa: E402

WORKLOADS = Path(__file__).with_name("workloads.py")


@contextlib.contextmanager
def section_run(out: dict[str, Any]) -> Iterator[list[Callable[[], object]]]:
    """A section's measurement: what fails is reported in the section (``out["error"]``)
    and the run goes on to the next; what was started is stopped whatever happens. The
    caller appends each stop as it starts something; they run last first."""
    stops: list[Callable[[], object]] = []
    try:
        yield stops
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        for stop_one in reversed(stops):
            stop_one()


def raise_fd_limit() -> int:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


@dataclass
class Path_:
    """One way to reach the broker: direct, or through a proxy process."""

    name: str
    bootstrap: str
    process: subprocess.Popen[bytes] | None = None
    results: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    def cpu_seconds(self) -> float:
        """CPU of the process and its descendants (kproxy --workers N: the supervisor
        and its workers), including children that exited and were waited for."""
        return sum(process_cpu_seconds(pid, waited_for=True)
                   for pid in process_tree(self.process))

    def rss_mb(self) -> float:
        """Resident memory of the process and its descendants."""
        kb = 0
        for pid in process_tree(self.process):
            try:
                status = Path(f"/proc/{pid}/status").read_text().splitlines()
            except OSError:
                continue
            kb += sum(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
        return kb / 1024


# The kernel's CPU-time clock of another process (clock_getcpuclockid(3)): its id is
# the pid's complement shifted past the clock type, CPUCLOCK_SCHED (2) for the time
# the scheduler ran it. It counts every thread, exited ones too, to the nanosecond,
# where /proc/<pid>/stat counts in clock ticks (10 ms).
_CPUCLOCK_SCHED = 2
TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def cpu_clock_works() -> bool:
    """Whether another process's CPU-time clock can be read here (Linux: yes)."""
    try:
        time.clock_gettime_ns(((~os.getpid()) << 3) | _CPUCLOCK_SCHED)
    except (OSError, OverflowError):
        return False
    return True


def process_cpu_seconds(pid: int, waited_for: bool = False) -> float:
    """CPU seconds process ``pid`` has run, all its threads (and with ``waited_for``, its
    children that exited and were waited for: those only in ticks); 0.0 once it is
    gone. Where its CPU-time clock cannot be read, /proc's ticks."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # exited since the caller saw it
        return 0.0
    children = (int(stat[13]) + int(stat[14])) * TICK_S if waited_for else 0.0
    try:
        own = time.clock_gettime_ns(((~pid) << 3) | _CPUCLOCK_SCHED) / 1e9
    except (OSError, OverflowError):
        own = (int(stat[11]) + int(stat[12])) * TICK_S  # utime, stime
    return own + children


def process_tree(process: subprocess.Popen[bytes] | None) -> list[int]:
    """The pid of ``process`` and of every live descendant."""
    return [] if process is None else support_process_tree(process.pid)


def start(cmd: list[str], port: int, log: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                env={**os.environ, **(env or {})})
    if not wait_for_port("127.0.0.1", port, 20):
        proc.kill()
        raise RuntimeError(f"{cmd[0]} did not start: {log.read_text()[-800:]}")
    return proc


def workload(kind: str, bootstrap: str, **opts: object) -> dict[str, float]:
    args = [sys.executable, str(WORKLOADS), kind, bootstrap]
    for k, v in opts.items():
        args += [f"--{k}", str(v)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{kind} via {bootstrap} failed: {proc.stderr[-800:]}")
    return dict(json.loads(lines[-1]))


def parallel_workload(kind: str, bootstrap: str, topics: list[str], lead_s: float = 2.0,
                      **opts: object) -> dict[str, float]:
    """One client process per topic, all at once: they set themselves up, start timing
    together ``lead_s`` from now, and the result is every client's bytes over the wall
    time from that start to the last one's end."""
    start_at = time.time() + lead_s
    procs = []
    for topic in topics:
        args = [sys.executable, str(WORKLOADS), kind, bootstrap, "--topic", topic,
                "--start-at", str(start_at)]
        for k, v in opts.items():
            args += [f"--{k}", str(v)]
        procs.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if proc.returncode or not lines:
            raise RuntimeError(f"{kind} via {bootstrap} failed: {err[-800:]}")
        results.append(json.loads(lines[-1]))
    wall = max(r["end"] for r in results) - start_at
    total = sum(r["bytes"] for r in results)
    return {"mb_s": total / wall / 1e6, "seconds": wall, "bytes": total,
            "clients": len(results), "failures": sum(r.get("failures", 0) for r in results),
            "complete": all(r.get("complete", True) for r in results),
            "slowest_client_mb_s": min(r["mb_s"] for r in results)}


def create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, **tls_config()})
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(30)


# How long all of a count's connections have to be answered. The broker behind the
# proxy accepts them too, and tansu has now and then taken more than 10 s to answer a
# few thousand new connections (its accept queue full behind haproxy, seen in a full
# run): the figure is memory, not speed, so it waits.
IDLE_ANSWER_S = 120.0


def idle_connections(path: Path_, counts: list[int]) -> dict[int, float]:
    """MB of proxy memory per 1k connections that did one ApiVersions and went idle.
    A count whose connections are not all answered in ``IDLE_ANSWER_S`` is left out
    (the report shows "-"), and said so in the log."""
    out: dict[int, float] = {}
    host, port = path.bootstrap.rsplit(":", 1)
    api_versions = struct.pack(">hhih", 18, 0, 1, 4) + b"idle"
    frame = struct.pack(">i", len(api_versions)) + api_versions
    for n in counts:
        time.sleep(0.5)
        before = path.rss_mb()
        socks = []
        answered = 0
        try:
            for _ in range(n):
                s = socket.create_connection((host, int(port)), timeout=10)
                s.sendall(frame)
                socks.append(s)
            deadline = time.monotonic() + IDLE_ANSWER_S
            for s in socks:  # every connection answered: it is open end to end
                s.settimeout(max(0.001, deadline - time.monotonic()))
                size = struct.unpack(">i", read_exactly(s, 4))[0]
                read_exactly(s, size)
                answered += 1
            time.sleep(1.0)
            out[n] = path.rss_mb() - before
        except OSError as exc:  # TimeoutError, a connection closed or refused
            print(f"idle {path.name}: {answered:,} of {n:,} connections answered "
                  f"({type(exc).__name__}: {exc}); {n:,} not measured", flush=True)
        finally:
            for s in socks:
                s.close()
    return out


def telemetry_pushes(bootstrap: str, kproxy: Path_, seconds: float,
                     instances: int = 2000) -> dict[str, float]:
    """PushTelemetry/s with real librdkafka-sized zstd payloads and the exporter live."""
    from kproxy.codecs.framing import FrameReader
    from kproxy.codecs.messages import decode_request, decode_response
    from tests.support import encode_request, push_body, push_error

    vectors = ROOT / "tests" / "vectors" / "librdkafka-telemetry.jsonl"
    push = next(json.loads(line) for line in vectors.read_text().splitlines()
                if '"compression": "zstd"' in line and json.loads(line)["api_key"] == 72
                and json.loads(line)["direction"] == "request")
    payload = decode_request(bytes.fromhex(push["hex"])).body["metrics"]
    host, port = bootstrap.rsplit(":", 1)
    conns = [socket.create_connection((host, int(port))) for _ in range(4)]
    readers = [FrameReader() for _ in conns]

    def roundtrip(i: int, data: bytes) -> bytes:
        s, r = conns[i % len(conns)], readers[i % len(conns)]
        s.sendall(data)
        while (f := r.next_frame()) is None:
            r.feed(s.recv(1 << 20))
        return f

    frames = []
    for i in range(instances):
        iid = uuid.uuid4()
        got = decode_response(roundtrip(i, encode_request(71, 0, i, {"client_instance_id": iid})),
                              71, 0).body
        frames.append(encode_request(72, 0, i, push_body(got, payload, 4)))
    time.sleep(0.15)  # one push interval (100 ms) since the Gets
    cpu0, t0 = kproxy.cpu_seconds(), time.perf_counter()
    accepted = refused = 0
    deadline = t0 + seconds
    batch = 200
    i = 0
    while time.perf_counter() < deadline:
        for c, (s, r) in enumerate(zip(conns, readers, strict=True)):
            chunk = [frames[(i + k) % instances] for k in range(c, batch, len(conns))]
            s.sendall(b"".join(chunk))
            for _ in chunk:
                while (f := r.next_frame()) is None:
                    r.feed(s.recv(1 << 20))
                error = push_error(f)
                accepted += error == 0
                refused += error != 0
        i += batch
        # Each instance may push once per 100 ms: pace the rounds over the instances.
        time.sleep(0.12 * batch / instances)
    dt = time.perf_counter() - t0
    cpu = kproxy.cpu_seconds() - cpu0
    for s in conns:
        s.close()
    return {"pushes_s": accepted / dt, "refused": refused,
            "pushes_per_cpu_s": accepted / cpu if cpu else 0.0, "proxy_cpu": cpu / dt}


SCRAPE_SIZES = (10_000, 100_000, 250_000)
SCRAPE_WINDOW = 3.0  # seconds per window, without and with scrapes
# Pairs of windows per size: the largest size's ratio is judged (bench_targets), and
# at one scrape a second a 3 s window holds three.
SCRAPE_ROUNDS = 9
SERIES_PER_INSTANCE = 250


def still_held(size: int, held: float) -> None:
    """Fail the section, not report a smaller fleet under ``size``'s name."""
    if held < size - SERIES_PER_INSTANCE:
        raise RuntimeError(f"filled to {size:,} client series, the proxy holds {held:,.0f}:"
                           " instances expired or were evicted (see kproxy-scrape.log)")


def scrape_under_load(broker: TansuBroker, work: Path, sizes: tuple[int, ...],
                      window: float, rounds: int = 5) -> list[dict[str, float]]:
    """/metrics at growing numbers of client series: how long a scrape takes, and the
    relay's produce p99 without scrapes and while scrapes run back to back.

    A kproxy of its own (series cap 250,000) is filled through real telemetry
    requests (tests/scrape_load.py: 250 series per client instance); the scraper asks
    for gzip as Prometheus does. The producer (1,000 single-message ``acks=1``
    requests a second) runs in its own process through ``rounds`` pairs of windows,
    ``window`` s without scrapes then scrapes back to back (``relay_cost``); the
    ratio is the median of the rounds' ratios, each round's two windows sharing the
    machine's state of the moment. Measured twice: with every process free to share
    the cores, and with the proxy on a core of its own (``cores_apart``; the ratio
    then shows whether requests wait for the scrape, not the machine's scheduler).
    """
    from tests.scrape_load import KEEP_FILLED_FLEET, fill_series, metric_value, relay_cost, scrape

    assert broker.process is not None

    port, http, base = free_port(), free_port(), broker_port_base()
    proc = start([sys.executable, "-m", "kproxy.cli", "run", "--workers", "1",
                  "--upstream", broker.bootstrap,
                  "--listen", f"127.0.0.1:{port}", "--http", f"127.0.0.1:{http}",
                  "--broker-port-base", str(base), "--node-id-range", "111-111",
                  "--telemetry-max-series", str(max(sizes)),
                  "--telemetry-max-series-bytes", str(512 << 20), *KEEP_FILLED_FLEET,
                  "--log-level", "warning"],
                 port, work / "kproxy-scrape.log", {"KPROXY_CONFIG": ""})
    bootstrap = f"127.0.0.1:{port}"
    rows: list[dict[str, float]] = []
    try:
        create_topic(bootstrap, "scrape-lat")
        for size in sizes:
            have = int(metric_value(http, "kproxy_telemetry_series"))
            if size > have:
                fill_series(bootstrap, (size - have) // SERIES_PER_INSTANCE,
                            SERIES_PER_INSTANCE)
            idle = [scrape(http) for _ in range(3)]
            row = {"series": metric_value(http, "kproxy_telemetry_series"),
                   "scrape_s": statistics.median(t for t, _ in idle),
                   "gzip_mb": idle[-1][1] / 1e6,
                   "longest_slice_cpu_ms": 1000 * metric_value(
                       http, "kproxy_scrape_longest_slice_cpu_seconds"),
                   "rss_mb": Path_("kproxy", bootstrap, proc).rss_mb()}
            still_held(size, row["series"])
            cost = relay_cost(bootstrap, http, "scrape-lat", rounds, window, rate=1000)
            row.update(p99_ms=1000 * statistics.median(cost.baseline_p99),
                       p99_scrape_ms=1000 * statistics.median(cost.during_p99),
                       ratio=cost.ratio, ratio_min=min(cost.ratios),
                       ratio_max=max(cost.ratios), rounds=rounds, window_s=window, warmup=1,
                       slowest_ms=1000 * cost.slowest,
                       scrape_busy_s=statistics.median(cost.scrapes),
                       scrapes=len(cost.scrapes))
            apart = relay_cost(bootstrap, http, "scrape-lat", rounds, window, rate=1000,
                               proxy_pid=proc.pid, broker_pid=broker.process.pid)
            if apart.cores_apart:
                row.update(p99_apart_ms=1000 * statistics.median(apart.baseline_p99),
                           p99_scrape_apart_ms=1000 * statistics.median(apart.during_p99),
                           ratio_apart=apart.ratio, ratio_apart_min=min(apart.ratios),
                           ratio_apart_max=max(apart.ratios),
                           slowest_apart_ms=1000 * apart.slowest)
            still_held(size, metric_value(http, "kproxy_telemetry_series"))
            rows.append(row)
            print(f"scrape {json.dumps({k: round(v, 3) for k, v in row.items()})}",
                  flush=True)
    finally:
        stop_proc(proc)
    return rows
