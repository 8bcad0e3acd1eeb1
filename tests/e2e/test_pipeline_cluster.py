"""`kproxy-fleet --master spark://...` on a real standalone cluster: a master and one
worker started from the installed pyspark on loopback, over the archive kproxy wrote in
front of tansu for real clients (tests/data/archive). The executors are other JVMs than
the driver's: they read the archive and write the tables by path, as on a cluster with
shared storage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spark_standalone import Standalone, spark_env

ARCHIVE = Path(__file__).parent.parent / "data" / "archive"


# About a minute on an idle machine; three JVMs on two busy cores take several.
@pytest.mark.timeout(600)
def test_fleet_job_on_a_standalone_cluster(tmp_path: Path) -> None:
    out = tmp_path / "report"
    with Standalone(tmp_path / "cluster", workers=1, cores=1, memory="1g") as cluster:
        assert cluster.alive() == 1
        proc = subprocess.run(
            [sys.executable, "-m", "kproxy.pipeline.fleet", str(ARCHIVE), "--out", str(out),
             "--master", cluster.url, "--top", "3", "--conf", "spark.executor.memory=768m",
             "--conf", "spark.cores.max=1"],
            env=spark_env(tmp_path / "cluster"), capture_output=True, text=True,
            timeout=480, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        # The work ran in the worker's executor, not in the driver.
        apps = list((tmp_path / "cluster" / "worker-0").glob("app-*/*/stderr"))
        assert apps and any("Running task" in p.read_text() for p in apps)
    assert "hours read" in proc.stdout

    want: dict[tuple[str, str], int] = {}
    for p in ARCHIVE.glob("connections/**/*.jsonl"):
        for line in p.read_text().splitlines():
            rec = json.loads(line)
            key = (rec["client_software_name"] or "(unknown)",
                   rec["client_software_version"] or "(unknown)")
            want[key] = want.get(key, 0) + 1
    # The report's inventory, as the cluster computed it, against the records by hand.
    section = (out / "report.md").read_text().split("## Client inventory")[1].split("##")[0]
    got = {(cells[0], cells[1]): int(cells[3]) for cells in (
        [c.strip() for c in line.strip("|").split("|")]
        for line in section.splitlines()[4:] if line.startswith("|"))}
    assert got == want
    assert "confluent-kafka-python" in (out / "report.html").read_text()
    assert (out / "tables" / "instance_latency").is_dir()
