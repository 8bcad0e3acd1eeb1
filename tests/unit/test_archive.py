"""The telemetry archive: rotation, atomic completion, the disk bound, and dropping (and
counting) instead of buffering when the writer is stalled or the disk fails."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

from kproxy.archive import ArchiveSettings, ArchiveWriter

from ..support import wait_until


def completed(root: Path, kind: str = "telemetry") -> list[Path]:
    return sorted((root / kind).rglob("part-*.jsonl"))


def lines(paths: list[Path]) -> list[dict[str, Any]]:
    return [json.loads(line) for p in paths for line in p.read_text().splitlines()]


def test_rotates_by_size_into_dated_partitions(tmp_path: Path) -> None:
    w = ArchiveWriter(ArchiveSettings(tmp_path, max_file_bytes=1000)).start()
    for i in range(100):
        w.telemetry(json.dumps({"resourceMetrics": [], "i": i}))
    w.connection({"client_id": "c1"})
    w.close()
    files = completed(tmp_path)
    assert len(files) >= 3
    assert all(re.match(r"date=\d{4}-\d\d-\d\d", p.parent.parent.name) for p in files)
    assert all(p.parent.name.startswith("hour=") for p in files)
    assert [r["i"] for r in lines(files)] == list(range(100))
    assert lines(completed(tmp_path, "connections")) == [{"client_id": "c1"}]
    assert not list(tmp_path.rglob(".*.tmp"))  # close() completes every open file
    assert w.stats.written == {"telemetry": 100, "connections": 1, "groups": 0}


def test_rotates_by_age_even_without_new_records(tmp_path: Path) -> None:
    now = [1_700_000_000.0]
    w = ArchiveWriter(ArchiveSettings(tmp_path, max_file_seconds=60),
                      clock=lambda: now[0]).start()
    w.telemetry('{"a":1}')
    wait_until(lambda: w.stats.written["telemetry"] == 1)
    assert completed(tmp_path) == []  # still being written, under a hidden name
    now[0] += 61
    wait_until(lambda: completed(tmp_path), timeout=5)  # the idle writer rotates it
    w.close()
    assert lines(completed(tmp_path)) == [{"a": 1}]


def test_a_reader_never_sees_a_half_line(tmp_path: Path) -> None:
    w = ArchiveWriter(ArchiveSettings(tmp_path, max_file_bytes=20_000)).start()
    stop = threading.Event()
    seen_bad: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            for p in completed(tmp_path):
                text = p.read_text()
                if text and not text.endswith("\n"):
                    seen_bad.append(str(p))
                for line in text.splitlines():
                    json.loads(line)

    t = threading.Thread(target=reader)
    t.start()
    payload = json.dumps({"resourceMetrics": [{"x": "y" * 500}]})
    for _ in range(2000):
        w.telemetry(payload)
    w.close()
    stop.set()
    t.join()
    assert not seen_bad
    assert len(lines(completed(tmp_path))) == w.stats.written["telemetry"]


def test_total_size_is_bounded_oldest_first(tmp_path: Path) -> None:
    w = ArchiveWriter(ArchiveSettings(tmp_path, max_file_bytes=2000,
                                      max_total_bytes=10_000)).start()
    for i in range(500):
        w.telemetry(json.dumps({"i": i, "pad": "x" * 50}))
    w.close()
    files = completed(tmp_path)
    assert sum(p.stat().st_size for p in files) <= 10_000
    assert w.stats.files_deleted > 0 and w.stats.bytes_on_disk <= 10_000
    kept = [r["i"] for r in lines(files)]
    assert kept == list(range(kept[0], 500))  # what is left is the newest, contiguous


def test_stalled_writer_drops_and_counts_never_buffers(tmp_path: Path) -> None:
    w = ArchiveWriter(ArchiveSettings(tmp_path, queue_records=100)).start()
    w.stall()  # a disk that does not answer
    t0 = time.monotonic()
    for i in range(1000):
        w.telemetry(json.dumps({"i": i}))
    assert time.monotonic() - t0 < 1.0  # submitting never waits
    assert 1000 - 101 <= w.stats.dropped["telemetry"] <= 1000 - 100
    w.resume()
    w.close()
    assert w.stats.written["telemetry"] + w.stats.dropped["telemetry"] == 1000


def test_write_failures_drop_and_count_and_recover(tmp_path: Path) -> None:
    root = tmp_path / "archive"
    w = ArchiveWriter(ArchiveSettings(root)).start()
    blocker = root / "telemetry"
    if blocker.exists():
        blocker.rmdir()
    blocker.write_text("a file where the folder should be")  # mkdir fails: like a bad disk
    w.telemetry('{"lost":1}')
    wait_until(lambda: w.stats.dropped["telemetry"] == 1)
    blocker.unlink()
    w.telemetry('{"kept":1}')
    w.close()
    assert lines(completed(root)) == [{"kept": 1}]
