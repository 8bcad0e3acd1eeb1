"""The admin token rotated under a running `kproxy run` (two workers, the default here):
the supervisor and each worker take the new token and refuse the old without a restart,
the supervisor's page still merges both workers (its calls to them carry its own
secret, not the token), a file changed into a bad one keeps the running token, and the
audit log records each change once, never the token."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kproxy.embedded_broker import TansuBroker

from ..support import audit_records, kproxy_process, wait_until

pytestmark = pytest.mark.broker
OLD, NEW = "rotation-old-token-0123", "rotation-new-token-4567"


def _write(path: Path, token: str) -> None:
    """A new file renamed over the old one, as a mounted Secret is updated."""
    fresh = path.with_suffix(".new")
    fresh.write_text(token + "\n")
    fresh.chmod(0o600)
    os.replace(fresh, path)


def _get(port: int, path: str, token: str | None) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 headers={"authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()




def test_a_rotated_admin_token_applies_in_every_process_without_a_restart(
        shared_tansu: TansuBroker, tmp_path: Path) -> None:
    token_file = tmp_path / "admin.token"
    _write(token_file, OLD)
    (tmp_path / "kproxy.toml").write_text(f"""
audit_log = "{tmp_path / 'audit.log'}"
admin = true
admin_token_file = "{token_file}"
status_auth = true
""")
    with kproxy_process(shared_tansu.bootstrap, tmp_path, "--config",
                        str(tmp_path / "kproxy.toml")) as kp:
        status, body = _get(kp.http_port, "/status.json", OLD)
        assert status == 200
        workers = [w["http_port"] for w in json.loads(body)["workers"]]
        assert len(workers) == 2

        _write(token_file, NEW)
        wait_until(lambda: _get(kp.http_port, "/status.json", NEW)[0] == 200)
        assert _get(kp.http_port, "/status.json", OLD)[0] == 401
        for port in workers:  # each worker looks at the file for its own port
            def takes_the_new_token(port: int = port) -> bool:
                return _get(port, "/internal/sample", NEW)[0] == 200
            wait_until(takes_the_new_token)
            assert _get(port, "/internal/sample", OLD)[0] == 401

        # The supervisor still reaches both workers: its page merges their samples.
        def merged() -> bool:
            code, page = _get(kp.http_port, "/status.json", NEW)
            rows = json.loads(page)["workers"] if code == 200 else []
            return len(rows) == 2 and all(w["answered"] and w["ready"] for w in rows)
        wait_until(merged)
        post = urllib.request.Request(f"http://127.0.0.1:{kp.http_port}/admin/rebootstrap",
                                      method="POST", data=b"",
                                      headers={"authorization": f"Bearer {NEW}"})
        with urllib.request.urlopen(post, timeout=20) as resp:
            assert resp.status == 200

        # A file changed into one that cannot serve: the running token stays.
        _write(token_file, "short")
        wait_until(lambda: any(r["event"] == "admin_token" and r["outcome"] == "rejected"
                               for r in audit_records(tmp_path)))
        assert _get(kp.http_port, "/status.json", NEW)[0] == 200
        assert _get(kp.http_port, "/status.json", "short")[0] == 401

    records = audit_records(tmp_path)
    changes = [(r["outcome"], r["process"]) for r in records if r["event"] == "admin_token"]
    assert changes == [("applied", "supervisor"), ("rejected", "supervisor")]
    admin = [r for r in records if r["event"] == "admin"]
    assert [(r["outcome"], r["process"]) for r in admin] == [("ok", "supervisor")]
    text = (tmp_path / "audit.log").read_text()
    assert OLD not in text and NEW not in text


def test_without_a_token_an_admin_call_is_audited_once(shared_tansu: TansuBroker,
                                                       tmp_path: Path) -> None:
    """The supervisor passes the call on to both workers with its secret: they do not
    audit it again (they did, with no token set, before the secret)."""
    (tmp_path / "kproxy.toml").write_text(f"""
audit_log = "{tmp_path / 'audit.log'}"
admin = true
""")
    with kproxy_process(shared_tansu.bootstrap, tmp_path, "--config",
                        str(tmp_path / "kproxy.toml")) as kp:
        post = urllib.request.Request(f"http://127.0.0.1:{kp.http_port}/admin/rebootstrap",
                                      method="POST", data=b"")
        with urllib.request.urlopen(post, timeout=20) as resp:
            assert resp.status == 200
    admin = [r for r in audit_records(tmp_path) if r["event"] == "admin"]
    assert [(r["outcome"], r["process"]) for r in admin] == [("ok", "supervisor")]
