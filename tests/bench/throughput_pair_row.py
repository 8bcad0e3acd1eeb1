"""How far this machine can tell two relays' throughput apart: produce 100 B through
kproxy, haproxy and a relay that does nothing but splice bytes.

The main section's produce 100 B row has read 0.97 to 1.00 of haproxy's throughput in
every full run, and its target asks for 1.00. This section asks whether such a gap can
be told from the bench's own noise. It runs the main section's produce 100 B workload
through three relays, each in front of a broker of its own: kproxy (``--workers 1``,
defaults), haproxy (TCP mode), and the ``trio-splice`` floor relay
(``floor_relays.py``: trio, two tasks a connection, splice, no Kafka code), which uses
about as much CPU as haproxy or less. Each round visits them in a shuffled order, twice
as many rounds as the main section has repetitions, plus one; the ratios are taken
within each round. What the floor relay reads against haproxy is the resolution: a
relay that costs no more than haproxy reads that, not 1.00 exactly.
"""

from __future__ import annotations

import functools
import random
import statistics
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_measure import Path_, create_topic, section_run, start, workload
from bench_stats import measured_section, round_summary
from p99_pair_row import rounds_for
from tls_row import haproxy, kproxy

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kproxy.embedded_broker import TansuBroker, free_port  # noqa: E402
from tests.support import stop_process  # noqa: E402

HEADING = "## Produce 100 B throughput, the relays alone"
SIZE = 100
FLOOR = "floor relay (trio, splice)"
PATHS = ("kproxy", "haproxy (tcp)", FLOOR)


def _start(work: Path, stops: list[Callable[[], object]]) -> list[Path_]:
    """The three relays, each in front of a broker of its own (haproxy's and the floor
    relay's advertise the relay's port: neither rewrites addresses); each one's stop
    goes into ``stops`` as it starts."""
    paths: list[Path_] = []
    script = str(Path(__file__).with_name("floor_relays.py"))
    for name in PATHS:
        port = free_port()  # the relay's (kproxy picks its own)
        broker = (TansuBroker(log_path=work / "broker-tput-kproxy.log") if name == "kproxy"
                  else TansuBroker(port=free_port(), advertised=f"127.0.0.1:{port}",
                                   log_path=work / f"broker-tput-{name.split()[0]}.log"))
        stops.append(broker.stop)
        broker.start()
        if name == "kproxy":
            proc, port = kproxy(work, "tput", broker.bootstrap, [])
        elif name == "haproxy (tcp)":
            proc = haproxy(work, "tput", port, broker.bootstrap)
        else:
            proc = start([sys.executable, script, "trio-splice", str(port), broker.bootstrap],
                         port, work / "floor-tput.log")
        stops.append(functools.partial(stop_process, proc))
        paths.append(Path_(name, f"127.0.0.1:{port}", proc))
    return paths


def measure(work: Path, reps: int, count: float) -> dict[str, Any]:
    """Per round and relay: MB/s and the relay's CPU seconds over its workload."""
    out: dict[str, Any] = {"count": int(count), "size": SIZE, "rounds": []}
    with section_run(out) as stops:
        paths = _start(work, stops)
        topic = f"tput-{uuid.uuid4().hex[:8]}"
        for p in paths:
            create_topic(p.bootstrap, topic)
        rnd = random.Random(100)
        total = rounds_for(reps)
        for rep in range(total):
            order = paths[:]
            rnd.shuffle(order)
            result: dict[str, dict[str, float]] = {}
            for p in order:
                cpu0 = p.cpu_seconds()
                r = workload("produce", p.bootstrap, topic=topic, count=int(count), size=SIZE)
                result[p.name] = {"mb_s": r["mb_s"], "cpu_s": p.cpu_seconds() - cpu0,
                                  "failures": r["failures"]}
                print(f"throughput-pair round {rep + 1}/{total} {p.name}: {result[p.name]}",
                      flush=True)
            out["rounds"].append(result)
    return out


def ratios(data: dict[str, Any] | None, name: str) -> list[float]:
    """Per round, ``name``'s MB/s over haproxy's."""
    return [r[name]["mb_s"] / r["haproxy (tcp)"]["mb_s"]
            for r in (data or {}).get("rounds") or []
            if name in r and "haproxy (tcp)" in r]


@measured_section(HEADING)
def section(data: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    rounds = data["rounds"]
    gb = data["count"] * data["size"] / 1e9
    lines += ["| relay | MB/s, median | / haproxy, per round: median (quartiles; lowest "
              "to highest) | CPU s per GB, median |", "|---|---|---|---|"]
    for name in PATHS:
        runs = [r[name] for r in rounds if name in r]
        if not runs:
            continue
        ratio = round_summary(ratios(data, name)) if name != "haproxy (tcp)" else "1"
        lines.append(f"| {name} | {statistics.median(r['mb_s'] for r in runs):.1f} "
                     f"| {ratio} | {statistics.median(r['cpu_s'] for r in runs) / gb:.2f} |")
    lines += ["", f"{len(rounds)} round(s); each: {data['count']:,} messages of "
              f"{data['size']} B produced as in the main section through each relay in a "
              "shuffled order. kproxy `--workers 1` at its default settings, haproxy in "
              "TCP mode, the floor relay `floor_relays.py trio-splice`; each in front of a "
              "broker of its own. CPU: the relay's user and system time (/proc, 10 ms "
              "ticks) over its workload. The Targets table shows these ratios beside the "
              "judged produce 100 B row, unjudged. `.venv/bin/python tests/bench/run_bench.py "
              "--only throughput-pair` measures this section alone.", ""]
    return lines
