"""The workers row of `make bench`: kproxy ``--workers 1`` against ``--workers 2``.

A client connection is served by one worker (the kernel picks it, SO_REUSEPORT), so a
single client cannot show what a second worker adds: ``clients`` producers (then
consumers) run at once, each on a topic of its own, and start timing together; the
figure is their bytes over the wall time from that start to the last one's end.
Both proxies run side by side in one run, each in front of a broker of its own; every
repetition restarts both brokers, fills the consume topics at the broker directly and
then visits the two proxies in a shuffled order per workload, so the comparison is
paired like the rest of the benchmark.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_measure import Path_, create_topic, parallel_workload, start
from bench_stats import fmt, median, paired

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kproxy.embedded_broker import TansuBroker, free_port  # noqa: E402
from tests.support import broker_port_base, stop_process  # noqa: E402

HEADING = "## kproxy workers"
KEYS = (("produce_1k", "produce 1 KB"), ("consume", "consume 1 KB"))


def wait_ready(http: int, workers: int, timeout: float = 90.0) -> None:
    """Until every worker answers (the bootstrap port opens with the first one)."""
    want = f"{workers}/{workers} workers ready" if workers > 1 else ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/readyz", timeout=5) as r:
                if r.status == 200 and r.read().decode().startswith(want):
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"kproxy --workers {workers} not ready in {timeout:.0f} s")


def start_workers(broker: TansuBroker, workers: int, log: Path, *extra: str
                  ) -> tuple[subprocess.Popen[bytes], int, int]:
    """``kproxy run --workers N`` in front of ``broker``, every worker ready: the process,
    its bootstrap port and its HTTP port."""
    port, http = free_port(), free_port()
    proc = start([sys.executable, "-m", "kproxy.cli", "run", "--workers", str(workers),
                  "--upstream", broker.bootstrap, "--listen", f"127.0.0.1:{port}",
                  "--http", f"127.0.0.1:{http}", "--broker-port-base", str(broker_port_base()),
                  "--node-id-range", "111-111", "--log-level", "warning", *extra],
                 port, log, {"KPROXY_CONFIG": ""})
    wait_ready(http, workers)
    return proc, port, http


def cpu_list(text: str) -> set[int]:
    """``taskset -c`` syntax: ``0-3,8``."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def measure(work: Path, reps: int, clients: int, count: int,
            workers: tuple[int, ...] = (1, 2), proxy_cpus: str | None = None,
            ) -> dict[str, Any]:
    """Per worker count and workload, one aggregate result per repetition.

    ``proxy_cpus`` (``taskset -c`` syntax): the proxies run on these cores only, and
    the brokers and clients (started by this process) on the others."""
    brokers = {n: TansuBroker(log_path=work / f"broker-workers{n}.log") for n in workers}
    sides: dict[int, Path_] = {}
    rnd = random.Random(2)
    own_cpus = os.sched_getaffinity(0)
    pin: list[str] = []
    if proxy_cpus:
        rest = own_cpus - cpu_list(proxy_cpus)
        if not rest:
            raise ValueError(f"--workers-proxy-cpus {proxy_cpus} leaves no core for the "
                             "brokers and clients")
        os.sched_setaffinity(0, rest)
        pin = ["taskset", "-c", proxy_cpus]
    try:
        for b in brokers.values():
            b.start()
        for n, broker in brokers.items():
            port, http, base = free_port(), free_port(), broker_port_base()
            proc = start([*pin, sys.executable, "-m", "kproxy.cli", "run", "--workers", str(n),
                          "--upstream", broker.bootstrap, "--listen", f"127.0.0.1:{port}",
                          "--http", f"127.0.0.1:{http}", "--broker-port-base", str(base),
                          "--node-id-range", "111-111", "--log-level", "warning"],
                         port, work / f"kproxy-workers{n}.log", {"KPROXY_CONFIG": ""})
            sides[n] = Path_(f"--workers {n}", f"127.0.0.1:{port}", proc)
            wait_ready(http, n)
        produce = [f"wp-{i}" for i in range(clients)]
        fill = [f"wf-{i}" for i in range(clients)]
        for rep in range(reps):
            for b in brokers.values():  # same ports: the proxies reconnect
                b.stop()
                b.start()
            for b in brokers.values():
                for topic in produce + fill:
                    create_topic(b.bootstrap, topic)
                parallel_workload("produce", b.bootstrap, fill, count=count, size=1024)
            for key, kind, topics in (("produce_1k", "produce", produce),
                                      ("consume", "consume", fill)):
                order = list(sides.values())
                rnd.shuffle(order)
                for side in order:
                    cpu0 = side.cpu_seconds()
                    result = parallel_workload(kind, side.bootstrap, topics, count=count,
                                               size=1024)
                    result["proxy_cpu_s"] = side.cpu_seconds() - cpu0
                    side.results.setdefault(key, []).append(result)
                    print(f"workers rep {rep + 1}/{reps} {key:10} {side.name:12} "
                          f"{result['mb_s']:.1f} MB/s, proxy CPU {result['proxy_cpu_s']:.2f} s",
                          flush=True)
    finally:
        for side in sides.values():
            if side.process is not None:
                stop_process(side.process)
        for b in brokers.values():
            b.stop()
        os.sched_setaffinity(0, own_cpus)
    return {"clients": clients, "count": count, "reps": reps, "workers": list(workers),
            "proxy_cpus": proxy_cpus, "machine_cpus": os.cpu_count(),
            "results": {str(n): side.results for n, side in sides.items()}}


