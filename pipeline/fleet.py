"""`kproxy-fleet`: fleet-wide reports from kproxy telemetry archives, on Spark.

    kproxy-fleet ARCHIVE_DIR [ARCHIVE_DIR ...] --out REPORT_DIR [--master local[*]]
    spark-submit --master spark://HOST:7077 .../kproxy/pipeline/fleet.py ARCHIVE_DIR --out DIR

Reads the JSON lines with explicit schemas, reduces each hour of the archive to a few
rows per client, instance and group, keeps those under ``REPORT_DIR/hourly`` and, on
the next run, reads only hours that are new or whose files changed. The report tables
(Parquet, ``report.md``, ``report.html``) are merged from the kept rows; only they,
a few rows per software version or the top N, ever reach the driver.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from kproxy.pipeline.archive import Hour, flatten_points, list_hours, read_hours, source_id
from kproxy.pipeline.hourly import (
    Tables,
    client_hours,
    instance_hours,
    merge,
    rebalance_hours,
    slowest_rebalance_hours,
)
from kproxy.pipeline.report import write_reports
from kproxy.pipeline.store import State, Store


@dataclass
class Progress:
    """What a run read: hours done now, hours kept from earlier runs, hours gone."""

    done: list[str] = field(default_factory=list)
    kept: int = 0
    removed: list[str] = field(default_factory=list)
    reported: bool = False


def _per_hour(top_n: int) -> dict[str, dict[str, Callable[[DataFrame], DataFrame]]]:
    """Per record kind: the tables kept per hour, each made from that kind's raw rows."""
    return {
        "telemetry": {"instances": instance_hours},
        "connections": {"clients": client_hours},
        "groups": {"rebalances": rebalance_hours,
                   "slow_rebalances": lambda df: slowest_rebalance_hours(df, top_n)},
    }


@dataclass
class Survey:
    """The archives against the kept hours, found without Spark: what a run must do."""

    store: Store
    state: State
    points: bool
    current: dict[str, Hour]
    todo: list[Hour]
    gone: list[str]
    covers: str  # a digest of the hours (and their files) a report from them covers

    def progress(self) -> Progress:
        return Progress([h.key for h in self.todo], len(self.current) - len(self.todo),
                        list(self.gone))

    @property
    def up_to_date(self) -> bool:
        """Nothing to read and the report already made from exactly these hours."""
        return (not self.todo and not self.gone and self.state.report == self.covers
                and (self.store.root.parent / "report.html").exists())

    def tables(self) -> dict[str, list[Path]]:
        """Per record kind, the folders holding its hours."""
        per_hour = _per_hour(self.state.top_n)
        out = {kind: [self.store.path(n) for n in names] for kind, names in per_hour.items()}
        out["telemetry"].append(self.store.root.parent / "tables" / "points")
        return out


def survey(archives: Sequence[str], out: str, top_n: int, points: bool = True) -> Survey:
    """New and changed hours of these archives, and kept hours whose files are gone.
    Hours of archives not named now are left alone."""
    store = Store(out)
    state = store.load(top_n)
    current = {h.key: h for a in archives for h in list_hours(a)}
    sources = {source_id(a) for a in archives}
    todo = [h for k, h in sorted(current.items()) if state.hours.get(k) != h.fingerprint]
    gone = [k for k in state.hours
            if k not in current and k.split("/")[1].removeprefix("source=") in sources]
    covers = hashlib.sha1(json.dumps(
        [top_n, points, sorted((k, h.fingerprint) for k, h in current.items())]).encode()
    ).hexdigest()
    found = Survey(store, state, points, current, todo, gone, covers)
    if not state.hours:  # nothing kept: nothing from an older format may linger either
        for table in (t for ts in found.tables().values() for t in ts):
            if table.exists():
                shutil.rmtree(table)
    return found


def update(spark: SparkSession, found: Survey) -> Progress:
    """Bring ``OUT/hourly`` up to date: new and changed hours are reduced (and, with
    ``points``, flattened into ``tables/points``), vanished ones dropped."""
    store, state, tables = found.store, found.state, found.tables()
    points_table = tables["telemetry"][-1]
    store.forget(state, [h.key for h in found.todo] + found.gone, tables)
    for kind, outputs in _per_hour(state.top_n).items():
        hours = [h for h in found.todo if h.kind == kind]
        if not hours:
            continue
        raw = read_hours(spark, hours, kind)
        if kind == "telemetry":
            # Flatten once: the points are written per hour, then reduced from Parquet.
            raw = flatten_points(raw)
            if found.points:
                store.append(raw, points_table)
                raw = store.read_hours(spark, points_table, _empty_points(spark), hours)
        for name, reduce in outputs.items():
            store.append(reduce(raw), store.path(name))
    state.hours.update({h.key: h.fingerprint for h in found.todo})
    store.save(state)
    return found.progress()


