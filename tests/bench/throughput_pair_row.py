"""How far this machine can tell two relays' throughput apart: the main section's three
throughput workloads through kproxy, haproxy, haproxy splicing, a relay that does
nothing but splice bytes, and kproxy whose clients collect no telemetry metrics.

The main section's throughput rows have read from 0.92 to 1.00 of haproxy's from one
full run to the next, and their targets ask for 1.00. This section asks whether such a
gap can be told from the bench's own noise. It runs the main section's produce 1 KB,
produce 100 B and consume 1 KB workloads through five relays, each in front of a
broker of its own: kproxy (``--workers 1``, defaults), haproxy (TCP mode), haproxy
splicing both directions (socket to pipe to socket, as kproxy moves a large frame's
rest: what splicing itself costs, apart from any relay's code), the ``trio-splice``
floor relay (``floor_relays.py``: trio, two tasks a connection, splice, no Kafka code),
which uses less CPU than haproxy; and kproxy again with a
telemetry subscription that asks for no metrics: by default kproxy subscribes every
client to all of its metrics (KIP-714), and a client collecting them does work of its
own that a client of haproxy (in front of tansu, which offers no subscription) does not;
that relay carries the same clients' traffic as haproxy's. Every round starts on freshly
started brokers, as the main section's repetitions do, and visits the relays in a shuffled
order for each workload; twice as many rounds as the main section has repetitions, plus
one. The ratios are taken within each round. What the floor relay reads against
haproxy is the resolution: a relay that costs no more than haproxy reads that, not
1.00 exactly.

A consume round's CPU is not all per byte: each round is a new consumer, whose
connections, first requests, telemetry and close the relay serves whatever it reads,
and the relay's own timers run while it does. So each round also runs a consumer of an
empty topic through each relay, and the report shows consume's CPU per GB with that
taken off beside the whole. And since what a wake-up costs depends on the machine
(``host_wakes``), the run measures that first.
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

import host_wakes
from bench_measure import Path_, create_topic, section_run, workload
from bench_stats import measured_section, round_summary
from p99_pair_row import FLOOR, HAPROXY_SPLICE, UNSUBSCRIBED, relays_alone, rounds_for

if TYPE_CHECKING:
    from kproxy.embedded_broker import TansuBroker

HEADING = "## Throughput, the relays alone"
HAPROXY = "haproxy (tcp)"
PATHS = ("kproxy", UNSUBSCRIBED, HAPROXY, HAPROXY_SPLICE, FLOOR)
COMPARED = tuple(p for p in PATHS if p != HAPROXY)  # each read over haproxy's MB/s
# The main section's workloads, under its keys: (label, message size, topic). As there,
# a produce 1 KB round sends a quarter as many messages as a produce 100 B round; consume
# reads back what produce 1 KB wrote.
WORKLOADS = {"produce_1k": ("produce 1 KB", 1024, "tput-1k"),
             "produce_100b": ("produce 100 B", 100, "tput-100b"),
             "consume": ("consume 1 KB", 1024, "tput-1k")}
# A consumer with nothing to read: what a relay spends on a consumer whatever it reads.
EMPTY, EMPTY_TOPIC = "consume_empty", "tput-empty"


def _run(kind: str, path: Path_, counts: dict[str, int],
         broker: TansuBroker) -> dict[str, float]:
    """One workload through one relay: its MB/s, and the relay's CPU seconds and its
    broker's over it."""
    _, size, topic = WORKLOADS[kind] if kind != EMPTY else ("", 0, EMPTY_TOPIC)
    behind = Path_("broker", broker.bootstrap, broker.process)  # restarted every round
    cpu0, broker_cpu0 = path.cpu_seconds(), behind.cpu_seconds()
    if kind in ("consume", EMPTY):
        r = workload("consume", path.bootstrap, topic=topic, count=counts.get(kind, 0))
        if not r["complete"]:
            raise RuntimeError(f"consume via {path.name} read {r['messages']:,} of "
                               f"{counts.get(kind, 0):,}")
        failures = 0.0
    else:
        r = workload("produce", path.bootstrap, topic=topic, count=counts[kind], size=size)
        failures = r["failures"]
    return {"mb_s": r["mb_s"], "cpu_s": path.cpu_seconds() - cpu0, "failures": failures,
            "broker_cpu_s": behind.cpu_seconds() - broker_cpu0}


