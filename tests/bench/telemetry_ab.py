"""Telemetry pushes per CPU-second: this tree against a baseline commit, side by side.

How the baseline is exported, run and proven is ``baseline_ab``; here, each round
sends real librdkafka pushes through each proxy (``bench_measure.telemetry_pushes``).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from baseline_ab import side_by_side
from bench_measure import telemetry_pushes
from bench_stats import fmt

BASELINE = "d1cc828"


def measure(work: Path, rounds: int, seconds: float, instances: int,
            baseline: str = BASELINE) -> dict[str, Any]:
    """Per side, one telemetry_pushes result per round; the proof of what ran."""
    return side_by_side(work, "telemetry", baseline, rounds,
                        lambda side: telemetry_pushes(side.bootstrap, side, seconds,
                                                      instances), {})


def ratios(data: dict[str, Any] | None) -> list[float]:
    """This tree over the baseline, pushes per CPU-second, per round."""
    if not data:
        return []
    return [c["pushes_per_cpu_s"] / b["pushes_per_cpu_s"]
            for c, b in zip(data.get("current", []), data.get("base", []), strict=False)
            if b["pushes_per_cpu_s"]]


def summary(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each field's median over the rounds (refusals: their sum)."""
    if not rounds:
        return {}
    out = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    out["refused"] = sum(r["refused"] for r in rounds)
    return out


def section(data: dict[str, Any] | None, legacy: dict[str, float] | None) -> list[str]:
    lines = ["## Telemetry termination", ""]
    if not data or data.get("error") or not data.get("current"):
        if legacy:  # a run from before the side-by-side comparison
            lines += [f"- kproxy: {legacy['pushes_s']:,.0f} accepted PushTelemetry/s, "
                      f"{legacy['pushes_per_cpu_s']:,.0f} pushes per CPU-second "
                      f"({legacy['refused']:.0f} refused)"]
        if data and data.get("error"):
            lines += [f"- baseline not measured: {data['error']}"]
        return [*lines, ""]
    rows = [("this tree (" + data["current_commit"] + ")", summary(data["current"])),
            (data["baseline_commit"][:7], summary(data["base"]))]
    lines += ["| kproxy | accepted pushes/s | pushes per CPU-second | share of a core | "
              "refused |", "|---|---|---|---|---|"]
    for name, s in rows:
        lines.append(f"| {name} | {s['pushes_s']:,.0f} | {s['pushes_per_cpu_s']:,.0f} | "
                     f"{100 * s['proxy_cpu']:.0f}% | {s['refused']:.0f} |")
    r = ratios(data)
    lines += ["", f"This tree / {data['baseline_commit'][:7]}, pushes per CPU-second, the "
              f"median of {len(r)} paired round(s): **{fmt(statistics.median(r), 2)}**. "
              "Both proxies ran at once with the same flags (one process each, a 100 ms "
              "push interval) and one broker; each round sends PushTelemetry with real "
              "librdkafka zstd payloads from freshly subscribed instances over four "
              "connections, decoded into the live Prometheus exporter; the rounds "
              "alternate which proxy goes first.", "",
              f"The baseline is the tree of commit `{data['baseline_commit']}` "
              "(`git archive`, its id read back with `git get-tar-commit-id`), laid out by "
              "its own pyproject and put first on PYTHONPATH. Each process wrote what it "
              "imported before it started:", "",
              f"- this tree: `{data['current_import']}`",
              f"- baseline: `{data['base_import']}`", ""]
    return lines
