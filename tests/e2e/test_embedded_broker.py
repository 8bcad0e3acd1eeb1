"""The tansu fixture starts a real broker that real clients can use."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kproxy.embedded_broker import TansuBroker, wait_for_port


def test_fixture_broker_serves_a_real_client(tansu: TansuBroker) -> None:
    topic = f"fixture-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(15)
    producer = Producer({"bootstrap.servers": tansu.bootstrap})
    producer.produce(topic, b"hello")
    assert producer.flush(15) == 0
    consumer = Consumer({"bootstrap.servers": tansu.bootstrap, "group.id": topic,
                         "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    consumer.subscribe([topic])
    try:
        msg = None
        for _ in range(60):
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                break
        assert msg is not None and msg.value() == b"hello"
    finally:
        consumer.close()


def test_broker_stops_and_frees_its_port() -> None:
    broker = TansuBroker().start()
    port = broker.port
    assert wait_for_port("127.0.0.1", port, 1)
    broker.stop()
    assert broker.process is None
    assert not wait_for_port("127.0.0.1", port, 0.5)
