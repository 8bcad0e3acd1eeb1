"""What client telemetry pushes cost a small producer's p99 through kproxy.

The bench's other paths run kproxy at its default telemetry settings: clients push
every 60 s, so a 5 s latency window sees few pushes if any, and through haproxy and
tansu proxy they push nothing at all (tansu does not advertise PushTelemetry). This row
asks clients to push every 100 ms, 600 times as often, and measures what that costs
the p99 of single-message produce at 1,000/s. A push is answered by the proxy itself:
a small one in the express lane, in its place among the connection's requests (at
e940158 and before, the lane handed the connection back to its trio tasks for each
push, and the produce requests around it took the trio path). Every 100 ms against
the default interval, against the broker directly: two proxies (``--workers 1``
each) in front of one broker, the three paths in a shuffled order each round, the
p99s' differences taken within each round.
"""

from __future__ import annotations

import functools
import random
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_measure import create_topic, section_run, workload
from bench_stats import measured_section
from tls_row import kproxy

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kproxy.embedded_broker import TansuBroker  # noqa: E402
from tests.support import stop_process  # noqa: E402

HEADING = "## Telemetry pushes and the small-produce p99"
RATE = 1000
# Path name -> kproxy flags (None: the broker directly).
PATHS: dict[str, list[str] | None] = {
    "direct": None,
    "kproxy, pushes every 100 ms": ["--telemetry-default-interval-ms", "100"],
    "kproxy, pushes every 60 s (the default, as in the other sections)": [],
}
FAST, DEFAULT = list(PATHS)[1:]


def measure(work: Path, reps: int, seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {"seconds": seconds, "rate": RATE, "rounds": []}
    with TansuBroker(log_path=work / "broker-telemetry-p99.log") as broker, \
            section_run(out) as stops:
        bootstraps = {}
        for i, (name, flags) in enumerate(PATHS.items()):
            if flags is None:
                bootstraps[name] = broker.bootstrap
                continue
            proc, port = kproxy(work, f"tp99-{i - 1}", broker.bootstrap, flags)
            stops.append(functools.partial(stop_process, proc))
            bootstraps[name] = f"127.0.0.1:{port}"
        topic = f"tp99-{uuid.uuid4().hex[:8]}"
        create_topic(broker.bootstrap, topic)
        rnd = random.Random(30)
        for rep in range(reps):
            order = list(bootstraps)
            rnd.shuffle(order)
            result = {}
            for name in order:
                r = workload("produce_latency", bootstraps[name], rate=RATE,
                             seconds=seconds, topic=topic)
                result[name] = {"p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"]}
                print(f"telemetry-p99 rep {rep + 1}/{reps} {name}: {result[name]}",
                      flush=True)
            out["rounds"].append(result)
    return out


@measured_section(HEADING)
def section(data: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    rounds = data["rounds"]
    lines += ["| path | p50 (ms) | p99 (ms) | p99 added over direct, per round: median "
              "(lowest-highest) (ms) |", "|---|---|---|---|"]
    for name in PATHS:
        p50 = statistics.median(r[name]["p50_ms"] for r in rounds)
        p99 = statistics.median(r[name]["p99_ms"] for r in rounds)
        added = [r[name]["p99_ms"] - r["direct"]["p99_ms"] for r in rounds]
        cell = "-" if name == "direct" else (
            f"{statistics.median(added):+.2f} ({min(added):+.2f} to {max(added):+.2f})")
        lines.append(f"| {name} | {p50:.2f} | {p99:.2f} | {cell} |")
    lines += ["", f"{len(rounds)} round(s); each: single-message `acks=1` produce at "
              f"{data['rate']:,}/s for {data['seconds']:g} s through each path in a "
              "shuffled order, the client sleeping to its schedule "
              "(tests/paced_produce.py). Both proxies ran at once, `--workers 1` each, in "
              "front of one broker. `.venv/bin/python tests/bench/run_bench.py --only "
              "telemetry-p99` measures this section alone.", ""]
    return lines


def added_by_pushes(data: dict[str, Any] | None) -> list[float]:
    """Per round, kproxy's p99 with pushes every 100 ms minus at the default (ms)."""
    rounds = (data or {}).get("rounds") or []
    return [r[FAST]["p99_ms"] - r[DEFAULT]["p99_ms"] for r in rounds
            if FAST in r and DEFAULT in r]
