"""The rebootstrap section of `make bench`: blue/green swaps through kproxy, per client.

Runs ``tests/swap_clients/harness.py`` (the same measurement as
``tests/e2e/test_rebootstrap_clients.py``) on two fresh tansu clusters, ``runs`` times,
and reports per client the stalls over all swaps (SIGHUP to the first acknowledged
message on the new cluster), failed, lost and duplicated messages.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from kproxy.embedded_broker import TansuBroker  # noqa: E402
from tests.swap_clients.harness import ALL_CLIENTS, run_swaps  # noqa: E402

HEADING = "## Rebootstrap: blue/green swaps through kproxy, per client"


def measure(work: Path, runs: int, swaps: int, clients: tuple[str, ...] = ALL_CLIENTS
            ) -> dict[str, Any]:
    """Per client: version, Metadata version, every stall, failed, lost, duplicated."""
    out: dict[str, Any] = {"runs": runs, "swaps": swaps, "clients": {}}
    for run in range(runs):
        folder = work / f"rebootstrap-{run}"
        folder.mkdir(parents=True, exist_ok=True)
        blue = TansuBroker(cluster_id="blue", log_path=folder / "blue.log").start()
        green = TansuBroker(cluster_id="green", log_path=folder / "green.log").start()
        try:
            result = run_swaps(blue.bootstrap, green.bootstrap, folder, clients, swaps)
        finally:
            blue.stop()
            green.stop()
        for c, r in result.results.items():
            row = out["clients"].setdefault(c, {
                "version": r.version, "metadata_version": r.metadata_version, "stalls_s": [],
                "failed": 0, "lost": 0, "duplicated": 0, "sent": 0})
            row["stalls_s"] += r.stalls
            row["failed"] += len(r.failed)
            row["lost"] += r.lost
            row["duplicated"] += r.duplicated
            row["sent"] += r.sent
        print(f"rebootstrap run {run + 1}/{runs}: "
              + "; ".join(f"{c} {[None if s is None else round(s, 3) for s in r.stalls]}"
                          for c, r in result.results.items()), flush=True)
    return out


def section(data: dict[str, Any] | None) -> list[str]:
    if not data:
        return []
    lines = [HEADING, "",
             f"{data['runs']} run(s) of {data['swaps']} swaps each: every client streams "
             "(one message every 10 ms, `acks=all`, not idempotent) in its own process "
             "through one kproxy whose upstream is switched between two tansu clusters by "
             "SIGHUP, alternating; both clusters are read back afterwards. Stall: from the "
             "SIGHUP to the first acknowledged message on the new cluster, over every swap. "
             "Details and what each client does with REBOOTSTRAP_REQUIRED: "
             "[rebootstrap.md](rebootstrap.md).", "",
             "| client | version | Metadata | stall median (ms) | max (ms) | failed | lost | "
             "duplicated | messages |", "|---|---|---|---|---|---|---|---|---|"]
    for c, row in data["clients"].items():
        stalls = [s for s in row["stalls_s"] if s is not None]
        missing = len(row["stalls_s"]) - len(stalls)
        med = f"{statistics.median(stalls) * 1000:.0f}" if stalls else "-"
        top = f"{max(stalls) * 1000:.0f}" if stalls and not missing else "-"
        lines.append(f"| {c} | {row['version']} | v{row['metadata_version']} | {med} | {top} | "
                     f"{row['failed']} | {row['lost']} | {row['duplicated']} | "
                     f"{row['sent']:,} |")
    return [*lines, ""]
