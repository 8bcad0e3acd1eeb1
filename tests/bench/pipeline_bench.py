"""`make bench-pipeline`: the fleet job at 1,000,000 and 10,000,000 data points in
``local[*]``, a re-run, and one worker against two on a standalone cluster.

    python tests/bench/pipeline_bench.py [--base /tmp/kproxy-bench-pipeline]
        [--write docs/benchmarks-pipeline.md] [--only local|cluster] [--rounds 2]

Each figure is one run of ``kproxy-fleet`` as a user starts it (a fresh JVM, a fresh
output folder unless it is a re-run), timed from start to exit. The archives are made
by generate_archive.py (10 pushes of 10 points per instance, over 10 hours).

The cluster comparison runs the 1M archive through ``--master spark://...`` on three
standalone clusters started for each run from the installed pyspark: A, one worker of
1 core; B, two workers of 1 core each (twice A's cores); C, one worker of 2 cores (B's
cores in one worker). The runs go A, B, C, A, B, C, ... (``--rounds`` times), each into a
fresh output folder, with the 1-minute load average read before each. ``--write``
splices each part's section into the file under its own heading and keeps the rest.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.spark_standalone import Standalone, spark_env

BIN = Path(sys.executable).parent
SIZES = {"1M": 10_000, "10M": 100_000}  # instances; 100 points each
# name -> (workers, cores per worker); each executor gets 2 GiB per core.
CLUSTERS = {"A": (1, 1), "B": (2, 1), "C": (1, 2)}
GIB_PER_CORE = 2
LOCAL_HEADING = "## local[*]: 1M and 10M points, re-runs"
CLUSTER_HEADING = "## Standalone cluster: one worker and two (1M points)"


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


def generate(base: Path, size: str) -> tuple[Path, int]:
    archive = base / f"archive-{size}"
    started = time.monotonic()
    subprocess.run([sys.executable, str(Path(__file__).parent / "generate_archive.py"),
                    str(archive), "--instances", str(SIZES[size])], check=True)
    print(f"generated {size} in {time.monotonic() - started:.0f} s", flush=True)
    return archive, SIZES[size] * 100


def local_runs(base: Path, archives: dict[str, Path], points: dict[str, int]) -> str:
    """The local[*] rows; returns the section's text."""
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
    shutil.rmtree(hours[-1].parent / "hour=23")  # the 1M archive again, for the cluster
    ten = add(fleet(archives["10M"], base / "out-10M", "local[*]", env), "first run", "10M")
    print(f"local[*]: 10M / 1M wall time = {ten.seconds / one.seconds:.2f}", flush=True)
    load_after = os.getloadavg()
    table = ["| run | master | points | wall time (s) | points/s |", "|---|---|---|---|---|"]
    table += [f"| {r.what} | {r.master} | {r.points:,} | {r.seconds:.1f} | {r.rate:,.0f} |"
              for r in rows]
    return ("\n".join(table) + f"\n\nMachine: {os.cpu_count()} cores; load average before "
            f"{load_before[0]:.1f}, after {load_after[0]:.1f} (other work was running if it "
            f"is above 0). local[*]: 10M points took {ten.seconds / one.seconds:.2f} x the "
            "wall time of 1M.\n")


@dataclass
class ClusterRun:
    name: str
    round: int
    load: float  # 1-minute load average just before the run
    seconds: float
    points: int
    executors: int

    @property
    def rate(self) -> float:
        return self.points / self.seconds


def cluster_run(base: Path, archive: Path, points: int, name: str, rnd: int) -> ClusterRun:
    """One timed run of ``kproxy-fleet --master spark://`` on a cluster started for it."""
    workers, cores = CLUSTERS[name]
    work = base / f"cluster-{name}-{rnd}"
    shutil.rmtree(work, ignore_errors=True)
    with Standalone(work, workers=workers, cores=cores,
                    memory=f"{GIB_PER_CORE * cores}g") as cluster:
        load = os.getloadavg()[0]
        row = fleet(archive, work / "out", cluster.url, spark_env(work),
                    f"spark.executor.memory={GIB_PER_CORE * cores}g",
                    f"spark.cores.max={workers * cores}")
        # One executor directory per executor the master placed on a worker.
        executors = len(list(work.glob("worker-*/app-*/*")))
    shutil.rmtree(work / "out", ignore_errors=True)
    return ClusterRun(name, rnd, load, row.seconds, points, executors)


