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
bound, and the relay never waits. The queue is bounded in records and in bytes
(``queue_bytes``); client-chosen strings in an inventory record are shortened and
its per-API table capped. A push is queued as its decompressed OTLP bytes and
turned into JSON on the writer thread, not on the relay's.
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

from kproxy.codecs.errors import CodecError
from kproxy.codecs.otlp.model import to_otlp_json
from kproxy.logs import RateLimitedLog
from kproxy.policies.bounds import MAX_FIELD_CHARS, bounded

log = logging.getLogger("kproxy.archive")
KINDS = ("telemetry", "connections", "groups")
DEFAULT_QUEUE_BYTES = 64 * 1024 * 1024  # records waiting for the writer, in all
MAX_RECORD_ITEMS = 128  # entries of a table inside an inventory record (apis)
_Item = tuple[str, "str | tuple[bytes, dict[str, str]]", int]  # kind, record, bytes queued


@dataclass
class ArchiveSettings:
    root: Path
    max_file_bytes: int = 64 * 1024 * 1024
    max_file_seconds: float = 300.0
    max_total_bytes: int = 1024 * 1024 * 1024
    queue_records: int = 10_000
    queue_bytes: int = DEFAULT_QUEUE_BYTES


@dataclass
class ArchiveStats:
    written: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    files_completed: int = 0
    files_deleted: int = 0
    bytes_on_disk: int = 0
    bytes_queued: int = 0


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
        self._queue: queue.Queue[_Item | None] = queue.Queue(settings.queue_records)
        self._queued_lock = threading.Lock()
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
        self._submit("telemetry", otlp_json_line, len(otlp_json_line))

    def telemetry_payload(self, raw: bytes, resource_attributes: dict[str, str]) -> None:
        """A push as its decompressed OTLP bytes; the JSON is made on the writer thread."""
        self._submit("telemetry", (raw, resource_attributes), len(raw))

    def connection(self, record: dict[str, Any]) -> None:
        line = json.dumps(_bounded_record(record), separators=(",", ":"), default=str)
        self._submit("connections", line, len(line))

    def group_rebalance(self, record: dict[str, Any]) -> None:
        """One completed consumer-group rebalance (kproxy.metrics.groups)."""
        line = json.dumps(_bounded_record(record), separators=(",", ":"), default=str)
        self._submit("groups", line, len(line))

    def _submit(self, kind: str, record: str | tuple[bytes, dict[str, str]],
                size: int) -> None:
        with self._queued_lock:
            if self.stats.bytes_queued + size > self.settings.queue_bytes:
                self.stats.dropped[kind] += 1
                return
            self.stats.bytes_queued += size
        try:
            self._queue.put_nowait((kind, record, size))
        except queue.Full:
            self._dequeued(size)
            self.stats.dropped[kind] += 1

    def _dequeued(self, size: int) -> None:
        with self._queued_lock:
            self.stats.bytes_queued -= size

    # ------------------------------------------------------------------ writer thread

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=1.0)
            except queue.Empty:
                item = ("", "", 0)  # idle: a chance to rotate by age
            self._go.wait()
            if item is None:
                for kind in list(self._open):
                    self._complete(kind)
                return
            kind, record, size = item
            self._dequeued(size)
            try:
                line = record if isinstance(record, str) else to_otlp_json(*record)
            except CodecError:  # it was decoded once already; count it if not
                self.stats.dropped[kind] += 1
                continue
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
def _bounded_record(record: dict[str, Any]) -> dict[str, Any]:
    """An inventory record with client-chosen strings shortened and tables capped."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, str):
            value = bounded(value, MAX_FIELD_CHARS)
        elif isinstance(value, dict) and len(value) > MAX_RECORD_ITEMS:
            value = dict(list(value.items())[:MAX_RECORD_ITEMS])
        out[key] = value
    return out
