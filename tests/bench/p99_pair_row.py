"""The p99 kproxy adds over haproxy, measured by the two proxies alone.

The judged p99 rows come from the main section: four paths (direct, kproxy, tansu
proxy, haproxy) one after another after the bulk workloads, 7 repetitions, so one
repetition's p99 moves by tenths of a millisecond with whatever else the machine did in
its 5 s. This section asks only the target's question, kproxy's p99 minus haproxy's, and
asks it more often: the two proxies (``--workers 1`` for kproxy, as in the main section;
haproxy in TCP mode), each in front of a broker of its own as there, a single-message
produce window and a Metadata window through each in a shuffled order per round, twice
as many rounds as the main section has repetitions, plus one. The differences are taken
within each round.
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

sys.path.insert(0, str(Path(__file__).parent))
from bench_measure import Path_, create_topic, section_run, start, workload
from bench_stats import measured_section, round_summary
from tls_row import haproxy, kproxy

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kproxy.embedded_broker import TansuBroker, free_port  # noqa: E402
from tests.support import stop_process  # noqa: E402

HEADING = "## The p99 added over haproxy, the two proxies alone"
RATE = 1000
PATHS = ("kproxy", "haproxy (tcp)")
FLOOR = "floor relay (trio, splice)"  # floor_relays.py trio-splice: splice, no Kafka code
# kproxy with a telemetry subscription that asks clients for no metrics: the same relay,
# but its clients do the work of a client talking to a broker with no subscription (as
# haproxy's do: tansu offers none), so the two relays carry the same clients' traffic.
UNSUBSCRIBED = "kproxy, no metrics subscribed"
# haproxy splicing, as kproxy does a large frame's rest: what splicing costs apart from
# the relay's own code (the judged rows compare with haproxy as it runs by default).
HAPROXY_SPLICE = "haproxy (tcp, splice)"
NO_METRICS_CONFIG = '[[telemetry.subscriptions]]\nname = "none"\nmetrics = []\n'
KINDS = (("produce_latency", "small produce"), ("metadata_latency", "Metadata"))


def rounds_for(reps: int) -> int:
    """More rounds than the main section's repetitions: a round is cheap (four windows)."""
    return 1 if reps <= 1 else 2 * reps + 1


def relays_alone(work: Path, tag: str, names: tuple[str, ...],
                 stops: list[Callable[[], object]]) -> tuple[list[Path_], list[TansuBroker]]:
    """The relays ``names`` ("kproxy", ``UNSUBSCRIBED``, "haproxy (tcp)", ``HAPROXY_SPLICE``,
    ``FLOOR``), each in front of a broker of its own (haproxy's and the floor relay's
    advertise the relay's port: neither rewrites addresses), and the brokers; each one's
    stop goes into ``stops`` as it starts. kproxy runs ``--workers 1`` at its default
    settings (``UNSUBSCRIBED``: but for its telemetry subscription)."""
    paths: list[Path_] = []
    brokers: list[TansuBroker] = []
    for name in names:
        port = free_port()  # the relay's (kproxy picks its own)
        slug = "-".join("".join(c for c in name if c.isalnum() or c == " ").split())
        log = work / f"broker-{tag}-{slug}.log"
        broker = (TansuBroker(log_path=log) if name in ("kproxy", UNSUBSCRIBED)
                  else TansuBroker(port=free_port(), advertised=f"127.0.0.1:{port}",
                                   log_path=log))
        stops.append(broker.stop)
        broker.start()
        brokers.append(broker)
        if name == "kproxy":
            proc, port = kproxy(work, tag, broker.bootstrap, [])
        elif name == UNSUBSCRIBED:
            config = work / f"no-metrics-{tag}.toml"
            config.write_text(NO_METRICS_CONFIG)
            proc, port = kproxy(work, f"{tag}-unsubscribed", broker.bootstrap,
                                ["--config", str(config)])
        elif name in ("haproxy (tcp)", HAPROXY_SPLICE):
            spliced = name == HAPROXY_SPLICE
            proc = haproxy(work, f"{tag}-splice" if spliced else tag, port, broker.bootstrap,
                           splice=spliced)
        elif name == FLOOR:
            proc = start([sys.executable, str(Path(__file__).with_name("floor_relays.py")),
                          "trio-splice", str(port), broker.bootstrap],
                         port, work / f"floor-{tag}.log")
        else:
            raise ValueError(f"no such relay: {name}")
        stops.append(functools.partial(stop_process, proc))
        paths.append(Path_(name, f"127.0.0.1:{port}", proc))
    return paths, brokers


def measure(work: Path, reps: int, seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {"seconds": seconds, "rate": RATE, "rounds": []}
    with section_run(out) as stops:
        paths, _ = relays_alone(work, "p99", PATHS, stops)
        bootstraps = {p.name: p.bootstrap for p in paths}
        topic = f"p99-{uuid.uuid4().hex[:8]}"
        for bootstrap in bootstraps.values():
            create_topic(bootstrap, topic)
        rnd = random.Random(99)
        count = rounds_for(reps)
        for rep in range(count):
            result: dict[str, dict[str, dict[str, float]]] = {}
            for kind, _ in KINDS:
                order = list(PATHS)
                rnd.shuffle(order)
                for name in order:
                    extra = {"topic": topic} if kind == "produce_latency" else {}
                    r = workload(kind, bootstraps[name], rate=RATE, seconds=seconds, **extra)
                    result.setdefault(kind, {})[name] = {"p50_ms": r["p50_ms"],
                                                         "p99_ms": r["p99_ms"]}
                    print(f"p99-pair round {rep + 1}/{count} {kind} {name}: "
                          f"{result[kind][name]}", flush=True)
            out["rounds"].append(result)
    return out


def differences(data: dict[str, Any] | None, kind: str) -> list[float]:
    """Per round, kproxy's p99 minus haproxy's (ms)."""
    return [r[kind]["kproxy"]["p99_ms"] - r[kind]["haproxy (tcp)"]["p99_ms"]
            for r in (data or {}).get("rounds") or []
            if all(name in r.get(kind, {}) for name in PATHS)]


def summary(diffs: list[float]) -> str:
    """"median (quartiles q1 to q3; lowest to highest)", signed, in ms."""
    return round_summary(diffs, "+.2f")


@measured_section(HEADING)
def section(data: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    rounds = data["rounds"]
    lines += ["| workload | kproxy p50 / p99 (ms) | haproxy p50 / p99 (ms) | kproxy - "
              "haproxy p99, per round: median (quartiles; lowest to highest) (ms) |",
              "|---|---|---|---|"]
    for kind, label in KINDS:
        diffs = differences(data, kind)
        if not diffs:
            continue
        cells = [" / ".join(f"{statistics.median(r[kind][name][field] for r in rounds):.2f}"
                            for field in ("p50_ms", "p99_ms"))
                 for name in PATHS]
        lines.append(f"| {label} at {data['rate']:,}/s | {cells[0]} | {cells[1]} "
                     f"| {summary(diffs)} |")
    lines += ["", f"{len(rounds)} round(s); each: single-message `acks=1` produce, then "
              f"Metadata v4 round trips on one connection, at {data['rate']:,}/s for "
              f"{data['seconds']:g} s through each proxy in a shuffled order. kproxy "
              "`--workers 1` at its default settings, haproxy in TCP mode, each in front of "
              "a broker of its own (haproxy's advertises haproxy's port), as in the main "
              "section. The Targets table judges the main section's p99 rows and shows "
              "these beside them, unjudged. `.venv/bin/python tests/bench/run_bench.py "
              "--only p99-pair` measures this section alone.", ""]
    return lines
