"""The representative subset of `make compat` that runs in `make test`.

Debian's kcat (librdkafka 2.0.2) cannot read tansu's ApiVersions response (all four
tagged fields written at their defaults); through kproxy, which writes Kafka's
canonical encoding, it lists metadata, produces, consumes in a group and commits.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kproxy.embedded_broker import TansuBroker

from .compat import kcat
from .compat.backend import start_tansu
from .support import kproxy_process

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    broker = start_tansu(tmp_path_factory.mktemp("tansu") / "tansu.log")
    try:
        yield broker
    finally:
        broker.stop()


def _names() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"compat-{tag}", f"compat-group-{tag}"


def test_kcat_is_installed() -> None:
    assert kcat.available(), "kcat missing: `make test-tools` installs Debian's kcat"


def test_kcat_fails_direct_against_tansu(backend: TansuBroker) -> None:
    """The backend bug this proxy works around (if tansu fixes it, update the docs)."""
    out = kcat.run(backend.bootstrap, *_names())
    assert not out.ok
    assert "Read underflow" in out.error, out.error


def test_kcat_works_through_kproxy(backend: TansuBroker, tmp_path: Path) -> None:
    with kproxy_process(backend.bootstrap, tmp_path) as kp:
        out = kcat.run(kp.bootstrap, *_names())
        assert out.ok, (out.steps, out.error, kp.log()[-2000:])
        assert out.steps == {"admin": out.steps["admin"], "produce": "ok", "consume": "ok",
                             "commit": "ok", "groups": out.steps["groups"]}