def sides_of(data: dict[str, Any] | None) -> tuple[Path_, Path_] | None:
    """The fewest and the most workers compared, as paths for the paired summaries."""
    if not data or len(data.get("workers", [])) < 2:
        return None
    lo, hi = min(data["workers"]), max(data["workers"])
    results = data["results"]
    return (Path_(f"--workers {lo}", "", None, results[str(lo)]),
            Path_(f"--workers {hi}", "", None, results[str(hi)]))


def cpu_per_gb(side: Path_, key: str) -> float | None:
    vals = [r["proxy_cpu_s"] / (r["bytes"] / 1e9) for r in side.results.get(key, [])
            if r.get("bytes")]
    return statistics.median(vals) if vals else None


def section(data: dict[str, Any] | None) -> list[str]:
    pair = sides_of(data)
    if data is None or pair is None:
        return []
    lo, hi = pair
    lines = [f"{HEADING}: {lo.name} against {hi.name}", "",
             "| kproxy | produce 1 KB (MB/s) | consume 1 KB (MB/s) | "
             "CPU s per GB, produce | CPU s per GB, consume |",
             "|---|---|---|---|---|"]
    for side in (lo, hi):
        lines.append(f"| {side.name} | " + " | ".join(
            fmt(median(side, key, "mb_s")) for key, _ in KEYS)
            + " | " + " | ".join(fmt(cpu_per_gb(side, key), 2) for key, _ in KEYS) + " |")
    ratios = [paired(hi, lo, key, "mb_s", lambda a, b: a / b) for key, _ in KEYS]
    lines.append(f"| {hi.name.removeprefix('--')} / {lo.name.removeprefix('--')} "
                 "(paired) | " + " | ".join(fmt(r, 2) for r in ratios) + " | | |")
    lines += ["", f"{data['clients']} clients at once, each on a topic of its own with "
              f"{data['count']:,} messages of 1 KB (`linger.ms=5`, `acks=1`; consume: "
              "its filled topic read to the end), timing from a common start to the last "
              f"client's end; {data['reps']} repetition(s) on fresh brokers, the two "
              "proxies visited in a shuffled order. CPU is the supervisor and its workers "
              "together. Unless the proxies are given cores of their own (below), the "
              "clients and the brokers share the proxy's cores, so on a small machine "
              "more workers compete with them for the same CPU time.", "",
              "On a bigger machine: `.venv/bin/python tests/bench/run_bench.py --only "
              "workers --workers-compare 1,N --workers-clients 2N --workers-proxy-cpus "
              "0-(N-1)` measures this section alone and puts it into the report: the "
              "proxies run on cores 0 to N-1 only (`taskset`), the brokers and the "
              "clients on the others, so the figure is the proxy's and not its neighbours'."
              + (f" This run: proxies on cores {data['proxy_cpus']} (`taskset -c`) of "
                 f"the machine's {data['machine_cpus']}." if data.get("proxy_cpus") else ""),
              ""]
    return lines
