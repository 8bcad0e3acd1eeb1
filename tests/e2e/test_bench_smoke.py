"""The small version of `make bench`: every path and workload runs, and the report is
written with every section. It measures nothing worth comparing (tiny workloads on a
busy machine); the numbers come from `make bench`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.broker


def test_bench_smoke(tmp_path: Path) -> None:
    out, js = tmp_path / "benchmarks.md", tmp_path / "benchmarks.json"
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "bench" / "run_bench.py"),
                           "--smoke", "--out", str(out), "--json", str(js)],
                          capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "BENCH_TMP": str(tmp_path),
                               "PATH": os.environ.get("PATH", "") + ":/usr/sbin"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    text = out.read_text()
    # A smoke run (make test) leaves the machine's free-page reporting as it is.
    assert "- memory: free-page reporting not touched (smoke run)\n" in text
    # CPU is read from each process's CPU-time clock (Linux), not in 10 ms ticks.
    assert "- CPU read as: each process's CPU-time clock, to the nanosecond\n" in text
    for section in ("## Throughput", "## Latency at 1,000 requests/s", "## Proxy cost",
                    "## Telemetry termination", "## kproxy workers: --workers 1 against "
                    "--workers 2", "## Rebootstrap", "## Ratios to compare across machines",
                    "## Targets", "## Scaling",
                    "## Relay against the last commit before the sans-IO core",
                    "## Admission across workers", "## What a new connection costs",
                    "## What the event loop costs a small request",
                    "## Telemetry pushes and the small-produce p99",
                    "## The p99 added over haproxy, the two proxies alone",
                    "## Throughput, the relays alone",
                    "## Hostile telemetry pushes and a producer's p99",
                    "## /metrics of a large fleet at 1 and 2 workers"):
        assert section in text
    # Issues 19's, 29's and 30's targets, and 14's and 22's p99 under load, each with a
    # verdict (a smoke run's figures decide nothing, but every one is measured: no "-").
    rows = text[text.index("## Targets"):].split("\n\n")[1].splitlines()[2:]
    wanted = [row for label in ("produce 1 KB", "produce 100 B", "consume 1 KB") for row in (
        f"throughput, {label}: kproxy / haproxy",
        f"throughput, {label}, the relays alone (1 round): kproxy / haproxy",
        f"throughput, {label}, the relays alone (1 round): kproxy, no metrics subscribed / "
        "haproxy",
        f"throughput, {label}, the relays alone (1 round): haproxy (tcp, splice) / haproxy",
        f"throughput, {label}, the relays alone (1 round): floor relay (trio, splice) / "
        "haproxy")]
    wanted += ["p99 added at 1,000/s, small produce: kproxy - haproxy",
               "p99 added at 1,000/s, small produce, the two proxies alone (1 round): "
               "kproxy - haproxy",
               "p99 added at 1,000/s, Metadata: kproxy - haproxy",
               "p99 added at 1,000/s, Metadata, the two proxies alone (1 round): "
               "kproxy - haproxy",
               "p99 added at 1,000/s, small produce, by pushes every 100 ms instead of the "
               "default: kproxy - kproxy",
               "CPU s per GB relayed (produce 1 KB): kproxy / haproxy",
               "CPU s per GB relayed (consume 1 KB): kproxy / haproxy",
               "CPU s per GB relayed (consume 1 KB), the relays alone (1 round), less what "
               "a consumer of an empty topic cost: kproxy / haproxy",
               "proxy memory per idle connection pair (KB)",
               "telemetry pushes per CPU-second: this tree / d1cc828",
               "proxy CPU per single-message produce at 1,000/s (ms)",
               "proxy CPU per Metadata round trip at 1,000/s (ms)",
               "longest loop slice of a /metrics scrape, CPU (ms)",
               "producer p99 during back-to-back /metrics scrapes of",
               "producer p99 beside a stream of hostile telemetry pushes / without",
               "/metrics scrape of 5,000 client series: 2 workers / 1 worker"]
    results = json.loads(js.read_text())
    # Where CPU is read in 10 ms ticks, a smoke run's relay may take less than one: no
    # ratio then.
    def ticked(key: str) -> bool:
        return all(r["proxy_cpu_s"] > 0 for path in ("kproxy", "haproxy (tcp)")
                   for r in results[path][key])

    per_gb = {"CPU s per GB relayed (produce 1 KB)": "produce_1k",
              "CPU s per GB relayed (consume 1 KB)": "consume"}
    assert len(rows) == len(wanted), rows
    for row, target in zip(rows, wanted, strict=True):
        assert row.startswith(f"| {target}"), (row, target)
        key = next((k for label, k in per_gb.items() if target.startswith(label)), None)
        if key is None or ticked(key):
            assert row.rstrip(" |").rsplit(" | ", 1)[1] != "-", row  # a verdict
    ratios = text[text.index("## Ratios"):].split("\n\n")[1]
    assert "--workers 2 / --workers 1" in ratios and "this tree / d1cc828" in ratios
    assert {"direct", "kproxy", "tansu proxy", "haproxy (tcp)"} <= set(results)
    for path in ("direct", "kproxy", "tansu proxy", "haproxy (tcp)"):
        assert all(r["failures"] == 0 for r in results[path]["produce_1k"])
        assert all(r["complete"] for r in results[path]["consume"])
    assert results["telemetry"]["pushes_s"] > 0 and results["telemetry"]["refused"] == 0
    # The baseline that ran is the commit named, and each side says what it imported.
    ab = results["telemetry_ab"]
    assert "error" not in ab and ab["baseline_commit"].startswith("d1cc828")
    assert ab["base"][0]["pushes_s"] > 0 and ab["base"][0]["refused"] == 0
    assert "/telemetry-baseline/src/proxy/" in ab["base_import"]
    assert str(ROOT / "proxy") in ab["current_import"]
    relay = results["relay_ab"]
    assert "error" not in relay and relay["baseline_commit"].startswith("d1cc828")
    assert "/relay-baseline/src/proxy/" in relay["base_import"]
    for side in ("current", "base"):
        assert [r["produce_mb_s"] > 0 and r["consume_mb_s"] > 0 for r in relay[side]] == [True]
    # Every floor relay, kproxy and haproxy relayed the round trips (a workload that
    # failed would have ended the run).
    floor = results["floor"]["rounds"]
    assert set(floor) == {"epoll", "trio-express", "trio-lowlevel", "trio-stream", "kproxy",
                          "haproxy"}, floor
    assert all(len(r) == 1 and r[0]["p99_ms"] > 0 for r in floor.values()), floor
    # The three paths of the telemetry row each delivered a p99.
    tp99 = results["telemetry_p99"]
    assert "error" not in tp99 and len(tp99["rounds"]) == 1, tp99
    assert all(r["p99_ms"] > 0 for r in tp99["rounds"][0].values()), tp99
    # The producer delivered everything with and without the hostile pusher, whose every
    # push was refused.
    hostile = results["hostile_push"]
    assert "error" not in hostile and len(hostile["rounds"]) == 1, hostile
    windows = hostile["rounds"][0]
    assert all(w["p99_ms"] > 0 and w["failed"] == 0 for w in windows.values()), hostile
    assert windows["with hostile pushes"]["refused_per_s"] > 0, hostile
    assert all(w["other_answers"] == 0 for w in windows.values()), hostile
    # Both proxies delivered a p99 for both workloads in the pair row's round.
    pair = results["p99_pair"]
    assert "error" not in pair and len(pair["rounds"]) == 1, pair
    assert all(r["p99_ms"] > 0 for kind in pair["rounds"][0].values()
               for r in kind.values()) and len(pair["rounds"][0]) == 2, pair
    # The five relays of the throughput pair each produced every message and read every
    # one back (a consume that fell short would have ended the section with an error).
    tput = results["throughput_pair"]
    assert "error" not in tput and len(tput["rounds"]) == 1, tput
    assert set(tput["rounds"][0]) == {"produce_1k", "produce_100b", "consume",
                                      "consume_empty"}, tput
    for name, kind in tput["rounds"][0].items():
        assert set(kind) == {"kproxy", "kproxy, no metrics subscribed", "haproxy (tcp)",
                             "haproxy (tcp, splice)", "floor relay (trio, splice)"}, tput
        assert all((r["mb_s"] == 0) == (name == "consume_empty") and r["failures"] == 0
                   for r in kind.values()), tput
    # What a wake-up costs this machine, measured before the rounds: CPU per wake-up of
    # a sleeping Python and trio process, at both pauses.
    assert {p: set(w) for p, w in tput["wakes"].items()} == {
        "python": {"0.01", "1.0"}, "trio": {"0.01", "1.0"}}, tput["wakes"]
    assert all(us > 0 for w in tput["wakes"].values() for us in w.values()), tput["wakes"]
    assert set(tput["pages"]) == {"0.0", "1.0"}, tput["pages"]
    assert all(ns > 0 for ns in tput["pages"].values()), tput["pages"]
    workers = results["workers"]["results"]
    for n in ("1", "2"):
        for key in ("produce_1k", "consume"):
            run = workers[n][key][0]
            assert run["mb_s"] > 0 and run["failures"] == 0 and run["complete"], (n, key, run)
    swapped = results["rebootstrap"]["clients"]["confluent-kafka"]
    assert swapped["failed"] == 0 and swapped["lost"] == 0 and None not in swapped["stalls_s"]
