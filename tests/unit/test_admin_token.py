"""The HTTP port's guard: the admin token, its rotation without a restart, and the
supervisor's secret for its calls to its workers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from kproxy.auth.admin_token import CHECK_SECONDS, AdminToken
from kproxy.http.auth import FORWARDED, guard
from kproxy.http.server import HttpRequest, HttpResponse

OLD, NEW = "old-token-0123456789", "new-token-9876543210"
SECRET = "supervisor-secret-abcdefghijklmnop"


def _token_file(tmp_path: Path, token: str, name: str = "admin.token") -> Path:
    path = tmp_path / name
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


def _rotate(path: Path, token: str) -> None:
    """Rename a new file over the old, as a Secret's symlink swap replaces it."""
    fresh = _token_file(path.parent, token, path.name + ".new")
    os.replace(fresh, path)


async def _ok(req: HttpRequest) -> HttpResponse:
    return HttpResponse(200, b"ok")


def _req(path: str, token: str | None = None, forwarded: bool = False) -> HttpRequest:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    if forwarded:
        headers[FORWARDED] = "1"
    return HttpRequest("POST", path, headers, b"", "127.0.0.1:5555")


def test_a_rotated_token_applies_once_looked_at_and_the_old_one_stops(tmp_path: Path) -> None:
    path = _token_file(tmp_path, OLD)
    audit: list[dict[str, object]] = []
    token = AdminToken(str(path), OLD, audit.append)
    _rotate(path, NEW)
    assert token.current() == OLD  # not until the file is looked at
    token.look()
    assert token.current() == NEW
    assert audit == [{"event": "admin_token", "outcome": "applied"}]
    path.write_text(OLD + "\n")  # rewritten in place: a new size or mtime
    token.look()
    assert token.current() == OLD


def test_a_file_changed_into_a_bad_one_keeps_the_running_token(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _token_file(tmp_path, OLD)
    audit: list[dict[str, object]] = []
    token = AdminToken(str(path), OLD, audit.append)
    for bad, why in (("short", "printable characters"), (None, "No such file")):
        if bad is None:
            path.unlink()
        else:
            _rotate(path, bad)
        token.look()
        assert token.current() == OLD
        assert audit[-1]["outcome"] == "rejected" and why in str(audit[-1]["error"])
    assert OLD not in str(audit) and OLD not in caplog.text
    token.look()
    assert token.current() == OLD and len(audit) == 2  # said once per change
    _rotate(path, NEW)
    token.look()
    assert token.current() == NEW
    path.chmod(0o604)  # made readable by every user: refused, as at start
    token.look()
    assert token.current() == NEW and "chmod o-r" in str(audit[-1]["error"])


def test_a_file_changed_before_the_guard_started_is_read_at_the_first_look(
        tmp_path: Path) -> None:
    path = _token_file(tmp_path, NEW)
    token = AdminToken(str(path), OLD, None)  # OLD: what the config read earlier
    token.look()
    assert token.current() == NEW


async def test_the_watch_looks_every_second(tmp_path: Path,
                                           autojump_clock: trio.testing.MockClock) -> None:
    path = _token_file(tmp_path, OLD)
    token = AdminToken(str(path), OLD)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(token.watch)
        await trio.sleep(CHECK_SECONDS / 2)
        _rotate(path, NEW)
        assert token.current() == OLD
        await trio.sleep(CHECK_SECONDS)  # the mock clock jumps: no wall time passes
        assert token.current() == NEW
        nursery.cancel_scope.cancel()


def test_no_token_file_means_no_token() -> None:
    assert AdminToken(None, None).current() is None


async def test_guard_takes_the_current_token_and_audits_admin_calls(tmp_path: Path) -> None:
    path = _token_file(tmp_path, OLD)
    audit: list[dict[str, object]] = []
    token = AdminToken(str(path), OLD, None)
    routes = guard({"/admin/rebootstrap": _ok, "/metrics": _ok}, token.current, False,
                   audit.append)
    call = routes["/admin/rebootstrap"]
    assert (await call(_req("/admin/rebootstrap"))).status == 401
    assert (await call(_req("/admin/rebootstrap", OLD))).status == 200
    _rotate(path, NEW)
    token.look()
    assert (await call(_req("/admin/rebootstrap", OLD))).status == 401
    assert (await call(_req("/admin/rebootstrap", NEW))).status == 200
    assert [r["outcome"] for r in audit] == ["denied", "ok", "denied", "ok"]
    assert routes["/metrics"] is _ok  # never guarded


async def test_a_worker_takes_its_supervisors_secret_only_with_the_mark(
        tmp_path: Path) -> None:
    token = AdminToken(str(_token_file(tmp_path, OLD)), OLD)
    audit: list[dict[str, Any]] = []
    routes = guard({"/admin/rebootstrap": _ok, "/status.json": _ok}, token.current, True,
                   audit.append, forwarded_by=SECRET)
    admin, status = routes["/admin/rebootstrap"], routes["/status.json"]
    assert (await status(_req("/status.json", SECRET, forwarded=True))).status == 200
    assert (await status(_req("/status.json", SECRET))).status == 401
    assert (await status(_req("/status.json", OLD))).status == 200
    # The supervisor's call is audited where it was made, not again here; the mark with
    # the admin token (anyone who has it) is audited like any other call.
    assert (await admin(_req("/admin/rebootstrap", SECRET, forwarded=True))).status == 200
    assert audit == []
    assert (await admin(_req("/admin/rebootstrap", OLD, forwarded=True))).status == 200
    assert [r["outcome"] for r in audit] == ["ok"]


async def test_without_a_secret_the_mark_opens_nothing(tmp_path: Path) -> None:
    token = AdminToken(str(_token_file(tmp_path, OLD)), OLD)
    routes = guard({"/status.json": _ok}, token.current, True, None)
    assert (await routes["/status.json"](_req("/status.json", SECRET, forwarded=True))
            ).status == 401
