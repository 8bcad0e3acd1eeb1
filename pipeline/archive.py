"""The archive as the fleet job sees it: hour partitions to process, and their rows.

kproxy writes ``ARCHIVE/KIND/date=YYYY-MM-DD/hour=HH/part-*.jsonl`` and only ever adds
files (or removes the oldest when over its cap). So an hour's file names, sizes and
modification times say whether it changed since the last run; an unchanged hour need
not be read again. Listing is done on the driver, from a path every executor sees too.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from kproxy.pipeline.schemas import CONNECTION, GROUP_REBALANCE, TELEMETRY_LINE

KINDS: dict[str, StructType] = {
    "telemetry": TELEMETRY_LINE, "connections": CONNECTION, "groups": GROUP_REBALANCE,
}
# Partition columns of everything kept per hour: which archive, which hour.
HOUR_COLUMNS = ["source", "date", "hour"]
# A bound on the listing, far above any archive kproxy's total-bytes cap allows.
MAX_FILES = 2_000_000

RESOURCE_KEYS = {
    "instance_id": "client.instance.id", "client_id": "client.id",
    "software_name": "client.software.name", "software_version": "client.software.version",
    "source_address": "client.source.address", "proxy": "kproxy.host",
}


@dataclass(frozen=True)
class Hour:
    """One hour partition of one record kind in one archive."""

    source: str
    kind: str
    date: str
    hour: str
    files: tuple[str, ...]
    fingerprint: str

    @property
    def key(self) -> str:
        return f"{self.kind}/source={self.source}/date={self.date}/hour={self.hour}"


def source_id(archive: str) -> str:
    """A stable name for an archive folder; starts with a letter so that Spark reads
    the partition value back as text."""
    return "a" + hashlib.sha1(os.path.abspath(archive).encode()).hexdigest()[:12]


def _part(name: str, prefix: str) -> str | None:
    return name[len(prefix):] if name.startswith(prefix) else None


def list_hours(archive: str) -> list[Hour]:
    """Every hour partition of every kind, with a fingerprint of its files. Hidden files
    (a part still being written is ``.part-*.tmp``) are not part of an hour yet."""
    hours: list[Hour] = []
    seen = 0
    for kind in KINDS:
        base = Path(archive) / kind
        if not base.is_dir():
            continue
        for date_dir in sorted(base.iterdir()):
            date = _part(date_dir.name, "date=")
            if date is None or not date_dir.is_dir():
                continue
            for hour_dir in sorted(date_dir.iterdir()):
                hour = _part(hour_dir.name, "hour=")
                if hour is None or not hour_dir.is_dir():
                    continue
                entries = sorted((e for e in os.scandir(hour_dir)
                                  if e.is_file() and not e.name.startswith((".", "_"))),
                                 key=lambda e: e.name)
                seen += len(entries)
                if seen > MAX_FILES:
                    raise RuntimeError(f"{archive}: more than {MAX_FILES} files")
                if not entries:
                    continue
                digest = hashlib.sha1()
                for e in entries:
                    st = e.stat()
                    digest.update(f"{e.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
                hours.append(Hour(source_id(archive), kind, date, hour,
                                  tuple(e.path for e in entries), digest.hexdigest()))
    return hours


def read_hours(spark: SparkSession, hours: Sequence[Hour], kind: str) -> DataFrame:
    """The raw records of these hours, each row tagged with its source, date and hour.
    One scan per archive: the date and hour come from each row's file path."""
    schema = KINDS[kind]
    by_source: dict[str, list[str]] = {}
    for h in hours:
        if h.kind == kind:
            by_source.setdefault(h.source, []).extend(h.files)
    if not by_source:
        empty = spark.createDataFrame([], schema)
        return empty.select("*", *[F.lit("").alias(c) for c in HOUR_COLUMNS])
    path = F.col("_metadata.file_path")
    parts = [spark.read.schema(schema).json(files).select(
        *schema.fieldNames(), F.lit(source).alias("source"),
        F.regexp_extract(path, r"/date=([^/]+)/", 1).alias("date"),
        F.regexp_extract(path, r"/hour=([^/]+)/", 1).alias("hour"))
        for source, files in sorted(by_source.items())]
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def _kv_map(attrs: Column) -> Column:
    """OTLP attributes as a map of strings (ints and doubles rendered as text)."""
    return F.map_from_entries(F.transform(attrs, lambda kv: F.struct(
        kv["key"].alias("key"),
        F.coalesce(kv["value"]["stringValue"], kv["value"]["intValue"],
                   kv["value"]["doubleValue"].cast("string"),
                   kv["value"]["boolValue"].cast("string")).alias("value"))))


def flatten_points(lines: DataFrame) -> DataFrame:
    """One row per metric data point, with the client it came from (OTLP JSON lines in)."""
    rm = lines.select(*HOUR_COLUMNS, F.explode("resourceMetrics").alias("rm"))
    rm = rm.select(*HOUR_COLUMNS, _kv_map(F.col("rm.resource.attributes")).alias("res"),
                   F.explode("rm.scopeMetrics").alias("sm"))
    metric = rm.select(*HOUR_COLUMNS, "res", F.explode("sm.metrics").alias("m"))

    def numbers(kind: str) -> DataFrame:
        rows = metric.where(F.col(f"m.{kind}").isNotNull()).select(
            *HOUR_COLUMNS, "res", F.col("m.name").alias("metric"), F.lit(kind).alias("kind"),
            F.explode(f"m.{kind}.dataPoints").alias("p"))
        return rows.select(*HOUR_COLUMNS, "res", "metric", "kind",
                           F.col("p.attributes").alias("attrs"),
                           F.col("p.timeUnixNano").alias("t"),
                           F.coalesce(F.col("p.asDouble"),
                                      F.col("p.asInt").cast("double")).alias("value"))

    hist = metric.where(F.col("m.histogram").isNotNull()).select(
        *HOUR_COLUMNS, "res", F.col("m.name").alias("metric"),
        F.lit("histogram").alias("kind"), F.explode("m.histogram.dataPoints").alias("p"))
    hist = hist.select(*HOUR_COLUMNS, "res", "metric", "kind",
                       F.col("p.attributes").alias("attrs"),
                       F.col("p.timeUnixNano").alias("t"),
                       (F.col("p.sum") / F.col("p.count").cast("double")).alias("value"))
    points = numbers("gauge").unionByName(numbers("sum")).unionByName(hist)
    return points.select(
        *[F.col("res")[k].alias(col) for col, k in RESOURCE_KEYS.items()],
        "metric", "kind", "value",
        (F.col("t").cast("double") / 1e9).cast("timestamp").alias("time"),
        _kv_map(F.col("attrs")).alias("attributes"),
        *HOUR_COLUMNS,
    )
