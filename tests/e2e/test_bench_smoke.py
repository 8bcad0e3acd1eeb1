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
    for section in ("## Throughput", "## Latency at 1,000 requests/s", "## Proxy cost",
                    "## Telemetry termination", "## Rebootstrap", "## Scaling"):
        assert section in text
    results = json.loads(js.read_text())
    assert {"direct", "kproxy", "tansu proxy", "haproxy (tcp)"} <= set(results)
    for path in ("direct", "kproxy", "tansu proxy", "haproxy (tcp)"):
        assert all(r["failures"] == 0 for r in results[path]["produce_1k"])
        assert all(r["complete"] for r in results[path]["consume"])
    assert results["telemetry"]["pushes_s"] > 0 and results["telemetry"]["refused"] == 0
    swapped = results["rebootstrap"]["clients"]["confluent-kafka"]
    assert swapped["failed"] == 0 and swapped["lost"] == 0 and None not in swapped["stalls_s"]
