"""`make bench-pipeline`: the fleet job at 1,000,000 and 10,000,000 data points, in
``local[*]`` and on a standalone cluster of one and of two workers, and a re-run.

    python tests/bench/pipeline_bench.py [--base /tmp/kproxy-bench-pipeline]
        [--write docs/benchmarks-pipeline.md] [--no-cluster]

Each figure is one run of ``kproxy-fleet`` as a user starts it (a fresh JVM, a fresh
output folder unless it is a re-run), timed from start to exit. The archives are made
by generate_archive.py (10 pushes of 10 points per instance, over 10 hours).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.spark_standalone import Standalone, spark_env

BIN = Path(sys.executable).parent
SIZES = {"1M": 10_000, "10M": 100_000}  # instances; 100 points each
EXECUTOR_MEMORY = "2g"


@dataclass
class Row:
    what: str
    master: str
    points: int
    seconds: float
    printed: str

    @property
    def rate(self) -> float:
        return self.points / self.seconds


def fleet(archive: Path, out: Path, master: str, env: dict[str, str], *conf: str) -> Row:
    args = [str(BIN / "kproxy-fleet"), str(archive), "--out", str(out), "--master", master]
    for c in conf:
        args += ["--conf", c]
    started = time.monotonic()
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=3600,
                          check=False)
    seconds = time.monotonic() - started
    if proc.returncode:
        raise SystemExit(f"{' '.join(args)} failed:\n{proc.stderr[-4000:]}")
    last = proc.stdout.strip().splitlines()[-1]
    print(f"  {seconds:7.1f} s  {master}  {archive.name}: {last}", flush=True)
    return Row("", master, 0, seconds, last)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", default="/tmp/kproxy-bench-pipeline")
    parser.add_argument("--write", default="", help="write the results table here")
    parser.add_argument("--no-cluster", action="store_true")
    args = parser.parse_args()
    base = Path(args.base)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    archives, points = {}, {}
    for size, instances in SIZES.items():
        archives[size] = base / f"archive-{size}"
        started = time.monotonic()
        subprocess.run([sys.executable, str(Path(__file__).parent / "generate_archive.py"),
                        str(archives[size]), "--instances", str(instances)], check=True)
        points[size] = instances * 100
        print(f"generated {size} in {time.monotonic() - started:.0f} s", flush=True)
    load_before = os.getloadavg()
    rows: list[Row] = []

    def add(row: Row, what: str, size: str, counted: int | None = None) -> Row:
        row.what, row.points = what, points[size] if counted is None else counted
        rows.append(row)
        return row

    env = spark_env(base / "local")
    one = add(fleet(archives["1M"], base / "out-1M", "local[*]", env), "first run", "1M")
    add(fleet(archives["1M"], base / "out-1M", "local[*]", env),
        "re-run, archive unchanged", "1M")
    hours = sorted((archives["1M"] / "telemetry").glob("date=*/hour=*"))
    shutil.copytree(hours[-1], hours[-1].parent / "hour=23")
    add(fleet(archives["1M"], base / "out-1M", "local[*]", env),
        "re-run, one new hour (100,000 points)", "1M", points["1M"] // 10)
    ten = add(fleet(archives["10M"], base / "out-10M", "local[*]", env), "first run", "10M")
    print(f"local[*]: 10M / 1M wall time = {ten.seconds / one.seconds:.2f}", flush=True)

    if not args.no_cluster:
        cores = os.cpu_count() or 2
        mem = f"spark.executor.memory={EXECUTOR_MEMORY}"
        for workers, per_worker in ((1, cores), (2, cores // 2), (2, cores)):
            label = f"standalone, {workers} worker(s) x {per_worker} cores"
            work = base / f"cluster-{workers}x{per_worker}"
            with Standalone(work, workers=workers, cores=per_worker, memory="3g") as cluster:
                env = spark_env(work)
                for size in ("1M", "10M") if workers == 1 else ("10M",):
                    row = fleet(archives[size], work / f"out-{size}", cluster.url, env, mem)
                    add(row, f"first run, {label}", size)
                    row.master = "spark://"
    load_after = os.getloadavg()

    table = ["| run | master | points | wall time (s) | points/s |", "|---|---|---|---|---|"]
    table += [f"| {r.what} | {r.master} | {r.points:,} | {r.seconds:.1f} | {r.rate:,.0f} |"
              for r in rows]
    summary = (f"\nMachine: {os.cpu_count()} cores; load average before "
               f"{load_before[0]:.1f}, after {load_after[0]:.1f} (other work was running "
               f"if it is above 0). local[*]: 10M points took {ten.seconds / one.seconds:.2f}"
               f" x the wall time of 1M.\n")
    print("\n".join(table) + summary)
    if args.write:
        Path(args.write).write_text("\n".join(table) + "\n" + summary)


if __name__ == "__main__":
    main()
