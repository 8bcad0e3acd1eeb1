"""Password-key derivations (PBKDF2) never hold the event loop.

Two logins derive a SCRAM key from a password: the proxy's own SCRAM login at a broker
(``[sasl.upstream]``: every upstream connection, discovery's among them), and a client's
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

from ..support import RawClient, audit_records, kproxy_process
from .test_proxy_inprocess import start_proxy
from .test_sasl_upstream_e2e import front_config

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
    derivation of them takes here (seconds): the quickest of three, as the proxy's own
    may run on a quieter moment of a busy machine than any one of these."""
    salt, stored, server, _ = scramp.ScramMechanism("SCRAM-SHA-512").make_auth_info(
        password, iteration_count=ITERATIONS)
    timings = []
    for _ in range(3):
        began = time.perf_counter()
        hashlib.pbkdf2_hmac("sha512", password.encode(), salt, ITERATIONS)
        timings.append(time.perf_counter() - began)
    derivation = min(timings)
    keys = {"salt": salt, "stored_key": stored, "server_key": server}
    (tmp / "users.toml").write_text(
        f"[users.{user}.scram_sha_512]\niterations = {ITERATIONS}\n"
        + "".join(f'{k} = "{base64.b64encode(v).decode()}"\n' for k, v in keys.items()))
    return derivation


async def plain_login(client: RawClient, plain: bytes) -> int:
    """A PLAIN login on ``client`` (``authzid NUL name NUL password``): the answer's
    error code."""
    await client.request(api_keys.SASL_HANDSHAKE, 1, 1, {"mechanism": "PLAIN"})
    answer = await client.request(api_keys.SASL_AUTHENTICATE, 2, 2, {"auth_bytes": plain})
    code: int = answer.body["error_code"]
    return code


async def test_the_upstream_scram_login_leaves_the_loop_free(
        shared_tansu: TansuBroker, nursery: trio.Nursery, tmp_path: Path) -> None:
    """The broker (a kproxy terminating SASL) holds the proxy's own credential; three
    clients connect at once, and each connection's upstream logs in as the proxy."""
    derivation = stored_keys(tmp_path, "the-proxy", "proxy-secret")
    audit = tmp_path / "audit.log"
    (tmp_path / "broker.toml").write_text(f"""
audit_log = "{audit}"
[sasl]
terminate = true
users_file = "{tmp_path / 'users.toml'}"
""")
    front = tmp_path / "front"
    front.mkdir()

    def logins() -> int:
        lines = audit.read_text().splitlines() if audit.exists() else []
        return sum(1 for line in lines if json.loads(line).get("outcome") == "ok")

    with kproxy_process(shared_tansu.bootstrap, tmp_path, "--config",
                        str(tmp_path / "broker.toml"), "--workers", "1") as broker:
        proxy = await start_proxy(nursery, broker.bootstrap,
                                  config_file=front_config(front, "PLAIN"),
                                  sasl_upstream_password="proxy-secret")
        port = proxy.bootstrap_port
        assert port is not None and logins() == 1  # discovery's, at start-up
        steps = LongestStep()
        trio.lowlevel.add_instrument(steps)
        brokers: list[int] = []

        async def client() -> None:
            client = await RawClient.connect(port)
            try:
                assert await plain_login(client, b"\0app\0app-secret") == ErrorCode.NONE
                # forwarded: the connection's upstream is opened, and logs in, now
                metadata = await client.request(api_keys.METADATA, 4, 3, {
                    "topics": [], "allow_auto_topic_creation": False})
                brokers.append(len(metadata.body["brokers"]))
            finally:
                await client.aclose()

        try:
            async with trio.open_nursery() as clients:
                for _ in range(3):
                    clients.start_soon(client)
        finally:
            trio.lowlevel.remove_instrument(steps)
        assert brokers == [1, 1, 1] and logins() == 4  # each upstream logged in
    print(f"\nPBKDF2 of {ITERATIONS:,} iterations: {derivation * 1e3:.0f} ms; longest "
          f"loop step over 3 upstream logins: {steps.longest * 1e3:.1f} ms")
    assert steps.longest < derivation / 2


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
        client = await RawClient.connect(port)
        try:
            code = await plain_login(client, b"\0bob\0" + password.encode())
            # a refusal is followed by the close
            results[password] = code, bool(code) and await client.read_frame() is None
        finally:
            await client.aclose()

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


async def test_plain_against_stored_keys_in_every_worker(
        shared_tansu: TansuBroker, tmp_path: Path) -> None:
    """`kproxy run` with its default workers: the right password logs in at each
    worker; a wrong guess, an unknown name and a password user (beside a stored-key
    one) are all answered only after a derivation (one answered sooner would tell
    the names apart)."""
    derivation = stored_keys(tmp_path, "bob", "bob-secret")
    with (tmp_path / "users.toml").open("a") as users:
        users.write('[users.carol]\npassword = "carol-secret"\n')
    delay = 0.1
    (tmp_path / "kproxy.toml").write_text(f"""
audit_log = "{tmp_path / 'audit.log'}"
[sasl]
terminate = true
mechanisms = ["PLAIN"]
users_file = "{tmp_path / 'users.toml'}"
failed_login_delay = {delay}
""")

    async def login(plain: bytes) -> tuple[int, float]:
        client = await RawClient.connect(kp.bootstrap_port)
        try:
            began = time.monotonic()
            return await plain_login(client, plain), time.monotonic() - began
        finally:
            await client.aclose()

    def ok_pids() -> set[int]:
        return {r["pid"] for r in audit_records(tmp_path) if r.get("outcome") == "ok"}

    with kproxy_process(shared_tansu.bootstrap, tmp_path, "--config",
                        str(tmp_path / "kproxy.toml")) as kp:
        assert len(kp.worker_pids()) >= 2  # the default: one per core
        assert "password users beside users with stored SCRAM keys" in kp.log()
        for _ in range(40):  # connections land on either worker; 40 misses one 1 in 10^11
            assert (await login(b"\0bob\0bob-secret"))[0] == ErrorCode.NONE
            if len(ok_pids()) == 2:
                break
        assert len(ok_pids()) == 2, "every login landed on one worker"
        # a password user's answer waits for a derivation too, beside a stored-key user
        for plain, wanted, least in (
                (b"\0bob\0guess", ErrorCode.SASL_AUTHENTICATION_FAILED, delay),
                (b"\0mallory\0guess", ErrorCode.SASL_AUTHENTICATION_FAILED, delay),
                (b"\0carol\0guess", ErrorCode.SASL_AUTHENTICATION_FAILED, delay),
                (b"\0carol\0carol-secret", ErrorCode.NONE, 0.0)):
            code, took = await login(plain)
            print(f"\n{plain!r}: answered after {took * 1e3:.0f} ms (derivation "
                  f"{derivation * 1e3:.0f} ms, failed-login delay {delay * 1e3:.0f} ms)")
            assert code == wanted
            assert took >= least + derivation / 2
