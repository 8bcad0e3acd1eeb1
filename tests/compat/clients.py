"""The clients of the matrix: which package, which version, which driver.

Versions are pinned so a run is reproducible; "newest" is the newest release in the
registry when the entry was last updated (bump it here to follow a new release).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPAT_DIR = ROOT / ".compat"  # git-ignored: every client's own environment
DRIVERS = Path(__file__).resolve().parent / "drivers"


@dataclass(frozen=True)
class Client:
    name: str  # as people know it
    package: str  # registry name ("" for a system package)
    version: str
    kind: str  # "system", "pypi" or "npm"
    driver: str  # a file in drivers/, or "kcat"
    note: str = ""
    node22: bool = False  # needs Node 22+ (the `node` npm package provides one)
    build_from_source: bool = False

    @property
    def slug(self) -> str:
        return f"{self.package.replace('@', '').replace('/', '-')}-{self.version}"

    @property
    def env_dir(self) -> Path:
        return COMPAT_DIR / self.kind / self.slug


NODE22 = "22.23.3"  # the `node` npm package: a Node 22 binary from the npm registry

CLIENTS: tuple[Client, ...] = (
    Client("kcat (Debian 12)", "kcat", "system", "system", "kcat"),
    Client("confluent-kafka", "confluent-kafka", "2.16.1", "pypi", "confluent.py",
           note="newest"),
    Client("confluent-kafka", "confluent-kafka", "2.6.2", "pypi", "confluent.py"),
    Client("confluent-kafka", "confluent-kafka", "2.3.0", "pypi", "confluent.py"),
    Client("confluent-kafka", "confluent-kafka", "1.9.2", "pypi", "confluent.py"),
    Client("kafka-python", "kafka-python", "3.0.12", "pypi", "kafka_python.py", note="newest"),
    Client("kafka-python", "kafka-python", "2.0.2", "pypi", "kafka_python.py"),
    Client("aiokafka", "aiokafka", "0.14.0", "pypi", "aiokafka_driver.py", note="newest"),
    Client("aiokafka", "aiokafka", "0.10.0", "pypi", "aiokafka_driver.py"),
    Client("kafkajs", "kafkajs", "2.2.4", "npm", "kafkajs.mjs"),
    Client("@platformatic/kafka", "@platformatic/kafka", "2.12.1", "npm", "platformatic.mjs",
           note="newest", node22=True),
    Client("@confluentinc/kafka-javascript", "@confluentinc/kafka-javascript", "1.10.1", "npm",
           "confluent_js.mjs", note="newest; built here from its bundled librdkafka",
           build_from_source=True),
)


def by_slug(slug: str) -> Client:
    for c in CLIENTS:
        if c.slug == slug or c.driver == slug:
            return c
    raise KeyError(slug)
