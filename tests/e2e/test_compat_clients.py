"""The representative subset of `make compat` that runs in `make test`: kcat and kafkajs.

Debian's kcat (librdkafka 2.0.2) cannot read tansu's ApiVersions response (all four
tagged fields written at their defaults); through kproxy, which writes Kafka's
canonical encoding, it lists metadata, produces, consumes in a group and commits.
kafkajs (npm, installed under .compat/ by `make compat-test-tools`) passes both ways.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kproxy.embedded_broker import TansuBroker

from ..compat import kcat
from ..compat.backend import start_tansu
from ..compat.clients import by_slug
from ..compat.install import failure, installed
from ..compat.runner import run_client
from ..support import KproxyProcess, kproxy_process

pytestmark = pytest.mark.broker
KAFKAJS = by_slug("kafkajs-2.2.4")


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    broker = start_tansu(tmp_path_factory.mktemp("tansu") / "tansu.log")
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def proxy(backend: TansuBroker, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[KproxyProcess]:
    with kproxy_process(backend.bootstrap, tmp_path_factory.mktemp("kproxy")) as kp:
        yield kp


def test_clients_are_installed() -> None:
    assert kcat.available(), "kcat missing: `make test-tools` installs Debian's kcat"
    assert installed(KAFKAJS), failure(KAFKAJS) or "`make compat-test-tools` installs kafkajs"


def test_kcat_fails_direct_against_tansu(backend: TansuBroker) -> None:
    """The backend bug this proxy works around (if tansu fixes it, update the docs)."""
    out = run_client(by_slug("kcat"), backend.bootstrap, "direct")
    assert not out.ok
    assert "Read underflow" in out.error, out.error


def test_kcat_works_through_kproxy(proxy: KproxyProcess) -> None:
    out = run_client(by_slug("kcat"), proxy.bootstrap, "kproxy")
    assert out.ok, (out.steps, out.error, proxy.log()[-2000:])
    assert [out.steps[s] for s in ("produce", "consume", "commit")] == ["ok"] * 3


@pytest.mark.parametrize("target", ["direct", "kproxy"])
def test_kafkajs_both_ways(backend: TansuBroker, proxy: KproxyProcess, target: str) -> None:
    bootstrap = backend.bootstrap if target == "direct" else proxy.bootstrap
    out = run_client(KAFKAJS, bootstrap, target)
    assert out.ok, (out.steps, out.error)
    assert [out.steps[s] for s in ("admin", "produce", "consume", "commit")] == ["ok"] * 4
    assert not out.steps["groups"].startswith("fail"), out.steps["groups"]
