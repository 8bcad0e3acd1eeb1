"""Shared fixtures: a real tansu broker on a free loopback port, and the captured vectors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kproxy.embedded_broker import TansuBroker

VECTORS = Path(__file__).parent / "vectors"


@dataclass(frozen=True)
class Vector:
    client: str
    direction: str
    api_key: int
    api_name: str
    api_version: int
    frame: bytes

    @property
    def id(self) -> str:
        return f"{self.client}-{self.api_name}-v{self.api_version}-{self.direction}"


def load_vectors() -> list[Vector]:
    out: list[Vector] = []
    for path in sorted(VECTORS.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            out.append(Vector(row["client"], row["direction"], row["api_key"], row["api_name"],
                              row["api_version"], bytes.fromhex(row["hex"])))
    return out


@pytest.fixture
def tansu(tmp_path: Path) -> Iterator[TansuBroker]:
    """A fresh in-memory tansu broker for one test; stopped afterwards."""
    with TansuBroker(log_path=tmp_path / "tansu.log") as broker:
        yield broker


@pytest.fixture
def blue_green(tmp_path: Path) -> Iterator[tuple[TansuBroker, TansuBroker]]:
    """Two single-broker clusters, "blue" and "green", for swaps behind the proxy."""
    blue = TansuBroker(cluster_id="blue", log_path=tmp_path / "blue.log").start()
    green = TansuBroker(cluster_id="green", log_path=tmp_path / "green.log").start()
    try:
        yield blue, green
    finally:
        blue.stop()
        green.stop()


@pytest.fixture(scope="session")
def shared_tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    """One broker for the tests that only need *a* broker and use their own topics."""
    log = tmp_path_factory.mktemp("tansu") / "tansu.log"
    with TansuBroker(log_path=log) as broker:
        yield broker


@pytest.fixture
def s3_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A local S3 emulator (moto) with a bucket "tansu"; the environment tansu needs for it.

    Brokers started with ``storage="s3://tansu/"`` and this environment keep their
    data across restarts and can share it.
    """
    import shutil
    import subprocess
    import sys

    import boto3

    from kproxy.embedded_broker import wait_for_port

    from .support import free_port

    port = free_port()
    moto_bin = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
    with open(tmp_path / "moto.log", "wb") as moto_log:
        moto = subprocess.Popen([moto_bin, "-H", "127.0.0.1", "-p", str(port)],
                                stdout=moto_log, stderr=subprocess.STDOUT)
    try:
        assert wait_for_port("127.0.0.1", port, 30), "moto server did not start"
        env = {"AWS_ENDPOINT": f"http://127.0.0.1:{port}", "AWS_ALLOW_HTTP": "true",
               "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
               "AWS_DEFAULT_REGION": "us-east-1"}
        boto3.client("s3", endpoint_url=env["AWS_ENDPOINT"], aws_access_key_id="test",
                     aws_secret_access_key="test", region_name="us-east-1",
                     ).create_bucket(Bucket="tansu")
        yield env
    finally:
        moto.terminate()
        moto.wait(10)