def measure(work: Path, reps: int, count: float) -> dict[str, Any]:
    """Per round, workload and relay: MB/s and the relay's CPU seconds over the
    workload. ``count``: messages of 100 B a produce 100 B round sends."""
    counts = {"produce_1k": int(count) // 4, "produce_100b": int(count),
              "consume": int(count) // 4}
    # A smoke run (a small count) measures every figure, in short windows.
    full = count >= 100_000
    wakes = host_wakes.measure() if full else host_wakes.measure(1.0, 2)
    pages = host_wakes.page_touch(3 if full else 1)
    out: dict[str, Any] = {"counts": counts, "rounds": [], "wakes": wakes, "pages": pages}
    with section_run(out) as stops:
        paths, brokers = relays_alone(work, "tput", PATHS, stops)
        broker_of = {p.name: b for p, b in zip(paths, brokers, strict=True)}
        rnd = random.Random(100)
        total = rounds_for(reps)
        for rep in range(total):
            if rep:  # empty brokers (same ports): what a round stores is gone after it
                for broker in brokers:
                    broker.stop()
                    broker.start()
            for p in paths:
                for topic in sorted({t for _, _, t in WORKLOADS.values()} | {EMPTY_TOPIC}):
                    create_topic(p.bootstrap, topic)
            result: dict[str, dict[str, dict[str, float]]] = {}
            for kind in (*WORKLOADS, EMPTY):
                order = paths[:]
                rnd.shuffle(order)
                for p in order:
                    result.setdefault(kind, {})[p.name] = r = _run(kind, p, counts,
                                                                   broker_of[p.name])
                    print(f"throughput-pair round {rep + 1}/{total} {kind} {p.name}: {r}",
                          flush=True)
            out["rounds"].append(result)
    return out


def ratios(data: dict[str, Any] | None, kind: str, name: str,
           over: str = HAPROXY) -> list[float]:
    """Per round, ``name``'s MB/s over ``over``'s (haproxy's) in workload ``kind``."""
    return [r[kind][name]["mb_s"] / r[kind][over]["mb_s"]
            for r in (data or {}).get("rounds") or []
            if name in r.get(kind, {}) and over in r[kind]]


def empty_consumer_rounds(data: dict[str, Any] | None) -> int:
    """Rounds that ran a consumer of an empty topic (runs saved before it: none)."""
    return sum(EMPTY in r for r in (data or {}).get("rounds") or [])


def consume_net_ratios(data: dict[str, Any] | None, name: str = "kproxy",
                       over: str = HAPROXY) -> list[float]:
    """Per round, ``name``'s CPU for consume 1 KB less its CPU for a consumer with
    nothing to read, over ``over``'s the same."""
    out = []
    for r in (data or {}).get("rounds") or []:
        if EMPTY not in r or name not in r[EMPTY] or over not in r[EMPTY]:
            continue  # older runs: no empty consumer
        ours = r["consume"][name]["cpu_s"] - r[EMPTY][name]["cpu_s"]
        theirs = r["consume"][over]["cpu_s"] - r[EMPTY][over]["cpu_s"]
        if theirs > 0:
            out.append(ours / theirs)
    return out


def _per_consumer(data: dict[str, Any]) -> list[str]:
    """What a consumer with nothing to read cost each relay, and consume's CPU per GB
    with that taken off."""
    rounds = [r for r in data["rounds"] if EMPTY in r]
    if not rounds:
        return []
    gb = data["counts"]["consume"] * WORKLOADS["consume"][1] / 1e9
    fixed, net = [], []
    for name in PATHS:
        pairs = [(r["consume"][name]["cpu_s"], r[EMPTY][name]["cpu_s"]) for r in rounds
                 if name in r[EMPTY] and name in r.get("consume", {})]
        if pairs:
            fixed.append(f"{name} {statistics.median(e for _, e in pairs) * 1000:.0f} ms")
            net.append(f"{name} {statistics.median(c - e for c, e in pairs) / gb:.2f}")
    lines = ["", "A consumer of an empty topic, the relay's CPU over it, median: "
             + ", ".join(fixed) + ". Consume 1 KB's CPU per GB with that taken off, "
             "median: " + ", ".join(net) + "."]
    if ratios_ := consume_net_ratios(data):
        lines[-1] += (" kproxy / haproxy so, per round: " + round_summary(ratios_) + ".")
    return lines


@measured_section(HEADING)
def section(data: dict[str, Any]) -> list[str]:
    rounds, counts = data["rounds"], data["counts"]
    lines = ["| workload | relay | MB/s, median | / haproxy, per round: median (quartiles; "
             "lowest to highest) | CPU s per GB, median | its broker's CPU s per GB, "
             "median |", "|---|---|---|---|---|---|"]
    for kind, (label, size, _) in WORKLOADS.items():
        gb = counts[kind] * size / 1e9
        for name in PATHS:
            runs = [r[kind][name] for r in rounds if name in r.get(kind, {})]
            if not runs:
                continue
            ratio = round_summary(ratios(data, kind, name)) if name != HAPROXY else "1"
            behind = [r["broker_cpu_s"] for r in runs if "broker_cpu_s" in r]  # older runs: none
            lines.append(f"| {label} | {name} | "
                         f"{statistics.median(r['mb_s'] for r in runs):.1f} | {ratio} | "
                         f"{statistics.median(r['cpu_s'] for r in runs) / gb:.2f} | "
                         + (f"{statistics.median(behind) / gb:.2f} |" if behind else "- |"))
    lines += _per_consumer(data)
    if wakes := host_wakes.describe(data.get("wakes")):
        lines += ["", wakes]
    if pages := host_wakes.describe_pages(data.get("pages")):
        lines += ["", pages]
    subscribed = [f"{label} {round_summary(r)}" for kind, (label, _, _) in WORKLOADS.items()
                  if (r := ratios(data, kind, "kproxy", UNSUBSCRIBED))]
    if subscribed:
        lines += ["", "What kproxy's default subscription (all metrics, a push a minute) "
                  "costs its clients, as kproxy's MB/s over kproxy's with no metrics "
                  "subscribed, per round: " + "; ".join(subscribed) + "."]
    lines += ["", f"{len(rounds)} round(s), each on freshly started brokers: "
              f"{counts['produce_1k']:,} messages of 1 KB and {counts['produce_100b']:,} of "
              "100 B produced as in the main section, then the 1 KB ones read back, through "
              "each relay in a shuffled order for each workload. kproxy `--workers 1` at its "
              "default settings (and once more with a `[[telemetry.subscriptions]]` asking "
              "for no metrics), haproxy in TCP mode (and once more with `option "
              "splice-request` and `option splice-response`: it then moves bytes socket "
              "to pipe to socket, as kproxy moves a large frame's rest), the floor relay "
              "`floor_relays.py trio-splice`; each in front of a broker of its own. CPU: "
              "the relay's user and system time over its workload (read as the header says), "
              "and its broker's: the "
              "broker shares the machine's cores and sets the pace of produce, and what it "
              "spends on the same bytes depends on the relay in front of it (a spliced "
              "batch costs it more; docs/benchmarks.md, \"Where the time goes\"). The "
              "Targets table shows "
              "these ratios beside the judged throughput rows, unjudged. "
              "`.venv/bin/python tests/bench/run_bench.py --only throughput-pair` measures "
              "this section alone.", ""]
    return lines
