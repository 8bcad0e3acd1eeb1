"""``[sasl.upstream]``: the proxy logs in to the brokers as itself. The "broker" that
requires SASL is a second kproxy terminating SASL in front of tansu (tansu has no
SASL); the proxy under test terminates its clients' logins and logs in upstream with
SCRAM-SHA-512 and its own credentials. A wrong upstream password leaves the proxy
unready and says why in its log."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import scramp
import trio

from kproxy.embedded_broker import TansuBroker

from ..support import (
    KproxyProcess,
    broker_port_base,
    free_port,
    kproxy_process,
    stop_process,
)
from .test_proxy_inprocess import start_proxy

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def sasl_broker(shared_tansu: TansuBroker,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KproxyProcess, Path]]:
    """A SASL-only "broker": one process is enough for what it stands in for."""
    tmp = tmp_path_factory.mktemp("sasl-broker")
    (tmp / "users.toml").write_text('[users.the-proxy]\npassword = "proxy-secret"\n')
    (tmp / "broker.toml").write_text(f"""
audit_log = "{tmp / 'audit.log'}"
[sasl]
terminate = true
users_file = "{tmp / 'users.toml'}"
failed_login_delay = 0.1
""")
    with kproxy_process(shared_tansu.bootstrap, tmp, "--config", str(tmp / "broker.toml"),
                        "--workers", "1") as kp:
        yield kp, tmp


def _front(tmp: Path) -> Path:
    (tmp / "users.toml").write_text('[users.app]\npassword = "app-secret"\n')
    (tmp / "front.toml").write_text(f"""
[sasl]
terminate = true
mechanisms = ["SCRAM-SHA-256"]
users_file = "{tmp / 'users.toml'}"
[sasl.upstream]
mechanism = "SCRAM-SHA-512"
username = "the-proxy"
""")
    return tmp / "front.toml"


def test_the_proxy_logs_in_upstream_as_itself(sasl_broker: tuple[KproxyProcess, Path],
                                              tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient
    broker, broker_tmp = sasl_broker
    config = _front(tmp_path)
    with kproxy_process(broker.bootstrap, tmp_path, "--config", str(config),
                        env={"KPROXY_SASL_UPSTREAM_PASSWORD": "proxy-secret"}) as kp:
        admin = AdminClient({"bootstrap.servers": kp.bootstrap, "security.protocol":
                             "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                             "sasl.username": "app", "sasl.password": "app-secret"})
        assert admin.list_topics(timeout=20).brokers
    logins = [json.loads(line) for line in (broker_tmp / "audit.log").read_text().splitlines()]
    assert any(r["principal"] == "the-proxy" and r["mechanism"] == "SCRAM-SHA-512"
               and r["outcome"] == "ok" for r in logins)
    assert not any(r.get("principal") == "app" for r in logins)  # clients stop at the proxy


def test_a_wrong_upstream_password_is_reported(sasl_broker: tuple[KproxyProcess, Path],
                                               tmp_path: Path) -> None:
    broker, _ = sasl_broker
    config = _front(tmp_path)
    log = tmp_path / "front.log"
    # Not kproxy_process: that waits for a readiness this proxy must never reach.
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "kproxy.cli", "run", "--config",
                                 str(config), "--upstream", broker.bootstrap, "--listen",
                                 f"127.0.0.1:{free_port()}", "--http", f"127.0.0.1:{free_port()}",
                                 "--broker-port-base", str(broker_port_base()),
                                 "--node-id-range", "111-111", "--workers", "1"],
                                stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "KPROXY_SASL_UPSTREAM_PASSWORD": "wrong"})
    try:
        deadline = time.monotonic() + 30
        while "refused the proxy's SCRAM-SHA-512 login" not in log.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.1)
    finally:
        stop_process(proc)
    assert "wrong" not in log.read_text().replace("wrong-", "")  # the password is not logged


class LongestStep(trio.abc.Instrument):
    """The longest a task step held the event loop (wall time)."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._began: float | None = None  # None: the step it was added in

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._began = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if self._began is not None:
            self.longest = max(self.longest, time.perf_counter() - self._began)


async def test_the_upstream_scram_login_leaves_the_loop_free(
        shared_tansu: TansuBroker, nursery: trio.Nursery, tmp_path: Path) -> None:
    """The proxy's SCRAM proof needs PBKDF2 over the broker's iteration count. A broker
    holding the proxy's credential at 500,000 iterations makes each derivation long
    enough to see: while discovery logs in again and again, no step of the loop
    comes near one derivation's time."""
    iterations = 500_000
    salt, stored, server, _ = scramp.ScramMechanism("SCRAM-SHA-512").make_auth_info(
        "proxy-secret", iteration_count=iterations)
    began = time.perf_counter()
    hashlib.pbkdf2_hmac("sha512", b"proxy-secret", salt, iterations)
    derivation = time.perf_counter() - began
    b64 = {k: base64.b64encode(v).decode() for k, v in
           {"salt": salt, "stored_key": stored, "server_key": server}.items()}
    (tmp_path / "users.toml").write_text(
        "[users.the-proxy.scram_sha_512]\n" + f'iterations = {iterations}\n'
        + "".join(f'{k} = "{v}"\n' for k, v in b64.items()))
    audit = tmp_path / "audit.log"
    (tmp_path / "broker.toml").write_text(f"""
audit_log = "{audit}"
[sasl]
terminate = true
users_file = "{tmp_path / 'users.toml'}"
""")

    def logins() -> int:
        lines = audit.read_text().splitlines() if audit.exists() else []
        return sum(1 for line in lines if json.loads(line).get("outcome") == "ok")

    with kproxy_process(shared_tansu.bootstrap, tmp_path, "--config",
                        str(tmp_path / "broker.toml"), "--workers", "1") as broker:
        front = tmp_path / "front"
        front.mkdir()
        proxy = await start_proxy(nursery, broker.bootstrap, config_file=_front(front),
                                  sasl_upstream_password="proxy-secret",
                                  discovery_interval="0.1")
        assert proxy.backend.last_discovery is not None  # logged in once at start-up
        steps = LongestStep()
        trio.lowlevel.add_instrument(steps)
        try:
            first = logins()
            deadline = trio.current_time() + 60
            while logins() < first + 3:
                assert trio.current_time() < deadline, "discovery did not log in again"
                await trio.sleep(0.02)
        finally:
            trio.lowlevel.remove_instrument(steps)
    print(f"\nPBKDF2 of {iterations:,} iterations: {derivation * 1e3:.0f} ms; longest "
          f"loop step over 3 upstream logins: {steps.longest * 1e3:.1f} ms")
    assert steps.longest < derivation / 2