def _empty_points(spark: SparkSession) -> DataFrame:
    return flatten_points(read_hours(spark, [], "telemetry"))


def _empty(spark: SparkSession, top_n: int) -> dict[str, DataFrame]:
    """Each per-hour table with no rows: its schema, and what a table never written holds.
    (Made from the schema alone, so that its plan is an empty scan.)"""
    raw = {kind: read_hours(spark, [], kind) for kind in _per_hour(top_n)}
    raw["telemetry"] = flatten_points(raw["telemetry"])
    return {name: spark.createDataFrame([], reduce(raw[kind]).schema)
            for kind, outputs in _per_hour(top_n).items() for name, reduce in outputs.items()}


def report_tables(spark: SparkSession, store: Store, archives: Sequence[str],
                  top_n: int) -> Tables:
    """The report tables, merged from the kept per-hour rows of these archives."""
    sources = sorted({source_id(a) for a in archives})
    kept = {name: store.read(spark, store.path(name), empty, sources)
            for name, empty in _empty(spark, top_n).items()}
    return merge(kept["clients"], kept["instances"], kept["rebalances"],
                 kept["slow_rebalances"], top_n)


def run(spark: SparkSession, archives: Sequence[str], out: str, top_n: int = 10,
        points: bool = True) -> tuple[Tables | None, Progress]:
    """Update the kept hours, then write the report tables and reports, unless the last
    report was made from exactly these hours (then it is still true: no tables)."""
    found = survey(archives, out, top_n, points)
    if found.up_to_date:
        return None, found.progress()
    progress = update(spark, found)
    tables = report_tables(spark, found.store, archives, top_n)
    # Each table is computed once: written, then its first rows read for the report
    # from the cache (in the table's order).
    cached = Tables(**{name: df.cache() for name, df in vars(tables).items()})
    try:
        for name, df in vars(cached).items():
            df.write.mode("overwrite").parquet(str(Path(out) / "tables" / name))
        write_reports(cached, Path(out))
    finally:
        for df in vars(cached).values():
            df.unpersist()
    found.state.report = found.covers
    found.store.save(found.state)
    progress.reported = True
    return tables, progress


def session(master: str | None, app: str = "kproxy-fleet",
            conf: Sequence[tuple[str, str]] = ()) -> SparkSession:
    """A session on ``master``; with none, spark-submit's (it starts Python with the
    gateway's port set) or else ``local[*]``."""
    builder = SparkSession.builder.appName(app)
    if master or "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = builder.master(master or "local[*]")
    builder = (builder
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "8")
               .config("spark.sql.session.timeZone", "UTC")
               # Partition values (source, date, hour) are read back as the text written.
               .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false"))
    for key, value in conf:
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def quiet(spark: SparkSession) -> SparkSession:
    spark.sparkContext.setLogLevel("WARN")
    return spark


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kproxy-fleet", description=__doc__.splitlines()[0])
    parser.add_argument("archives", nargs="+", help="kproxy --archive folders")
    parser.add_argument("--out", required=True,
                        help="where tables, reports and the per-hour rows are kept")
    parser.add_argument("--master", default=None,
                        help="Spark master (default: spark-submit's, else local[*])")
    parser.add_argument("--top", type=int, default=10, help="slowest instances listed")
    parser.add_argument("--conf", type=_conf, action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting, e.g. spark.executor.memory=2g (repeatable)")
    parser.add_argument("--no-points", action="store_true",
                        help="do not keep the flattened data points (tables/points)")
    args = parser.parse_args(argv)
    missing = [a for a in args.archives if not any(
        (Path(a) / kind).is_dir() for kind in ("telemetry", "connections", "groups"))]
    if missing:
        print(f"kproxy-fleet: error: not a kproxy archive: {', '.join(missing)}",
              file=sys.stderr)
        return 2
    started = time.monotonic()
    points = not args.no_points
    found = survey(args.archives, args.out, args.top, points)
    if found.up_to_date:  # no JVM needed to say so
        progress = found.progress()
    else:
        spark = quiet(session(args.master, conf=args.conf))
        try:
            _, progress = run(spark, args.archives, args.out, args.top, points)
        finally:
            spark.stop()
    wrote = (f"wrote {Path(args.out) / 'report.html'} and Parquet tables" if progress.reported
             else f"{Path(args.out) / 'report.html'} is up to date")
    print(f"kproxy-fleet: {len(progress.done)} hours read, {progress.kept} unchanged, "
          f"{len(progress.removed)} gone; {wrote} in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
