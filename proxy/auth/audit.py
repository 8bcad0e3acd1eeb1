"""The audit log: one JSON line per security event, appended, rotated, bounded.

Every process of the proxy (the supervisor and each worker) appends to the same
file, opened with O_APPEND so that lines from several processes never interleave
(each line is one write, bounded well below what a local file system writes at
once). Rotation takes an flock on ``FILE.lock``: the process that finds the file
over its size renames FILE to FILE.1 (FILE.1 to FILE.2, ..., the oldest dropped);
the others notice that the name now points at a new file and reopen it. What is on
disk is at most (backups + 1) * max_bytes plus one line.

Records are made by the code that knows the event (``policies.auth.handlers`` for
logins); they hold names, addresses and outcomes, never a password or token. A
write that fails (disk full) is counted and logged once a minute, and the proxy
goes on.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from typing import Any

log = logging.getLogger("kproxy.audit")
MAX_LINE_BYTES = 4096
MAX_FIELD_CHARS = 512
# Names a record never carries, whoever builds it: a last guard against a secret.
SECRET_KEYS = frozenset({"password", "token", "auth_bytes", "authorization", "secret",
                         "proof", "jwt"})


class AuditLog:
    def __init__(self, path: str, max_bytes: int, backups: int, process: str) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.process = process  # "supervisor" or "proxy" (a worker, or the one process)
        self.written = 0
        self.failures = 0
        self._fd: int | None = None
        self._last_warning = 0.0

    def record(self, fields: dict[str, Any]) -> None:
        """Append one event; never raises."""
        line = self._line(fields)
        try:
            self._write(line)
            self.written += 1
        except OSError as exc:
            self.failures += 1
            self._close()
            now = time.monotonic()
            if now - self._last_warning > 60:
                self._last_warning = now
                log.warning("cannot write the audit log: %s", exc,
                            extra={"fields": {"path": self.path}})

    def _line(self, fields: dict[str, Any]) -> bytes:
        record: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z",
            "process": self.process, "pid": os.getpid()}
        for key, value in fields.items():
            if key.lower() in SECRET_KEYS or value is None:
                continue
            if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
                value = value[:MAX_FIELD_CHARS] + "..."
            record[key] = value
        data = json.dumps(record, separators=(",", ":"), default=str).encode()
        if len(data) >= MAX_LINE_BYTES:
            keep = {k: record[k] for k in ("time", "process", "event", "outcome")
                    if k in record}
            data = json.dumps({**keep, "truncated": True}, separators=(",", ":")).encode()
        return data + b"\n"

    def _write(self, line: bytes) -> None:
        fd = self._open()
        if os.fstat(fd).st_size + len(line) > self.max_bytes:
            self._rotate()
            fd = self._open()
        os.write(fd, line)

    def _open(self) -> int:
        """The file at ``path`` now: reopened when another process rotated it."""
        fd = self._fd
        if fd is not None:
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            self._close()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                           0o600)
        return self._fd

    def _rotate(self) -> None:
        lock = os.open(self.path + ".lock", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if os.stat(self.path).st_size < self.max_bytes // 2:
                    return  # another process rotated it meanwhile
            except FileNotFoundError:
                return
            for n in range(self.backups - 1, 0, -1):
                older = f"{self.path}.{n}"
                if os.path.exists(older):
                    os.replace(older, f"{self.path}.{n + 1}")
            os.replace(self.path, f"{self.path}.1")
        finally:
            os.close(lock)  # releases the lock
        self._close()

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        self._close()


def open_audit(path: str | None, max_bytes: int, backups: int, process: str) -> AuditLog | None:
    return AuditLog(path, max_bytes, backups, process) if path else None


class DenialReporter:
    """Denied operations to the audit log, at most ``rate`` lines a second (burst
    ``burst``): a client retrying a denied request in a loop must not fill the log
    faster than rotation drops it. Lines held back are counted and the next line
    written says how many (``suppressed``). Every denial is counted in ``count``."""

    def __init__(self, record: Any, count: Any, rate: float = 20.0, burst: float = 100.0,
                 clock: Any = time.monotonic) -> None:
        self.record = record
        self.count = count
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self.tokens = burst
        self.at = clock()
        self.suppressed = 0

    def __call__(self, fields: dict[str, Any]) -> None:
        self.count()
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            self.suppressed += 1
            return
        self.tokens -= 1
        if self.suppressed:
            fields = {**fields, "suppressed": self.suppressed}
            self.suppressed = 0
        self.record(fields)
