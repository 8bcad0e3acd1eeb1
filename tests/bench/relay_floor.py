"""How much of a small request's cost is the event loop's: relays with no Kafka code.

Issue 30 asks for at most 0.17 ms of proxy CPU per Metadata round trip at 1,000/s.
This section measures what relaying such a round trip costs when the relay does
nothing but move bytes, for each way of waiting for sockets (``floor_relays``): plain
epoll with no trio, trio's low-level waits (kproxy's shape), trio's streams, and trio
with a relay thread that takes turns with it. kproxy (``--workers 1``) and haproxy (TCP
mode) run in the same rounds. All are in front of one tansu broker; each round visits
them in a shuffled order with Metadata v4 round trips at 1,000/s, and reads each
process's CPU time (user and system, /proc) around its workload.

The gap between a floor relay and kproxy is kproxy's own work per request; the gap
between the floors is what the way of waiting costs.
"""

from __future__ import annotations

import random
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from bench_measure import Path_, start, workload
from bench_stats import measured_section, median_range
from tls_row import haproxy, kproxy

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kproxy.embedded_broker import TansuBroker, free_port  # noqa: E402
from tests.support import stop_process  # noqa: E402

HEADING = "## What the event loop costs a small request"
RATE = 1000
RELAYS = ("epoll", "trio-express", "trio-lowlevel", "trio-stream")
# Row name, what it is.
ROWS = {"haproxy": "haproxy, TCP mode (C, epoll)",
        "epoll": "floor relay: one thread, epoll, no trio",
        "trio-express": "floor relay: trio accepts, a relay thread taking turns with it "
                        "relays from its own epoll (the express lane's way)",
        "trio-lowlevel": "floor relay: trio, two tasks a connection, wait_readable + "
                         "recv_into/send (kproxy's way without the express lane)",
        "trio-stream": "floor relay: trio, two tasks a connection, SocketStream",
        "kproxy": "kproxy, `--workers 1`, default settings"}


def _paths(work: Path, broker: str) -> list[Path_]:
    paths = []
    script = str(Path(__file__).with_name("floor_relays.py"))
    for mode in RELAYS:
        port = free_port()
        proc = start([sys.executable, script, mode, str(port), broker], port,
                     work / f"floor-{mode}.log")
        paths.append(Path_(mode, f"127.0.0.1:{port}", proc))
    proc, port = kproxy(work, "floor", broker, ["--telemetry-default-interval-ms", "100"])
    paths.append(Path_("kproxy", f"127.0.0.1:{port}", proc))
    if shutil.which("haproxy") or Path("/usr/sbin/haproxy").exists():
        port = free_port()
        paths.append(Path_("haproxy", f"127.0.0.1:{port}",
                           haproxy(work, "floor", port, broker)))
    return paths


def measure(work: Path, reps: int, seconds: float) -> dict[str, Any]:
    """Per path and round: CPU ms per request and the p99 (ms)."""
    out: dict[str, Any] = {"seconds": seconds, "rate": RATE, "rounds": {}}
    rnd = random.Random(30)
    with TansuBroker(log_path=work / "broker-floor.log") as broker:
        paths = _paths(work, broker.bootstrap)
        try:
            for _ in range(reps):
                order = paths[:]
                rnd.shuffle(order)
                for p in order:
                    cpu0 = p.cpu_seconds()
                    r = workload("metadata_latency", p.bootstrap, rate=RATE, seconds=seconds)
                    ms = 1000 * (p.cpu_seconds() - cpu0) / (RATE * seconds)
                    out["rounds"].setdefault(p.name, []).append(
                        {"cpu_ms": ms, "p99_ms": r["p99_ms"]})
                    print(f"floor {p.name:14} {ms:.3f} ms/request p99 {r['p99_ms']:.2f}",
                          flush=True)
        finally:
            for p in paths:
                if p.process is not None:
                    stop_process(p.process)
    return out


def medians(data: dict[str, Any]) -> dict[str, float]:
    """Each path's median CPU ms per request."""
    return {name: statistics.median(r["cpu_ms"] for r in rounds)
            for name, rounds in data.get("rounds", {}).items()}


@measured_section(HEADING)
def section(data: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    rounds = data["rounds"]
    cpu = medians(data)
    ref = rounds.get("haproxy")
    lines += ["| path | proxy CPU per Metadata round trip (ms) | / haproxy, per round "
              "(lowest-highest) | p99 (ms) |", "|---|---|---|---|"]
    for name, what in ROWS.items():
        if name not in rounds:
            continue
        mine = rounds[name]
        ratio = "-"
        if ref is not None and name != "haproxy":
            r = [a["cpu_ms"] / b["cpu_ms"] for a, b in zip(mine, ref, strict=False)
                 if b["cpu_ms"]]
            ratio = median_range(r)
        p99 = statistics.median(x["p99_ms"] for x in mine)
        lines.append(f"| {what} | {cpu[name]:.3f} | {ratio} | {p99:.2f} |")
    n = len(next(iter(rounds.values())))
    lines += ["", f"{n} round(s); each: Metadata v4 round trips on one connection at "
              f"{data['rate']:,}/s for {data['seconds']:g} s through each path, in a "
              "shuffled order, all in front of one broker; the path's CPU time (user and "
              "system, /proc) over its workload, divided by the requests. The floor relays "
              "(`tests/bench/floor_relays.py`) move bytes and nothing else: no framing, "
              "no ordering, no limits. `.venv/bin/python tests/bench/run_bench.py --only "
              "floor` measures this section alone.", ""]
    return lines
