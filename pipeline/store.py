"""Where the per-hour rows live between runs, and which hours they cover.

``OUT/hourly/NAME/source=S/date=D/hour=H/`` holds one table's rows for one hour of
one archive; ``OUT/hourly/_state.json`` maps every hour done to the fingerprint of the
files it was computed from. An hour's entry is removed before its rows are replaced and
written back only after, so a run cut short leaves at worst hours to do again.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kproxy.pipeline.archive import HOUR_COLUMNS, Hour

# Bumped whenever what is kept per hour changes: every hour is then done again.
FORMAT = 1


@dataclass
class State:
    """The hours whose rows are kept, by key, with their fingerprints."""

    top_n: int
    hours: dict[str, str] = field(default_factory=dict)
    # What the last report was made from (see fleet.run): the same again needs no work.
    report: str = ""


class Store:
    """Per-hour Parquet tables under ``OUT/hourly`` and the state that indexes them."""

    def __init__(self, out: str) -> None:
        self.root = Path(out) / "hourly"
        self.state_file = self.root / "_state.json"

    def load(self, top_n: int) -> State:
        """The saved state, or an empty one when there is none or it was made by another
        format or with a shorter top-N list (the kept slowest rows would not suffice)."""
        try:
            saved = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            saved = {}
        if saved.get("format") != FORMAT or int(saved.get("top_n", -1)) < top_n:
            if self.root.exists():
                shutil.rmtree(self.root)
            return State(top_n)
        return State(int(saved["top_n"]), dict(saved.get("hours", {})),
                     str(saved.get("report", "")))

    def save(self, state: State) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"format": FORMAT, "top_n": state.top_n,
                                   "report": state.report,
                                   "hours": dict(sorted(state.hours.items()))}, indent=0))
        os.replace(tmp, self.state_file)

    def path(self, name: str) -> Path:
        return self.root / name

    @staticmethod
    def partition(table: Path, key: str) -> Path:
        """The folder of one hour in one table (a key is ``kind/source=/date=/hour=``)."""
        return table.joinpath(*key.split("/")[1:])

    def forget(self, state: State, keys: Iterable[str], tables: dict[str, list[Path]]) -> None:
        """Drop these hours: from the state first (saved), then their folders."""
        keys = list(keys)
        for key in keys:
            state.hours.pop(key, None)
        self.save(state)
        for key in keys:
            for table in tables.get(key.split("/")[0], []):
                shutil.rmtree(self.partition(table, key), ignore_errors=True)

    @staticmethod
    def append(df: DataFrame, table: Path) -> None:
        df.write.mode("append").partitionBy(*HOUR_COLUMNS).parquet(str(table))

    @staticmethod
    def read(spark: SparkSession, table: Path, empty: DataFrame,
             sources: list[str]) -> DataFrame:
        """The rows of ``table`` for these archives (``empty`` gives the schema)."""
        if not table.is_dir():
            return empty
        return spark.read.schema(empty.schema).parquet(str(table)).where(
            F.col("source").isin(sources))

    @staticmethod
    def read_hours(spark: SparkSession, table: Path, empty: DataFrame,
                   hours: list[Hour]) -> DataFrame:
        """The rows of ``table`` for just these hours."""
        dirs = [str(Store.partition(table, h.key)) for h in hours]
        dirs = [d for d in dirs if Path(d).is_dir()]
        if not dirs:
            return empty
        return spark.read.schema(empty.schema).option("basePath", str(table)).parquet(*dirs)
