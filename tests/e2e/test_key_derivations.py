"""Password-key derivations (PBKDF2) never hold the event loop.

Two logins derive a SCRAM key from a password: the proxy's own SCRAM login at a broker
(``[sasl.upstream]``: every upstream connection, discovery's included), and a client's
PLAIN login checked against stored SCRAM keys. Each costs 1 to 10 ms at Kafka's
iteration counts, all of it on the loop before (every other connection waited). Here
the credentials are stored at 500,000 iterations, so that one derivation is long
enough to see beside any loop step: while logins are derived, no step of the loop
comes near one derivation's time, and the logins still come out right.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from pathlib import Path

import pytest
import scramp
import trio

from kproxy.codecs import api_keys
from kproxy.codecs.error_codes import ErrorCode
from kproxy.embedded_broker import TansuBroker

from ..support import RawClient, kproxy_process
from .test_proxy_inprocess import start_proxy
from .test_sasl_upstream_e2e import _front

pytestmark = pytest.mark.broker
ITERATIONS = 500_000


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


def stored_keys(tmp: Path, user: str, password: str) -> float:
    """A users file holding ``user``'s SCRAM-SHA-512 keys at ``ITERATIONS``; what one
    derivation of them takes here (seconds)."""
    salt, stored, server, _ = scramp.ScramMechanism("SCRAM-SHA-512").make_auth_info(
        password, iteration_count=ITERATIONS)
    began = time.perf_counter()
    hashlib.pbkdf2_hmac("sha512", password.encode(), salt, ITERATIONS)
    derivation = time.perf_counter() - began
    keys = {"salt": salt, "stored_key": stored, "server_key": server}
    (tmp / "users.toml").write_text(
        f"[users.{user}.scram_sha_512]\niterations = {ITERATIONS}\n"
        + "".join(f'{k} = "{base64.b64encode(v).decode()}"\n' for k, v in keys.items()))
    return derivation


async def test_the_upstream_scram_login_leaves_the_loop_free(
        shared_tansu: TansuBroker, nursery: trio.Nursery, tmp_path: Path) -> None:
    """The broker (a kproxy terminating SASL) holds the proxy's own credential; the
    proxy under test logs in again at each discovery."""
    derivation = stored_keys(tmp_path, "the-proxy", "proxy-secret")
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
    print(f"\nPBKDF2 of {ITERATIONS:,} iterations: {derivation * 1e3:.0f} ms; longest "
          f"loop step over 3 upstream logins: {steps.longest * 1e3:.1f} ms")
    assert steps.longest < derivation / 2


async def plain_login(port: int, password: str) -> tuple[int, bool]:
    """A PLAIN login on a new connection: the answer's error code, and whether the
    proxy then closed the connection."""
    client = await RawClient.connect(port)
    try:
        await client.request(api_keys.SASL_HANDSHAKE, 1, 1, {"mechanism": "PLAIN"})
        answer = await client.request(api_keys.SASL_AUTHENTICATE, 2, 2,
                                      {"auth_bytes": b"\0bob\0" + password.encode()})
        code = answer.body["error_code"]
        closed = await client.read_frame(timeout=10) is None if code else False
        return code, closed
    finally:
        await client.aclose()


async def test_a_plain_login_against_stored_keys_leaves_the_loop_free(
        shared_tansu: TansuBroker, nursery: trio.Nursery, tmp_path: Path) -> None:
    """Two PLAIN logins at once, one right and one wrong, against keys stored at
    500,000 iterations: answered once derived (the wrong one after the failed-login
    delay, then closed), with the loop free meanwhile."""
    derivation = stored_keys(tmp_path, "bob", "bob-secret")
    (tmp_path / "kproxy.toml").write_text(f"""
[sasl]
terminate = true
mechanisms = ["PLAIN"]
users_file = "{tmp_path / 'users.toml'}"
failed_login_delay = 0.1
""")
    proxy = await start_proxy(nursery, shared_tansu.bootstrap,
                              config_file=tmp_path / "kproxy.toml")
    port = proxy.bootstrap_port
    assert port is not None
    steps = LongestStep()
    trio.lowlevel.add_instrument(steps)
    results: dict[str, tuple[int, bool]] = {}

    async def login(password: str) -> None:
        results[password] = await plain_login(port, password)

    try:
        async with trio.open_nursery() as logins:
            logins.start_soon(login, "bob-secret")
            logins.start_soon(login, "guess")
    finally:
        trio.lowlevel.remove_instrument(steps)
    print(f"\nPBKDF2 of {ITERATIONS:,} iterations: {derivation * 1e3:.0f} ms; longest "
          f"loop step over 2 PLAIN logins: {steps.longest * 1e3:.1f} ms")
    assert results["bob-secret"] == (ErrorCode.NONE, False)
    assert results["guess"] == (ErrorCode.SASL_AUTHENTICATION_FAILED, True)
    assert steps.longest < derivation / 2
