"""Per-hour aggregates, and the report tables merged from them.

Each hour of the archive is reduced once to a few rows per client, instance or group
(sums, counts, maxima: things that add up across hours), and kept as Parquet. The
report tables are merged from those rows, so a run reads only hours it has not seen.
Every top-N is ranked after the reduction, with ``orderBy`` plus ``limit`` or a window
partitioned by hour: no step gathers the rows of the whole archive in one partition.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from kproxy.pipeline.archive import HOUR_COLUMNS

# The per-instance latency figures the report is built around (librdkafka and Java names).
LATENCY_METRICS = {
    "produce_request_latency_ms": "org.apache.kafka.producer.request.latency.avg",
    "record_queue_time_ms": "org.apache.kafka.producer.record.queue.time.avg",
    "fetch_latency_ms": "org.apache.kafka.consumer.fetch.manager.fetch.latency.avg",
    "rebalance_latency_ms": "org.apache.kafka.consumer.coordinator.rebalance.latency.avg",
    "commit_latency_ms": "org.apache.kafka.consumer.coordinator.commit.latency.avg",
}
SOFTWARE = ["software_name", "software_version"]
INSTANCE = ["instance_id", "client_id", *SOFTWARE, "source_address"]
CLIENT = [*SOFTWARE, "client_id", "source_address"]
REBALANCE = ["ts", "proxy", "group", "generation", "members_before", "members_after",
             "duration_s", "reason", "protocol", "assignor"]


@dataclass
class Tables:
    client_inventory: DataFrame
    rebootstrap_readiness: DataFrame
    instance_latency: DataFrame
    software_latency: DataFrame
    client_throughput: DataFrame
    slowest_instances: DataFrame
    group_rebalances: DataFrame
    slowest_rebalances: DataFrame


# --- one hour (or several) of raw rows -> rows per hour ------------------------------

def instance_hours(points: DataFrame) -> DataFrame:
    """Per hour and instance: how many points, and sum and count of each latency figure
    (an average over many hours is the sum of sums over the sum of counts)."""
    aggs: list[Column] = [F.count(F.lit(1)).alias("points")]
    for col, metric in LATENCY_METRICS.items():
        value = F.when(F.col("metric") == metric, F.col("value"))
        aggs += [F.sum(value).alias(f"{col}_sum"), F.count(value).alias(f"{col}_n")]
    return points.groupBy(*HOUR_COLUMNS, *INSTANCE).agg(*aggs)


def _software(df: DataFrame) -> DataFrame:
    return df.select(
        "*",
        F.coalesce("client_software_name", F.lit("(unknown)")).alias("software_name"),
        F.coalesce("client_software_version", F.lit("(unknown)")).alias("software_version"))


def client_hours(connections: DataFrame) -> DataFrame:
    """Per hour and client (software, client id, source address): its connections."""
    seconds = F.greatest(F.col("ts") - F.col("opened"), F.lit(0.001))
    return _software(connections).groupBy(*HOUR_COLUMNS, *CLIENT).agg(
        F.count(F.lit(1)).alias("connections"),
        F.sum(F.col("telemetry").cast("int")).alias("connections_with_telemetry"),
        F.max("metadata_max_version").alias("metadata_max_version"),
        F.sum("bytes_in").alias("bytes_in"), F.sum("bytes_out").alias("bytes_out"),
        F.max(seconds).alias("seconds"))


def rebalance_hours(rebalances: DataFrame) -> DataFrame:
    """Per hour and group, by the hour the rebalance happened in (for storms)."""
    return rebalances.withColumn("event_hour", F.floor(F.col("ts") / 3600)).groupBy(
        *HOUR_COLUMNS, "group", "event_hour").agg(
        F.count(F.lit(1)).alias("rebalances"),
        F.sum("duration_s").alias("duration_sum"), F.count("duration_s").alias("duration_n"),
        F.max("duration_s").alias("max_seconds"),
        F.max("generation").alias("last_generation"),
        F.max("members_after").alias("max_members"),
        F.collect_set("reason").alias("reasons"))


def slowest_rebalance_hours(rebalances: DataFrame, top_n: int) -> DataFrame:
    """The slowest ``top_n`` rebalances of each hour: the overall slowest are among them."""
    by_hour = Window.partitionBy(*HOUR_COLUMNS).orderBy(
        F.desc_nulls_last("duration_s"), "group", "generation")
    return rebalances.withColumn("hour_rank", F.row_number().over(by_hour)).where(
        F.col("hour_rank") <= top_n).drop("hour_rank")


# --- rows per hour -> report tables --------------------------------------------------

def _ranked(df: DataFrame, top_n: int, *order: Column | str) -> DataFrame:
    """The first ``top_n`` rows by ``order``, numbered from 1. ``orderBy`` + ``limit``
    keeps the best rows of each partition and merges only those; its output is one
    ordered partition, so the row ids there are 0, 1, 2, ..."""
    top = df.orderBy(*order).limit(top_n)
    return top.select((F.monotonically_increasing_id() + 1).alias("rank"), *df.columns)


def _avg(col: str) -> Column:
    n = F.sum(f"{col}_n")
    return F.when(n > 0, F.sum(f"{col}_sum") / n).alias(col)


def merge(clients: DataFrame, instances: DataFrame, rebalances: DataFrame,
          slow_rebalances: DataFrame, top_n: int) -> Tables:
    """The report tables from the per-hour rows of every hour in the report."""
    clients = clients.withColumn("client", F.concat_ws("/", "source_address", "client_id"))
    inventory_conns = clients.groupBy(*SOFTWARE).agg(
        F.countDistinct("client").alias("clients"),
        F.sum("connections").alias("connections"),
        F.sum("connections_with_telemetry").alias("connections_with_telemetry"))
    inventory_tel = instances.groupBy(*SOFTWARE).agg(
        F.countDistinct("instance_id").alias("telemetry_instances"))
    client_inventory = inventory_conns.join(inventory_tel, SOFTWARE, "full_outer").na.fill(
        0).orderBy(F.desc("clients"), *SOFTWARE)

    # A client can rebootstrap if any of its connections spoke Metadata v13+.
    per_client = clients.groupBy(*SOFTWARE, "client").agg(
        F.max("metadata_max_version").alias("metadata_max_version"))
    rebootstrap_readiness = per_client.groupBy(*SOFTWARE).agg(
        F.count(F.lit(1)).alias("clients"),
        F.sum((F.col("metadata_max_version") >= 13).cast("int")).alias("ready"),
        F.sum((F.col("metadata_max_version") < 13).cast("int")).alias("not_ready"),
        F.sum(F.col("metadata_max_version").isNull().cast("int")).alias("unknown"),
        F.max("metadata_max_version").alias("max_metadata_version"),
    ).withColumn("ready_ratio", F.col("ready") / F.col("clients")).orderBy(*SOFTWARE)

    measured = sum((F.col(f"{c}_n") for c in LATENCY_METRICS), F.lit(0))
    instance_latency = instances.where(measured > 0).groupBy(*INSTANCE).agg(
        *[_avg(c) for c in LATENCY_METRICS])

    software_latency = instance_latency.groupBy(*SOFTWARE).agg(
        F.countDistinct("instance_id").alias("instances"),
        *[agg for col in LATENCY_METRICS for agg in (
            F.avg(col).alias(f"{col}_avg"),
            F.percentile_approx(col, 0.95).alias(f"{col}_p95"))],
    ).orderBy(*SOFTWARE)

    client_throughput = clients.groupBy(*CLIENT).agg(
        F.sum("bytes_in").alias("bytes_in"), F.sum("bytes_out").alias("bytes_out"),
        F.max("seconds").alias("seconds"),
    ).withColumn("mb_per_s", (F.col("bytes_in") + F.col("bytes_out")) / F.col("seconds") / 1e6
                 ).orderBy(F.desc("mb_per_s"), *CLIENT)

    slowest_instances = _ranked(
        instance_latency.where(F.col("produce_request_latency_ms").isNotNull()
                               | F.col("fetch_latency_ms").isNotNull()),
        top_n, F.desc_nulls_last("produce_request_latency_ms"),
        F.desc_nulls_last("fetch_latency_ms"), "instance_id")

    storms = rebalances.groupBy("group", "event_hour").agg(
        F.sum("rebalances").alias("n")).groupBy("group").agg(F.max("n").alias("max_per_hour"))
    group_rebalances = rebalances.groupBy("group").agg(
        F.sum("rebalances").alias("rebalances"),
        F.when(F.sum("duration_n") > 0, F.sum("duration_sum") / F.sum("duration_n"))
        .alias("avg_seconds"),
        F.max("max_seconds").alias("max_seconds"),
        F.max("last_generation").alias("last_generation"),
        F.max("max_members").alias("max_members"),
        F.concat_ws(", ", F.sort_array(F.array_distinct(F.flatten(F.collect_list("reasons")))))
        .alias("reasons"),
    ).join(storms, "group").orderBy(F.desc("max_per_hour"), F.desc("rebalances"), "group")
    slowest_rebalances = _ranked(slow_rebalances.select(*REBALANCE), top_n,
                                 F.desc_nulls_last("duration_s"), "group", "generation")
    return Tables(client_inventory, rebootstrap_readiness, instance_latency, software_latency,
                  client_throughput, slowest_instances, group_rebalances, slowest_rebalances)
