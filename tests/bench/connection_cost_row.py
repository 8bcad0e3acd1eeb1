"""What a new connection costs: kproxy beside haproxy (TCP mode) and the broker direct.

A client that connects, asks ApiVersions and closes pays the proxy's whole connection
path: accept, the upstream connect, the first request and its rewritten answer, the
close. Clients reconnecting at once (a rolling restart, a rebootstrap of a fleet)
pay it together, so it is measured on its own: fresh connections one after another,
each path in turn in a shuffled order per repetition, all in front of one broker.
Figures: the time from ``connect`` to the first byte of the answer, and the proxy
process's CPU per connection (its CPU over the repetition's connections, with a short
wait after the last so its close is counted).
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from admission_row import one_connection, summary
from bench_measure import Path_
from bench_stats import median_range
from tls_row import haproxy, kproxy

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kproxy.embedded_broker import TansuBroker, free_port  # noqa: E402
from tests.support import stop_process  # noqa: E402

HEADING = "## What a new connection costs"
PATHS = ("direct", "kproxy", "haproxy (tcp)")
# After a repetition's last connection: its close reaches the proxy and is counted.
SETTLE_S = 0.3


def measure(work: Path, reps: int, connections: float) -> dict[str, Any]:
    count = int(connections)
    broker = TansuBroker(log_path=work / "broker-connections.log")
    procs = []
    times: dict[str, list[float]] = {name: [] for name in PATHS}
    cpu_ms: dict[str, list[float]] = {name: [] for name in PATHS[1:]}
    try:
        broker.start()
        kp, kp_port = kproxy(work, "connections", broker.bootstrap, [])
        hp_port = free_port()
        hp = haproxy(work, "connections", hp_port, broker.bootstrap)
        procs = [kp, hp]
        paths = {"direct": Path_("direct", broker.bootstrap),
                 "kproxy": Path_("kproxy", f"127.0.0.1:{kp_port}", kp),
                 "haproxy (tcp)": Path_("haproxy (tcp)", f"127.0.0.1:{hp_port}", hp)}
        ports = {name: int(p.bootstrap.rsplit(":", 1)[1]) for name, p in paths.items()}
        for port in ports.values():  # warm: first imports, the remembered answer
            for _ in range(20):
                one_connection(port)
        rnd = random.Random(5)
        for rep in range(reps):
            order = list(PATHS)
            rnd.shuffle(order)
            for name in order:
                cpu0 = paths[name].cpu_seconds()
                got = [one_connection(ports[name]) for _ in range(count)]
                time.sleep(SETTLE_S)
                times[name] += got
                if name in cpu_ms:
                    cpu_ms[name].append((paths[name].cpu_seconds() - cpu0) / count * 1e3)
                print(f"connections rep {rep + 1}/{reps} {name}: median "
                      f"{statistics.median(got) * 1e3:.3f} ms", flush=True)
    finally:
        for proc in procs:
            stop_process(proc)
        broker.stop()
    return {"reps": reps, "connections": count,
            "ms": {name: summary(t) for name, t in times.items()},
            "cpu_ms": cpu_ms}


def section(data: dict[str, Any] | None) -> list[str]:
    if not data or not all(data.get("ms", {}).get(k) for k in PATHS):
        return []
    cpu = {name: statistics.median(v) for name, v in data["cpu_ms"].items() if v}
    ratios = [k / h for k, h in zip(data["cpu_ms"]["kproxy"], data["cpu_ms"]["haproxy (tcp)"],
                                    strict=False) if h]
    lines = [HEADING, "",
             "| path | connect → first answer byte, median (ms) | p90 (ms) | p99 (ms) "
             "| proxy CPU per connection, median over repetitions (ms) |",
             "|---|---|---|---|---|"]
    for name in PATHS:
        t = data["ms"][name]
        spent = f"{cpu[name]:.3f}" if name in cpu else "-"
        lines.append(f"| {name} | {t['median']:.3f} | {t['p90']:.3f} | {t['p99']:.3f} "
                     f"| {spent} |")
    ratio = (" kproxy's CPU per connection over haproxy's, per repetition: median "
             f"(lowest-highest) **{median_range(ratios, 1)}**." if ratios else "")
    lines += ["", f"Each figure: {data['connections']} fresh connections one after another "
              f"per path, {data['reps']} repetition(s), every path in front of one broker "
              "and visited in a shuffled order; a connection sends ApiVersions v3 at once, "
              "reads the answer's first byte and closes. CPU: the proxy process's over a "
              "repetition's connections, read 0.3 s after the last (as the header says)."
              f"{ratio} `.venv/bin/python tests/bench/run_bench.py --only connections` "
              "measures this section alone.", ""]
    return lines
