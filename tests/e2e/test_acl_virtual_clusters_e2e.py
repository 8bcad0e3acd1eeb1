"""ACLs and a virtual cluster together, end to end: `kproxy run` (two workers) in front
of tansu, users logging in with SASL PLAIN on the virtual cluster's listener, `[[acls]]`
written on the tenant's own names. With confluent-kafka: an allowed topic produces and
consumes through the virtual cluster; a denied one gets TOPIC_AUTHORIZATION_FAILED; the
patterns match the tenant's names, never the prefixed ones the backend holds; Metadata
lists only the tenant's topics the principal may describe."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kproxy.embedded_broker import TansuBroker

from ..support import KproxyProcess, broker_port_base, free_port, kproxy_process, value_of

pytestmark = pytest.mark.broker
RUN = uuid.uuid4().hex[:6]
PREFIX = f"t{RUN}."
USERS = """
[users.alice]
password = "alice-secret"
"""
# "orders*" matches the tenant's "orders" but not the backend's "t<run>.orders"; the rule
# on the prefixed name "t<run>.pay*" must never match what the tenant names "payments".
ACLS = f"""
[[acls]]
principal = "User:alice"
operations = ["READ", "WRITE", "CREATE"]
resource = "topic"
pattern = "orders*"
permission = "allow"
[[acls]]
principal = "User:alice"
operations = ["ALL"]
resource = "topic"
pattern = "{PREFIX}pay*"
permission = "allow"
[[acls]]
principal = "User:*"
operations = ["READ"]
resource = "group"
pattern = "g-*"
permission = "allow"
"""


class Bed:
    def __init__(self, kp: KproxyProcess, port: int, backend: str) -> None:
        self.kp, self.port, self.backend = kp, port, backend

    def ck(self, **extra: Any) -> dict[str, Any]:
        return {"bootstrap.servers": f"127.0.0.1:{self.port}",
                "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                "sasl.username": "alice", "sasl.password": "alice-secret", **extra}


@pytest.fixture(scope="module")
def bed(shared_tansu: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    from confluent_kafka.admin import AdminClient, NewTopic
    tmp = tmp_path_factory.mktemp("acl-vc")
    (tmp / "users.toml").write_text(USERS)
    port, base = free_port(), broker_port_base()
    (tmp / "kproxy.toml").write_text(f"""
[sasl]
terminate = true
mechanisms = ["PLAIN"]
users_file = "{tmp / 'users.toml'}"
[[virtual_clusters]]
name = "tenant"
listen = "127.0.0.1:{port}"
broker_port_base = {base}
prefix = "{PREFIX}"
{ACLS}
""")
    # Straight at the backend: the tenant's topics alice may not describe, and one
    # outside the tenant that her pattern would match by name.
    backend = AdminClient({"bootstrap.servers": shared_tansu.bootstrap})
    names = [f"{PREFIX}orders", f"{PREFIX}orders-b", f"{PREFIX}secret", f"{PREFIX}payments",
             f"orders-outside-{RUN}"]
    for future in backend.create_topics([NewTopic(n, 1, 1) for n in names]).values():
        future.result(20)
    with kproxy_process(shared_tansu.bootstrap, tmp, "--config", str(tmp / "kproxy.toml")) as kp:
        yield Bed(kp, port, shared_tansu.bootstrap)


def _produce(bed: Bed, topic: str) -> Any:
    from confluent_kafka import Producer
    producer = Producer(bed.ck(**{"message.timeout.ms": 10000}))
    results: list[Any] = []
    producer.produce(topic, b"through the tenant", on_delivery=lambda e, _m: results.append(e))
    producer.flush(15)
    return results[0] if results else "no delivery report"


def test_allowed_topic_produces_and_consumes_through_the_virtual_cluster(bed: Bed) -> None:
    from confluent_kafka import Consumer, KafkaError
    assert _produce(bed, "orders") is None
    consumer = Consumer(bed.ck(**{"group.id": "g-1", "auto.offset.reset": "earliest",
                                  "session.timeout.ms": 6000,
                                  "enable.partition.eof": True}))
    consumer.subscribe(["orders"])
    got: list[bytes] = []
    errors: list[int] = []
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and not got:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if (error := msg.error()) is None:
            got.append(value_of(msg))
        elif error.code() != KafkaError._PARTITION_EOF:
            errors.append(error.code())
    consumer.close()
    assert got == [b"through the tenant"], errors
    # The backend holds the record under the prefixed name.
    backend = Consumer({"bootstrap.servers": bed.backend, "group.id": f"direct-{RUN}",
                        "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    backend.subscribe([f"{PREFIX}orders"])
    direct: list[bytes] = []
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and not direct:
        msg = backend.poll(0.5)
        if msg is not None and msg.error() is None:
            direct.append(value_of(msg))
    backend.close()
    assert direct == [b"through the tenant"]


def test_denied_topic_gets_topic_authorization_failed(bed: Bed) -> None:
    from confluent_kafka import KafkaError
    err = _produce(bed, "secret")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_patterns_match_the_tenants_names_not_the_prefixed_ones(bed: Bed) -> None:
    """``t<run>.pay*`` allows ALL on the backend's name ``t<run>.payments``; the tenant
    names it ``payments``, which no rule allows: denied. ``orders*`` allows ``orders``
    (the backend's ``t<run>.orders``, which it does not match): allowed, above."""
    from confluent_kafka import KafkaError
    err = _produce(bed, "payments")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_metadata_lists_only_the_tenants_describable_topics(bed: Bed) -> None:
    from confluent_kafka.admin import AdminClient
    admin = AdminClient(bed.ck())
    deadline = time.monotonic() + 20
    topics: set[str] = set()
    while time.monotonic() < deadline and topics != {"orders", "orders-b"}:
        topics = set(admin.list_topics(timeout=15).topics)
        time.sleep(0.2)
    # Not "secret" or "payments" (the tenant's, not describable), not the backend's
    # "orders-outside-<run>" (another namespace), nothing prefixed.
    assert topics == {"orders", "orders-b"}
