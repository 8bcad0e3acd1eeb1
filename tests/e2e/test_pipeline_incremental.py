"""The fleet job at fleet scale, in a real local SparkSession over the archive kproxy
wrote for real clients (tests/data/archive): no step of a report table gathers the data
in one partition, and a run reads only the hours it has not seen, with the same result
as a run from scratch."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ARCHIVE = Path(__file__).parent.parent / "data" / "archive"
TABLES = ["client_inventory", "rebootstrap_readiness", "instance_latency", "software_latency",
          "client_throughput", "slowest_instances", "group_rebalances", "slowest_rebalances"]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from kproxy.pipeline.fleet import quiet, session

    # Two shuffle partitions: the archive is small, and each task costs a little.
    s = quiet(session("local[2]", "kproxy-fleet-incremental-tests",
                      conf=[("spark.sql.shuffle.partitions", "2")]))
    yield s
    s.stop()


def plan_problems(df: Any) -> list[str]:
    """Steps of the physical plan that put every row in one partition: a window with no
    partition key, or an exchange to a single partition. The plan is walked node by node
    (bounded) from the query execution Spark would run."""
    problems: list[str] = []
    stack = [df._jdf.queryExecution().executedPlan()]
    for _ in range(10_000):
        if not stack:
            return problems
        node = stack.pop()
        name = node.nodeName()
        if name == "AdaptiveSparkPlan":
            stack.append(node.initialPlan())
            continue
        if name == "Window" and node.partitionSpec().isEmpty():
            problems.append(f"unpartitioned window: {node.simpleString(200)}")
        if name == "Exchange" and node.outputPartitioning().toString() == "SinglePartition":
            problems.append(f"single-partition exchange: {node.simpleString(200)}")
        children = node.children()
        stack.extend(children.apply(i) for i in range(children.size()))
    raise AssertionError("plan too large to walk")


def test_plan_check_sees_a_global_window(spark: Any) -> None:
    """The checker itself: the old top-N (row_number over an unpartitioned window) and a
    global aggregate are both caught; a keyed window and orderBy+limit are not."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    df = spark.range(1000).withColumn("k", F.col("id") % 7)
    assert plan_problems(df.withColumn("r", F.row_number().over(Window.orderBy("id"))))
    assert plan_problems(df.agg(F.countDistinct("k")))
    assert not plan_problems(df.withColumn(
        "r", F.row_number().over(Window.partitionBy("k").orderBy("id"))))
    assert not plan_problems(df.orderBy(F.desc("id")).limit(5))


def rows(spark: Any, out: Path, name: str) -> list[tuple[Any, ...]]:
    """A table's rows, sorted, floats rounded (sums over hours add in any order)."""
    def norm(v: Any) -> Any:
        return round(v, 9) if isinstance(v, float) else v
    df = spark.read.parquet(str(out / "tables" / name))
    return sorted((tuple(norm(v) for v in r) for r in df.collect()), key=repr)


@pytest.fixture(scope="module")
def first(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run over a copy of the archive with a second telemetry hour and an hour of
    rebalances added (the later tests change this copy)."""
    from kproxy.pipeline.fleet import run

    tmp = tmp_path_factory.mktemp("incremental")
    archive = tmp / "archive"
    shutil.copytree(ARCHIVE, archive)
    tel = sorted((archive / "telemetry").glob("date=*/hour=*"))[0]
    shutil.copytree(tel, tel.parent / "hour=02")
    groups = archive / "groups" / tel.parent.name / tel.name
    groups.mkdir(parents=True)
    (groups / "part-1.jsonl").write_text("".join(
        json.dumps({"ts": 1.8e9 + i, "proxy": "p", "group": f"g{i % 2}", "generation": i,
                    "members_before": 1, "members_after": 2, "duration_s": 0.1 * i,
                    "reason": "new member", "protocol": "classic", "assignor": "range"})
        + "\n" for i in range(6)))
    tables, progress = run(spark, [str(archive)], str(tmp / "out"), top_n=3)
    return {"archive": archive, "out": tmp / "out", "tel": tel, "tables": tables,
            "progress": progress, "tmp": tmp}


def test_no_step_gathers_the_data_in_one_partition(spark: Any, first: dict[str, Any]) -> None:
    """Neither the per-hour reductions (over the raw records) nor the report tables
    (over the kept rows) have a step that puts every row in one partition."""
    from kproxy.pipeline.archive import flatten_points, list_hours, read_hours
    from kproxy.pipeline.fleet import _per_hour

    hours = list_hours(str(first["archive"]))
    assert sorted({h.kind for h in hours}) == ["connections", "groups", "telemetry"]
    for kind, outputs in _per_hour(3).items():
        raw = read_hours(spark, hours, kind)
        raw = flatten_points(raw) if kind == "telemetry" else raw
        for name, reduce in outputs.items():
            assert plan_problems(reduce(raw)) == [], name

    tables = first["tables"]
    assert sorted(vars(tables)) == sorted(TABLES)
    for name, df in vars(tables).items():
        assert plan_problems(df) == [], name
    slowest = sorted(rows(spark, first["out"], "slowest_rebalances"))
    assert [(r[0], r[4]) for r in slowest] == [(1, 5), (2, 4), (3, 3)]  # rank, generation


def test_rerun_reads_only_new_changed_and_gone_hours(spark: Any, first: dict[str, Any]) -> None:
    from kproxy.pipeline.fleet import run

    archive, out, tel = first["archive"], first["out"], first["tel"]
    assert len(first["progress"].done) == 4 and first["progress"].kept == 0
    # Nothing changed: nothing read, and the report stands (no Spark job at all).
    _, again = run(spark, [str(archive)], str(out), top_n=3)
    assert (again.done, again.kept, again.removed, again.reported) == ([], 4, [], False)

    # A new hour, a file grown in a seen hour, an hour removed (kproxy's total cap).
    con = sorted((archive / "connections").glob("date=*/hour=*"))[0]
    shutil.copytree(con, con.parent / "hour=03")
    grown = sorted(tel.glob("part-*.jsonl"))[0]
    grown.write_text(grown.read_text() + grown.read_text().splitlines()[0] + "\n")
    shutil.rmtree(tel.parent / "hour=02")
    _, third = run(spark, [str(archive)], str(out), top_n=3)
    assert [k.split("/")[0] + "/" + k.split("/")[-1] for k in third.done] == [
        "connections/hour=03", "telemetry/hour=01"]
    assert third.kept == 2 and [k.split("/")[-1] for k in third.removed] == ["hour=02"]
    assert third.reported

    fresh = first["tmp"] / "fresh"
    run(spark, [str(archive)], str(fresh), top_n=3)
    for name in [*TABLES, "points"]:
        assert rows(spark, out, name) == rows(spark, fresh, name), name
    inventory = rows(spark, out, "client_inventory")
    assert sum(r[3] for r in inventory) == 2 * sum(  # connections doubled by hour=03
        len(p.read_text().splitlines()) for p in con.glob("part-*.jsonl"))
