"""``[sasl.upstream]``: the proxy logs in to the brokers as itself. The "broker" that
requires SASL is a second kproxy terminating SASL in front of tansu (tansu has no
SASL); the proxy under test terminates its clients' logins and logs in upstream with
SCRAM-SHA-512 and its own credentials. A wrong upstream password leaves the proxy
unready and says why in its log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kproxy.embedded_broker import TansuBroker

from ..support import (
    KproxyProcess,
    broker_port_base,
    free_port,
    kproxy_process,
    stop_process,
)

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


def front_config(tmp: Path, client_mechanism: str = "SCRAM-SHA-256") -> Path:
    """The proxy under test: its clients log in as app (``client_mechanism``), and it
    logs in upstream as the-proxy with SCRAM-SHA-512."""
    (tmp / "users.toml").write_text('[users.app]\npassword = "app-secret"\n')
    (tmp / "front.toml").write_text(f"""
[sasl]
terminate = true
mechanisms = ["{client_mechanism}"]
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
    config = front_config(tmp_path)
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
    config = front_config(tmp_path)
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

