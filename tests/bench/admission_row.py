"""The admission row of `make bench`: what global admission adds to each new connection.

With ``--workers 2`` a worker asks the supervisor before it serves a connection and
tells it when the connection closes (``kproxy.supervisor.admission_hub``); with
``--workers 1`` admission is a local count. The figure is the time from ``connect``
to the first byte of the answer to an ApiVersions request sent at once on a fresh
connection (the proxy admits it, connects upstream, relays the request and the
answer), many connections one after another, both proxies in front of one broker,
visited in a shuffled order per repetition. The difference of the medians is what
the admission round trip adds.
"""

from __future__ import annotations

import random
import socket
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from workers_row import start_workers

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kproxy.codecs import api_keys  # noqa: E402
from kproxy.embedded_broker import TansuBroker  # noqa: E402
from tests.support import encode_request, stop_process  # noqa: E402

HEADING = "## Admission across workers"
REQUEST = encode_request(api_keys.API_VERSIONS, 3, 1, {
    "client_software_name": "bench", "client_software_version": "1"})


def one_connection(port: int) -> float:
    """Seconds from connect to the answer's first byte, on a fresh connection."""
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(REQUEST)
        if not sock.recv(1):
            raise RuntimeError("the proxy closed the connection")
        elapsed = time.perf_counter() - t0
    return elapsed


def measure(work: Path, reps: int, connections: int) -> dict[str, Any]:
    broker = TansuBroker(log_path=work / "broker-admission.log")
    procs = {}
    times: dict[str, list[float]] = {"1": [], "2": []}
    try:
        broker.start()
        ports, https = {}, {}
        for n in (1, 2):
            procs[n], ports[n], https[n] = start_workers(
                broker, n, work / f"kproxy-admission{n}.log")
        for port in ports.values():  # warm: upstream resolution, first imports
            for _ in range(20):
                one_connection(port)
        waited0 = admission_wait(https[2])
        rnd = random.Random(3)
        for rep in range(reps):
            order = [1, 2]
            rnd.shuffle(order)
            for n in order:
                got = [one_connection(ports[n]) for _ in range(connections)]
                times[str(n)] += got
                print(f"admission rep {rep + 1}/{reps} --workers {n}: median "
                      f"{statistics.median(got) * 1e3:.3f} ms", flush=True)
        waited1 = admission_wait(https[2])
    finally:
        for proc in procs.values():
            stop_process(proc)
        broker.stop()
    count = waited1[1] - waited0[1]
    return {"reps": reps, "connections": connections,
            "ms": {n: summary(t) for n, t in times.items()},
            "admission_wait_mean_s": (waited1[0] - waited0[0]) / count if count else None}


def admission_wait(http: int) -> tuple[float, float]:
    """(seconds, verdicts) waited for the supervisor, over all workers so far."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("kproxy_admission_wait_seconds_sum ") or line.startswith(
                "kproxy_admission_wait_seconds_count "):
            name, value = line.split(" ")
            values[name.rsplit("_", 1)[1]] = float(value)
    return values.get("sum", 0.0), values.get("count", 0.0)


def summary(values: list[float]) -> dict[str, float]:
    """Median, p90 and p99 in milliseconds (the saved run keeps these, not every time)."""
    ordered = sorted(values)

    def q(f: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(f * len(ordered)))] * 1e3, 3)

    return {"median": round(statistics.median(ordered) * 1e3, 3), "p90": q(0.9),
            "p99": q(0.99), "count": len(ordered)}


def section(data: dict[str, Any] | None) -> list[str]:
    if not data or not all(data.get("ms", {}).get(k) for k in ("1", "2")):
        return []
    s1, s2 = data["ms"]["1"], data["ms"]["2"]
    m1, m2 = s1["median"], s2["median"]
    lines = [HEADING, "",
             "| kproxy | connect → first answer byte, median (ms) | p90 (ms) | p99 (ms) |",
             "|---|---|---|---|"]
    for name, t in (("--workers 1 (local count)", s1), ("--workers 2 (supervisor count)", s2)):
        lines.append(f"| {name} | {t['median']:.3f} | {t['p90']:.3f} | {t['p99']:.3f} |")
    wait = data.get("admission_wait_mean_s")
    waited = (" The wait for the supervisor's verdict, as the workers measure it "
              f"(`kproxy_admission_wait_seconds`, mean): **{wait * 1e3:.3f} ms**; where the "
              "proxy shares its cores with the clients and the broker, as here, most of it "
              "is the supervisor process waiting to be scheduled, not the work it does."
              if wait is not None else "")
    lines += ["", "Difference of the medians, `--workers 2` minus `--workers 1`: "
              f"**{m2 - m1:.3f} ms** per connection.{waited} Each figure: "
              f"{data['connections']} fresh connections one after another, "
              f"{data['reps']} repetition(s), the two proxies in front of "
              "one broker and visited in a shuffled order; a connection sends ApiVersions v3 "
              "at once and the time is from `connect` to the first byte of the answer (the "
              "proxy admits it, connects upstream and relays both ways). "
              "`.venv/bin/python tests/bench/run_bench.py --only admission` measures this "
              "section alone.", ""]
    return lines
