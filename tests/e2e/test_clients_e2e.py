"""Real clients through the real proxy (a `kproxy run` subprocess) to a real tansu broker.

For confluent-kafka, kafka-python and aiokafka: create a topic, produce 10,000 keyed
messages, consume them with a two-member group committing as it goes, restart one
member, and check that every message arrived exactly once and in per-partition
order, and that the client only ever learned and used proxy addresses.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from kproxy.embedded_broker import TansuBroker

from ..support import KproxyProcess, direct_connections, kproxy_process

MESSAGES = 10_000
PARTITIONS = 2
DEADLINE = 120.0
pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    log = tmp_path_factory.mktemp("tansu") / "tansu.log"
    with TansuBroker(log_path=log) as broker:
        yield broker


@pytest.fixture
def proxy(backend: TansuBroker, tmp_path: Path) -> Iterator[KproxyProcess]:
    with kproxy_process(backend.bootstrap, tmp_path) as kp:
        yield kp


class Ledger:
    """What the consumers saw: every (partition, offset, value), checked at the end."""

    def __init__(self) -> None:
        self.by_partition: dict[int, list[int]] = defaultdict(list)
        self.count = 0

    def add(self, partition: int, value: bytes) -> None:
        self.by_partition[partition].append(int(value))
        self.count += 1

    def check(self) -> None:
        values = [v for vs in self.by_partition.values() for v in vs]
        assert sorted(values) == list(range(MESSAGES)), (
            f"{len(values)} delivered, {len(set(values))} distinct, expected {MESSAGES}")
        for partition, vs in self.by_partition.items():
            assert vs == sorted(vs), f"partition {partition} out of order"
        assert len(self.by_partition) == PARTITIONS


def assert_only_proxy(kp: KproxyProcess, backend: TansuBroker,
                      hosts_ports: Sequence[tuple[str | None, int]],
                      ) -> None:
    proxy_ports = {kp.bootstrap_port, kp.broker_port_base}
    assert hosts_ports, "the client reported no brokers"
    for host, port in hosts_ports:
        assert (host, port) != ("127.0.0.1", backend.port)
        assert port in proxy_ports, f"client learned {host}:{port}"
    assert direct_connections(os.getpid(), backend.port) == 0


def run_group(poll_member: Callable[[object], list[tuple[int, bytes]]],
              commit: Callable[[object], None], make: Callable[[], object],
              close: Callable[[object], None], ledger: Ledger) -> None:
    """Two members poll in turn and commit after every batch; B restarts half way."""
    members = [make(), make()]
    restarted = False
    deadline = time.monotonic() + DEADLINE
    while ledger.count < MESSAGES and time.monotonic() < deadline:
        for m in members:
            batch = poll_member(m)
            for partition, value in batch:
                ledger.add(partition, value)
            if batch:
                commit(m)
        if not restarted and ledger.count >= MESSAGES // 3:
            close(members.pop())  # member B goes away with its offsets committed...
            members.append(make())  # ...and comes back, resuming from them
            restarted = True
    for m in members:
        close(m)
    assert restarted


def test_confluent_kafka(proxy: KproxyProcess, backend: TansuBroker) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic, group = f"ck-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS)])[topic].result(20)
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "enable.idempotence": True,
                         "linger.ms": 5})
    failures: list[object] = []

    def report(err: object, _msg: object) -> None:
        if err:
            failures.append(err)
    for i in range(MESSAGES):
        producer.produce(topic, key=f"key-{i % 97}".encode(), value=str(i).encode(),
                         on_delivery=report)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0 and not failures

    def make() -> Consumer:
        c = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": group,
                      "auto.offset.reset": "earliest", "enable.auto.commit": False,
                      "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000})
        c.subscribe([topic])
        return c

    def poll(c: object) -> list[tuple[int, bytes]]:
        msgs = c.consume(500, timeout=0.5)  # type: ignore[attr-defined]
        out = []
        for msg in msgs:
            assert not msg.error(), msg.error()
            out.append((msg.partition(), msg.value()))
        return out

    ledger = Ledger()
    run_group(poll, lambda c: c.commit(asynchronous=False),  # type: ignore[attr-defined]
              make, lambda c: c.close(), ledger)  # type: ignore[attr-defined]
    ledger.check()

    brokers = admin.list_topics(timeout=10).brokers
    described = admin.describe_consumer_groups([group])[group].result(20)
    seen = [(b.host, b.port) for b in brokers.values()]
    seen.append((described.coordinator.host, described.coordinator.port))
    assert_only_proxy(proxy, backend, seen)


def test_kafka_python(proxy: KproxyProcess, backend: TansuBroker) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic

    topic, group = f"kp-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=proxy.bootstrap)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, enable_idempotence=True,
                             acks="all", linger_ms=5)
    futures = [producer.send(topic, key=f"key-{i % 97}".encode(), value=str(i).encode())
               for i in range(MESSAGES)]
    producer.flush(60)
    assert all(f.succeeded() for f in futures)
    producer.close()

    def make() -> KafkaConsumer:
        return KafkaConsumer(topic, bootstrap_servers=proxy.bootstrap, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             session_timeout_ms=6000, heartbeat_interval_ms=1000)

    def poll(c: object) -> list[tuple[int, bytes]]:
        records = c.poll(timeout_ms=500, max_records=500)  # type: ignore[attr-defined]
        return [(tp.partition, r.value) for tp, rs in records.items() for r in rs]

    ledger = Ledger()
    seen: list[tuple[str, int]] = []

    def close(c: object) -> None:
        # What this member learned: brokers and the group coordinator it used.
        cluster = c._client.cluster  # type: ignore[attr-defined]
        seen.extend((b.host, b.port) for b in cluster.brokers())
        seen.extend((b.host, b.port) for b in cluster._coordinator_brokers.values())
        c.close()  # type: ignore[attr-defined]

    run_group(poll, lambda c: c.commit(), make, close, ledger)  # type: ignore[attr-defined]
    ledger.check()
    assert any(port == proxy.broker_port_base for _, port in seen)
    admin.close()
    assert_only_proxy(proxy, backend, seen)


def test_aiokafka(proxy: KproxyProcess, backend: TansuBroker) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    topic, group = f"ak-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    ledger = Ledger()
    seen: list[tuple[str, int]] = []

    async def scenario() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=proxy.bootstrap)
        await admin.start()
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
        await admin.close()
        # tansu answers aiokafka's InitProducerId with UNKNOWN (-1), so this producer
        # is not idempotent; acks=all and in-order batches still keep every message.
        producer = AIOKafkaProducer(bootstrap_servers=proxy.bootstrap, acks="all",
                                    linger_ms=5)
        await producer.start()
        batch = [await producer.send(topic, key=f"key-{i % 97}".encode(),
                                     value=str(i).encode()) for i in range(MESSAGES)]
        await asyncio.gather(*batch)
        await producer.stop()

        def make() -> AIOKafkaConsumer:
            return AIOKafkaConsumer(topic, bootstrap_servers=proxy.bootstrap, group_id=group,
                                    auto_offset_reset="earliest", enable_auto_commit=False,
                                    session_timeout_ms=6000, heartbeat_interval_ms=1000)

        members = [make(), make()]
        for m in members:
            await m.start()
        restarted = False
        deadline = time.monotonic() + DEADLINE
        while ledger.count < MESSAGES and time.monotonic() < deadline:
            for m in members:
                records = await m.getmany(timeout_ms=500, max_records=500)
                got = [(tp.partition, r.value) for tp, rs in records.items() for r in rs]
                for partition, value in got:
                    ledger.add(partition, value)
                if got:
                    await m.commit()
            if not restarted and ledger.count >= MESSAGES // 3:
                await members.pop().stop()
                fresh = make()
                await fresh.start()
                members.append(fresh)
                restarted = True
        cluster = members[0]._client.cluster
        seen.extend((b.host, b.port) for b in cluster.brokers())
        coordinator = members[0]._coordinator.coordinator_id
        if coordinator is not None:
            node = cluster.broker_metadata(coordinator)
            seen.append((node.host, node.port))
        for m in members:
            await m.stop()
        assert restarted

    asyncio.run(scenario())
    ledger.check()
    assert_only_proxy(proxy, backend, seen)
