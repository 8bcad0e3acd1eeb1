"""`kproxy-fleet`: fleet-wide reports from kproxy telemetry archives, on Spark.

    kproxy-fleet ARCHIVE_DIR [ARCHIVE_DIR ...] --out REPORT_DIR [--master local[*]]
    spark-submit --master yarn .../kproxy/pipeline/fleet.py ARCHIVE_DIR --out REPORT_DIR

Reads the JSON lines with explicit schemas, flattens OTLP metrics into one row per
data point, and writes Parquet tables plus ``report.md`` and ``report.html``. Only
aggregated tables (a few rows per software version or instance) ever reach the
driver; raw data stays distributed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from kproxy.pipeline.report import write_reports
from kproxy.pipeline.schemas import CONNECTION, GROUP_REBALANCE, TELEMETRY_LINE

# The per-instance latency figures the report is built around (librdkafka and Java names).
LATENCY_METRICS = {
    "produce_request_latency_ms": "org.apache.kafka.producer.request.latency.avg",
    "record_queue_time_ms": "org.apache.kafka.producer.record.queue.time.avg",
    "fetch_latency_ms": "org.apache.kafka.consumer.fetch.manager.fetch.latency.avg",
    "rebalance_latency_ms": "org.apache.kafka.consumer.coordinator.rebalance.latency.avg",
    "commit_latency_ms": "org.apache.kafka.consumer.coordinator.commit.latency.avg",
}
RESOURCE_KEYS = {
    "instance_id": "client.instance.id", "client_id": "client.id",
    "software_name": "client.software.name", "software_version": "client.software.version",
    "source_address": "client.source.address", "proxy": "kproxy.host",
}


@dataclass
class Tables:
    points: DataFrame
    client_inventory: DataFrame
    rebootstrap_readiness: DataFrame
    instance_latency: DataFrame
    software_latency: DataFrame
    client_throughput: DataFrame
    slowest_instances: DataFrame
    group_rebalances: DataFrame
    slowest_rebalances: DataFrame


def _kv_map(attrs: Column) -> Column:
    """OTLP attributes as a map of strings (ints and doubles rendered as text)."""
    return F.map_from_entries(F.transform(attrs, lambda kv: F.struct(
        kv["key"].alias("key"),
        F.coalesce(kv["value"]["stringValue"], kv["value"]["intValue"],
                   kv["value"]["doubleValue"].cast("string"),
                   kv["value"]["boolValue"].cast("string")).alias("value"))))


def read_points(spark: SparkSession, archives: Sequence[str]) -> DataFrame:
    """One row per metric data point, with the client it came from."""
    lines = _read(spark, archives, "telemetry", TELEMETRY_LINE)
    rm = lines.select(F.explode("resourceMetrics").alias("rm"))
    rm = rm.select(_kv_map(F.col("rm.resource.attributes")).alias("res"),
                   F.explode("rm.scopeMetrics").alias("sm"))
    metric = rm.select("res", F.explode("sm.metrics").alias("m"))

    def numbers(kind: str) -> DataFrame:
        rows = metric.where(F.col(f"m.{kind}").isNotNull()).select(
            "res", F.col("m.name").alias("metric"), F.lit(kind).alias("kind"),
            F.explode(f"m.{kind}.dataPoints").alias("p"))
        return rows.select("res", "metric", "kind", F.col("p.attributes").alias("attrs"),
                           F.col("p.timeUnixNano").alias("t"),
                           F.coalesce(F.col("p.asDouble"),
                                      F.col("p.asInt").cast("double")).alias("value"))

    hist = metric.where(F.col("m.histogram").isNotNull()).select(
        "res", F.col("m.name").alias("metric"), F.lit("histogram").alias("kind"),
        F.explode("m.histogram.dataPoints").alias("p"))
    hist = hist.select("res", "metric", "kind", F.col("p.attributes").alias("attrs"),
                       F.col("p.timeUnixNano").alias("t"),
                       (F.col("p.sum") / F.col("p.count").cast("double")).alias("value"))
    points = numbers("gauge").unionByName(numbers("sum")).unionByName(hist)
    return points.select(
        *[F.col("res")[k].alias(col) for col, k in RESOURCE_KEYS.items()],
        "metric", "kind", "value",
        (F.col("t").cast("double") / 1e9).cast("timestamp").alias("time"),
        _kv_map(F.col("attrs")).alias("attributes"),
    )


def read_connections(spark: SparkSession, archives: Sequence[str]) -> DataFrame:
    return _read(spark, archives, "connections", CONNECTION)


def read_group_rebalances(spark: SparkSession, archives: Sequence[str]) -> DataFrame:
    return _read(spark, archives, "groups", GROUP_REBALANCE)


def group_tables(rebalances: DataFrame, top_n: int) -> tuple[DataFrame, DataFrame]:
    """Per group: how often it rebalanced (overall and in its worst hour: storms), how
    long rebalances took, its size; and the slowest single rebalances."""
    hourly = rebalances.withColumn("hour", F.floor(F.col("ts") / 3600)).groupBy(
        "group", "hour").agg(F.count(F.lit(1)).alias("n")).groupBy("group").agg(
        F.max("n").alias("max_per_hour"))
    per_group = rebalances.groupBy("group").agg(
        F.count(F.lit(1)).alias("rebalances"),
        F.avg("duration_s").alias("avg_seconds"),
        F.max("duration_s").alias("max_seconds"),
        F.max("generation").alias("last_generation"),
        F.max("members_after").alias("max_members"),
        F.concat_ws(", ", F.sort_array(F.collect_set("reason"))).alias("reasons"),
    ).join(hourly, "group").orderBy(F.desc("max_per_hour"), F.desc("rebalances"), "group")
    rank = Window.orderBy(F.desc("duration_s"), "group", "generation")
    slowest = rebalances.withColumn("rank", F.row_number().over(rank)).where(
        F.col("rank") <= top_n)
    return per_group, slowest


def _read(spark: SparkSession, archives: Sequence[str], kind: str,
          schema: StructType) -> DataFrame:
    paths = [str(Path(a) / kind) for a in archives if (Path(a) / kind).is_dir()]
    if not paths:
        return spark.createDataFrame([], schema)
    # Files still being written are hidden (.part-*.tmp), which Spark skips.
    return spark.read.schema(schema).option("recursiveFileLookup", "true").json(paths)


def _software(df: DataFrame, name: str, version: str) -> DataFrame:
    return df.withColumn("software_name", F.coalesce(F.col(name), F.lit("(unknown)"))) \
             .withColumn("software_version", F.coalesce(F.col(version), F.lit("(unknown)")))


def build(points: DataFrame, connections: DataFrame, top_n: int = 10,
          rebalances: DataFrame | None = None) -> Tables:
    conns = _software(connections, "client_software_name", "client_software_version")
    # A client: one process, as the proxy sees it (source address and client id).
    conns = conns.withColumn("client", F.concat_ws("/", "source_address", "client_id"))

    inventory_conns = conns.groupBy("software_name", "software_version").agg(
        F.countDistinct("client").alias("clients"),
        F.count(F.lit(1)).alias("connections"),
        F.sum(F.col("telemetry").cast("int")).alias("connections_with_telemetry"))
    inventory_tel = points.groupBy("software_name", "software_version").agg(
        F.countDistinct("instance_id").alias("telemetry_instances"))
    client_inventory = inventory_conns.join(inventory_tel, ["software_name", "software_version"],
                                            "full_outer").na.fill(0).orderBy(
        F.desc("clients"), "software_name", "software_version")

    # A client can rebootstrap if any of its connections spoke Metadata v13+.
    per_client = conns.groupBy("software_name", "software_version", "client").agg(
        F.max("metadata_max_version").alias("metadata_max_version"))
    rebootstrap_readiness = per_client.groupBy("software_name", "software_version").agg(
        F.count(F.lit(1)).alias("clients"),
        F.sum((F.col("metadata_max_version") >= 13).cast("int")).alias("ready"),
        F.sum((F.col("metadata_max_version") < 13).cast("int")).alias("not_ready"),
        F.sum(F.col("metadata_max_version").isNull().cast("int")).alias("unknown"),
        F.max("metadata_max_version").alias("max_metadata_version"),
    ).withColumn("ready_ratio", F.col("ready") / F.col("clients")).orderBy(
        "software_name", "software_version")

    wanted = points.where(F.col("metric").isin(list(LATENCY_METRICS.values())))
    names = F.create_map(*[x for col, metric in LATENCY_METRICS.items()
                           for x in (F.lit(metric), F.lit(col))])
    instance_latency = wanted.withColumn("figure", names[F.col("metric")]).groupBy(
        "instance_id", "client_id", "software_name", "software_version", "source_address",
    ).pivot("figure", list(LATENCY_METRICS)).agg(F.avg("value"))

    software_latency = instance_latency.groupBy("software_name", "software_version").agg(
        F.countDistinct("instance_id").alias("instances"),
        *[agg for col in LATENCY_METRICS for agg in (
            F.avg(col).alias(f"{col}_avg"),
            F.percentile_approx(col, 0.95).alias(f"{col}_p95"))],
    ).orderBy("software_name", "software_version")

    seconds = F.greatest(F.col("ts") - F.col("opened"), F.lit(0.001))
    client_throughput = conns.groupBy("software_name", "software_version", "client_id",
                                      "source_address").agg(
        F.sum("bytes_in").alias("bytes_in"), F.sum("bytes_out").alias("bytes_out"),
        F.max(seconds).alias("seconds"),
    ).withColumn("mb_per_s", (F.col("bytes_in") + F.col("bytes_out")) / F.col("seconds") / 1e6) \
     .orderBy(F.desc("mb_per_s"))

    rank = Window.orderBy(F.desc_nulls_last("produce_request_latency_ms"),
                          F.desc_nulls_last("fetch_latency_ms"))
    slowest_instances = instance_latency.where(
        F.col("produce_request_latency_ms").isNotNull() | F.col("fetch_latency_ms").isNotNull()
    ).withColumn("rank", F.row_number().over(rank)).where(F.col("rank") <= top_n)

    if rebalances is None:
        rebalances = points.sparkSession.createDataFrame([], GROUP_REBALANCE)
    group_rebalances, slowest_rebalances = group_tables(rebalances, top_n)
    return Tables(points, client_inventory, rebootstrap_readiness, instance_latency,
                  software_latency, client_throughput, slowest_instances, group_rebalances,
                  slowest_rebalances)


def run(spark: SparkSession, archives: Sequence[str], out: str, top_n: int = 10) -> Tables:
    # Both inputs feed several tables: parse the JSON once.
    points = read_points(spark, archives).cache()
    connections = read_connections(spark, archives).cache()
    tables = build(points, connections, top_n, read_group_rebalances(spark, archives))
    target = Path(out)
    for name, df in vars(tables).items():
        df.write.mode("overwrite").parquet(str(target / "tables" / name))
    write_reports(tables, target)
    return tables


def session(master: str, app: str = "kproxy-fleet") -> SparkSession:
    return (SparkSession.builder.master(master).appName(app)
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "8")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate())


def quiet(spark: SparkSession) -> SparkSession:
    spark.sparkContext.setLogLevel("WARN")
    return spark


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kproxy-fleet", description=__doc__.splitlines()[0])
    parser.add_argument("archives", nargs="+", help="kproxy --archive folders")
    parser.add_argument("--out", required=True, help="where tables and reports are written")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument("--top", type=int, default=10, help="slowest instances listed")
    args = parser.parse_args(argv)
    missing = [a for a in args.archives if not (Path(a) / "telemetry").is_dir()
               and not (Path(a) / "connections").is_dir()]
    if missing:
        print(f"kproxy-fleet: error: not a kproxy archive: {', '.join(missing)}",
              file=sys.stderr)
        return 2
    started = time.monotonic()
    spark = quiet(session(args.master))
    try:
        run(spark, args.archives, args.out, args.top)
    finally:
        spark.stop()
    print(f"kproxy-fleet: wrote {Path(args.out) / 'report.html'} and Parquet tables in "
          f"{time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
