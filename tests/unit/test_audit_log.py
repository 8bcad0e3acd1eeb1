"""The audit log file: JSON lines, secrets dropped, rotation bounded, and two writers
(two processes of one proxy) sharing one file through a rotation."""

from __future__ import annotations

import json
from pathlib import Path

from kproxy.auth.audit import MAX_LINE_BYTES, AuditLog


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_records_are_json_lines_without_secrets(tmp_path: Path) -> None:
    log = AuditLog(str(tmp_path / "audit.log"), 1 << 20, 3, "proxy")
    log.record({"event": "login", "outcome": "ok", "principal": "alice", "password": "pw",
                "token": "eyJ...", "Authorization": "Bearer x", "reason": None})
    log.record({"event": "admin", "path": "/admin/x", "note": "y" * 10_000})
    first, second = _lines(tmp_path / "audit.log")
    assert first["principal"] == "alice" and first["process"] == "proxy" and "pid" in first
    assert not {"password", "token", "Authorization", "reason"} & set(first)
    assert len(json.dumps(second)) < MAX_LINE_BYTES
    assert (tmp_path / "audit.log").stat().st_mode & 0o777 == 0o600


def test_rotation_keeps_what_is_on_disk_bounded(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    log = AuditLog(str(path), 2000, 2, "proxy")
    for i in range(500):
        log.record({"event": "login", "outcome": "failed", "n": i})
    files = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock"))
    assert files == ["audit.log", "audit.log.1", "audit.log.2"]
    assert all((tmp_path / f).stat().st_size <= 2000 for f in files)
    newest = _lines(path)[-1]
    assert newest["n"] == 499  # the newest line is in the current file


def test_two_writers_share_the_file_through_a_rotation(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    a = AuditLog(str(path), 3000, 5, "worker")
    b = AuditLog(str(path), 3000, 5, "supervisor")
    for i in range(100):
        (a if i % 2 else b).record({"event": "login", "n": i})
    seen = []
    for name in ["audit.log.5", "audit.log.4", "audit.log.3", "audit.log.2", "audit.log.1",
                 "audit.log"]:
        if (tmp_path / name).exists():
            seen += [int(r["n"]) for r in _lines(tmp_path / name)]  # type: ignore[call-overload]
    # Every line written is in exactly one file (none lost to a stale descriptor) as
    # long as the backups hold them; the newest ones are all there, in order.
    assert seen == sorted(seen) and seen[-1] == 99 and len(seen) == len(set(seen))
    assert seen == list(range(seen[0], 100))


def test_an_unwritable_file_is_counted_not_raised(tmp_path: Path) -> None:
    log = AuditLog(str(tmp_path / "missing-dir" / "audit.log"), 1000, 1, "proxy")
    log.record({"event": "login"})
    assert log.failures == 1 and log.written == 0
