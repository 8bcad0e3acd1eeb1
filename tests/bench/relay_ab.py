"""The relay's speed: this tree against a baseline commit, side by side in one run.

A restructuring that should change nothing of the hot path (the sans-IO connection
core, issue 20) is checked here: both proxies run at once in front of one broker, each
one process (``--workers 1`` for each that knows the flag: this tree would otherwise
start one worker per core), and every round measures produce 1 KB throughput, the
proxy's CPU per GB produced, consume 1 KB throughput and Metadata p99 at 1,000
requests/s through each, in a shuffled order. Ratios are taken per round, then their
median and spread: the spread of the ratios is the run's noise, and "within noise"
means the median ratio lies inside it.

How the baseline is exported, run and proven is ``baseline_ab``.
"""

from __future__ import annotations

import statistics
import uuid
from pathlib import Path
from typing import Any

from baseline_ab import side_by_side
from bench_measure import Path_, create_topic, workload
from bench_stats import fmt, measured_section, median_range

# The last commit before the sans-IO connection core (ca55cc3) that runs: its child
# 31e8050 lost proxy/local_answers.py, which its server still imports. The telemetry
# comparison uses it too.
BASELINE = "d1cc828"
HEADING = "## Relay against the last commit before the sans-IO core"
# Per round: (name in the report, higher is better).
FIGURES = {"produce_mb_s": ("produce 1 KB (MB/s)", True),
           "cpu_s_per_gb": ("proxy CPU s per GB produced", False),
           "consume_mb_s": ("consume 1 KB (MB/s)", True),
           "metadata_p99_ms": ("Metadata p99 at 1,000/s (ms)", False)}


def one_round(side: Path_, count: int, meta_s: float) -> dict[str, float]:
    topic = f"relay-ab-{uuid.uuid4().hex[:8]}"
    create_topic(side.bootstrap, topic)
    cpu0 = side.cpu_seconds()
    produced = workload("produce", side.bootstrap, topic=topic, count=count, size=1024)
    cpu = side.cpu_seconds() - cpu0
    consumed = workload("consume", side.bootstrap, topic=topic, count=count)
    meta = workload("metadata_latency", side.bootstrap, rate=1000, seconds=meta_s)
    return {"produce_mb_s": produced["mb_s"], "cpu_s_per_gb": cpu / (count * 1024 / 1e9),
            "consume_mb_s": consumed["mb_s"], "metadata_p99_ms": meta["p99_ms"]}


def measure(work: Path, rounds: int, count: int, baseline: str = BASELINE,
            meta_s: float = 3.0) -> dict[str, Any]:
    """Per side, one ``one_round`` result per round; the proof of what ran."""
    return side_by_side(work, "relay", baseline, rounds,
                        lambda side: one_round(side, count, meta_s),
                        {"count": count, "meta_s": meta_s})


def ratios(data: dict[str, Any], key: str) -> list[float]:
    """This tree over the baseline, per round."""
    return [c[key] / b[key] for c, b in zip(data["current"], data["base"], strict=False)
            if b[key]]


@measured_section(HEADING, "current")
def section(data: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    base = data["baseline_commit"][:7]
    lines += [f"| figure | this tree ({data['current_commit']}) | {base} | ratio, median "
              "(lowest-highest) | within noise |", "|---|---|---|---|---|"]
    for key, (name, _) in FIGURES.items():
        r = ratios(data, key)
        cur = statistics.median(x[key] for x in data["current"])
        old = statistics.median(x[key] for x in data["base"])
        inside = "-" if not r else "yes" if min(r) <= 1.0 <= max(r) else "no"
        lines.append(f"| {name} | {fmt(cur, 2)} | {fmt(old, 2)} | {median_range(r)} "
                     f"| {inside} |")
    lines += ["", f"{len(data['current'])} round(s); each: produce {data.get('count', 0):,} "
              "1 KB messages, read them back, then Metadata at 1,000/s for "
              f"{data.get('meta_s', 3.0):g} s, through each proxy in a shuffled order. "
              "Both ran at once in front of one broker, one process each. *Within "
              "noise*: the ratio 1.0 lies between the lowest and highest per-round ratio. "
              f"The baseline is the tree of `{data['baseline_commit']}`, exported with "
              "`git archive`; each process wrote what it imported:", "",
              f"- this tree: `{data['current_import']}`",
              f"- baseline: `{data['base_import']}`", ""]
    return lines