def ratios(runs: list[ClusterRun], top: str, bottom: str) -> list[float]:
    """points/s of ``top`` over points/s of ``bottom``, within each round."""
    by = {(r.name, r.round): r for r in runs}
    return [by[top, n].rate / by[bottom, n].rate for n in sorted({r.round for r in runs})
            if (top, n) in by and (bottom, n) in by]


def cluster_runs(base: Path, archive: Path, points: int, rounds: int) -> str:
    """A, B, C alternating, ``rounds`` times; returns the section's text."""
    runs: list[ClusterRun] = []
    for rnd in range(1, rounds + 1):
        for name in CLUSTERS:
            run = cluster_run(base, archive, points, name, rnd)
            runs.append(run)
            print(f"  {name} round {rnd}: load {run.load:.2f}, {run.seconds:.1f} s, "
                  f"{run.rate:,.0f} points/s, {run.executors} executor(s)", flush=True)
    describe = {"A": "1 worker x 1 core", "B": "2 workers x 1 core", "C": "1 worker x 2 cores"}
    table = ["| config | round | load avg (1 min) before | wall time (s) | points/s "
             "| executors |", "|---|---|---|---|---|---|"]
    table += [f"| {r.name}: {describe[r.name]} | {r.round} | {r.load:.2f} | {r.seconds:.1f} "
              f"| {r.rate:,.0f} | {r.executors} |" for r in runs]
    table += ["", "| config | median wall time (s) | median points/s |", "|---|---|---|"]
    for name in CLUSTERS:
        mine = [r for r in runs if r.name == name]
        table.append(f"| {name}: {describe[name]} | "
                     f"{statistics.median(r.seconds for r in mine):.1f} | "
                     f"{statistics.median(r.rate for r in mine):,.0f} |")
    ba, cb = ratios(runs, "B", "A"), ratios(runs, "C", "B")
    text = "\n".join(table) + (
        f"\n\n- B/A (points/s, twice the cores), per round: "
        f"{', '.join(f'{x:.2f}' for x in ba)}\n"
        f"- C/B (points/s, one 2-core worker over two 1-core workers), per round: "
        f"{', '.join(f'{x:.2f}' for x in cb)}\n"
        f"\nMachine: {os.cpu_count()} cores; the driver runs beside the workers on the same "
        f"cores. Executor memory {GIB_PER_CORE} GiB per core; `spark.cores.max` = the "
        "cluster's cores.\n")
    print(text, flush=True)
    return text


def splice(path: Path, heading: str, body: str) -> None:
    """Put ``body`` under ``heading`` in ``path``: in place of that section if it is
    there (up to the next ``## `` heading), else at the end; the rest is kept."""
    doc = path.read_text() if path.exists() else ""
    section = f"{heading}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(doc):
        doc = pattern.sub(lambda _: section + "\n", doc, count=1).rstrip() + "\n"
    else:
        doc = doc.rstrip() + "\n\n" + section
    path.write_text(doc)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", default="/tmp/kproxy-bench-pipeline")
    parser.add_argument("--write", default="", help="splice the results into this file")
    parser.add_argument("--only", choices=("local", "cluster"), default="",
                        help="only the local[*] runs, or only the cluster comparison")
    parser.add_argument("--rounds", type=int, default=2,
                        help="times each cluster configuration runs (alternating)")
    args = parser.parse_args()
    base = Path(args.base)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    sizes = ("1M",) if args.only == "cluster" else tuple(SIZES)
    archives, points = {}, {}
    for size in sizes:
        archives[size], points[size] = generate(base, size)
    if args.only != "cluster":
        text = local_runs(base, archives, points)
        print(text, flush=True)
        if args.write:
            splice(Path(args.write), LOCAL_HEADING, text)
    if args.only != "local":
        text = cluster_runs(base, archives["1M"], points["1M"], args.rounds)
        if args.write:
            splice(Path(args.write), CLUSTER_HEADING, text)


if __name__ == "__main__":
    main()
