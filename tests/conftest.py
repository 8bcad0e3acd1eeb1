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


@pytest.fixture(scope="session")
def shared_tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    """One broker for the tests that only need *a* broker and use their own topics."""
    log = tmp_path_factory.mktemp("tansu") / "tansu.log"
    with TansuBroker(log_path=log) as broker:
        yield broker
