"""The telemetry archive: JSON lines on local disk for the fleet pipeline.

Three record streams, each in its own folder and partitioned by date and hour:
``telemetry/`` holds one OTLP JSON line per accepted push (the OpenTelemetry
file-exporter format), ``connections/`` one inventory record per client
connection, ``groups/`` one record per completed consumer-group rebalance.
A file is written under a hidden name (``.part-*.jsonl.tmp``, which Spark and most
readers skip) and renamed into place when it rotates, so a reader
never sees a half-written line. Completed files are capped in total size; the
oldest go first. Writing happens on a thread behind a bounded queue: when the
disk is slow or full, records are dropped and counted, never buffered without
bound, and the relay never waits.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kproxy.logs import RateLimitedLog

log = logging.getLogger("kproxy.archive")
KINDS = ("telemetry", "connections", "groups")


@dataclass
class ArchiveSettings:
    root: Path
    max_file_bytes: int = 64 * 1024 * 1024
    max_file_seconds: float = 300.0
    max_total_bytes: int = 1024 * 1024 * 1024
    queue_records: int = 10_000


@dataclass
class ArchiveStats:
    written: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    files_completed: int = 0
    files_deleted: int = 0
    bytes_on_disk: int = 0


class _OpenFile:
    def __init__(self, kind: str, root: Path, now: float, seq: int) -> None:
        stamp = time.gmtime(now)
        self.folder = root / kind / time.strftime("date=%Y-%m-%d/hour=%H", stamp)
        self.folder.mkdir(parents=True, exist_ok=True)
        name = (f"part-{time.strftime('%Y%m%dT%H%M%S', stamp)}-{socket.gethostname()}"
                f"-{os.getpid()}-{seq:06d}.jsonl")
        self.final = self.folder / name
        self.temp = self.folder / f".{name}.tmp"
        self.fh: TextIO = open(self.temp, "a", encoding="utf-8")  # noqa: SIM115
        self.opened = now
        self.size = 0


class ArchiveWriter:
    """Accepts records from the relay (never blocking) and writes them on a thread."""

    def __init__(self, settings: ArchiveSettings,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.stats = ArchiveStats()
        self._clock = clock
        self._queue: queue.Queue[tuple[str, str] | None] = queue.Queue(settings.queue_records)
        self._open: dict[str, _OpenFile] = {}
        self._seq = 0
        self._thread = threading.Thread(target=self._run, name="kproxy-archive", daemon=True)
        self._go = threading.Event()  # cleared while stalled (tests stand in a slow disk)
        self._ratelog = RateLimitedLog()  # a full disk fails every write: log it once a while
        self._go.set()

    def start(self) -> ArchiveWriter:
        self.settings.root.mkdir(parents=True, exist_ok=True)
        self.stats.bytes_on_disk = sum(p.stat().st_size for p in self._completed())
        self._thread.start()
        return self

    def stall(self) -> None:
        self._go.clear()

    def resume(self) -> None:
        self._go.set()

    def close(self, timeout: float = 10.0) -> None:
        """Flush what is queued, complete the open files, stop the thread."""
        self._go.set()
        self._queue.put(None)
        self._thread.join(timeout)

    # ------------------------------------------------------------------ producers

    def telemetry(self, otlp_json_line: str) -> None:
        self._submit("telemetry", otlp_json_line)

    def connection(self, record: dict[str, Any]) -> None:
        self._submit("connections", json.dumps(record, separators=(",", ":"), default=str))

    def group_rebalance(self, record: dict[str, Any]) -> None:
        """One completed consumer-group rebalance (kproxy.groups)."""
        self._submit("groups", json.dumps(record, separators=(",", ":"), default=str))

    def _submit(self, kind: str, line: str) -> None:
        try:
            self._queue.put_nowait((kind, line))
        except queue.Full:
            self.stats.dropped[kind] += 1

    # ------------------------------------------------------------------ writer thread

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=1.0)
            except queue.Empty:
                item = ("", "")  # idle: a chance to rotate by age
            self._go.wait()
            if item is None:
                for kind in list(self._open):
                    self._complete(kind)
                return
            kind, line = item
            try:
                if kind:
                    self._write(kind, line)
                self._rotate_by_age()
            except OSError as exc:  # disk full, permissions: drop, count, carry on
                if kind:
                    self.stats.dropped[kind] += 1
                self._ratelog(logging.WARNING, "archive-write",
                              "archive write failed; record dropped",
                              error=exc.strerror or str(exc))
                self._abandon(kind)

    def _write(self, kind: str, line: str) -> None:
        f = self._open.get(kind)
        if f is None:
            self._seq += 1
            f = self._open[kind] = _OpenFile(kind, self.settings.root, self._clock(), self._seq)
        data = line + "\n"
        f.fh.write(data)
        f.fh.flush()
        f.size += len(data.encode())
        self.stats.written[kind] += 1
        if f.size >= self.settings.max_file_bytes:
            self._complete(kind)

    def _rotate_by_age(self) -> None:
        now = self._clock()
        for kind, f in list(self._open.items()):
            if now - f.opened >= self.settings.max_file_seconds:
                self._complete(kind)

    def _complete(self, kind: str) -> None:
        f = self._open.pop(kind)
        f.fh.close()
        if f.size == 0:
            f.temp.unlink(missing_ok=True)
            return
        os.replace(f.temp, f.final)  # atomic: the reader sees all of it or none
        self.stats.files_completed += 1
        self.stats.bytes_on_disk += f.size
        self._enforce_bound()

    def _abandon(self, kind: str) -> None:
        f = self._open.pop(kind, None)
        if f is not None:
            try:
                f.fh.close()
                f.temp.unlink(missing_ok=True)
            except OSError:
                pass

    def _completed(self) -> list[Path]:
        return [p for kind in KINDS for p in (self.settings.root / kind).rglob("part-*.jsonl")]

    def _enforce_bound(self) -> None:
        if self.stats.bytes_on_disk <= self.settings.max_total_bytes:
            return
        files = sorted(self._completed(), key=lambda p: (p.stat().st_mtime, p.name))
        for path in files:
            if self.stats.bytes_on_disk <= self.settings.max_total_bytes:
                break
            size = path.stat().st_size
            path.unlink()
            self.stats.bytes_on_disk -= size
            self.stats.files_deleted += 1
            log.info("archive over its size bound: removed the oldest file",
                     extra={"fields": {"file": str(path), "bytes": size}})


class ArchiveCollector(Collector):
    """The archive writer's counters on /metrics, read at scrape time."""

    def __init__(self, archive: ArchiveWriter) -> None:
        self.archive = archive

    def collect(self) -> Iterator[Metric]:
        stats = self.archive.stats
        records = CounterMetricFamily("kproxy_archive_records", "Archive records, by kind and "
                                      "outcome (dropped: the writer was behind or the disk "
                                      "failed)", labels=["kind", "outcome"])
        for kind in KINDS:
            records.add_metric([kind, "written"], stats.written[kind])
            records.add_metric([kind, "dropped"], stats.dropped[kind])
        yield records
        yield CounterMetricFamily("kproxy_archive_files_deleted", "Completed archive files "
                                  "removed to stay under the size bound", stats.files_deleted)
        yield GaugeMetricFamily("kproxy_archive_bytes", "Bytes of completed archive files",
                                stats.bytes_on_disk)
