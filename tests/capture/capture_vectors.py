"""Regenerate ``tests/vectors/*.jsonl`` from real clients talking to a real tansu broker.

    .venv/bin/python tests/capture/capture_vectors.py

For each client library (confluent-kafka, kafka-python, aiokafka) a fresh tansu
broker is started whose advertised address is the recorder's port, so every
connection the client opens (bootstrap, partition leader, group coordinator)
passes through the recorder. The client creates a topic, produces, consumes in a
group and commits. Each captured frame is written as one JSON line:
``{"client", "direction", "api_key", "api_name", "api_version", "hex"}``.
Frames larger than 16 KiB are left out to keep the repository small.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # for tests.support

from recorder import Recorder

from kproxy.codecs.api_keys import api_name
from kproxy.embedded_broker import TansuBroker

OUT = Path(__file__).resolve().parent.parent / "vectors"
MAX_FRAME = 16 * 1024
MESSAGES = 20


def scenario_confluent(bootstrap: str) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"ck-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2)])[topic].result(15)
    admin.describe_cluster(request_timeout=10).result(15)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5})
    for i in range(MESSAGES):
        producer.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode())
    assert producer.flush(15) == 0
    producer.produce(topic, key=b"lz4", value=b"x" * 200)
    producer.flush(15)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                         "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                         "enable.partition.eof": True})
    consumer.subscribe([topic])
    eof: set[int | None] = set()
    got, deadline = 0, time.monotonic() + 30
    while time.monotonic() < deadline and len(eof) < 2:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            eof.add(msg.partition())
            continue
        got += 1
    consumer.commit(asynchronous=False)
    consumer.close()
    assert got == MESSAGES + 1, got


def scenario_kafka_python(bootstrap: str) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic

    topic = f"kp-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, 2, 1)])
    admin.describe_cluster()
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for i in range(MESSAGES):
        producer.send(topic, key=f"k{i}".encode(), value=f"v{i}".encode())
    producer.flush(15)
    # acks=0 produce: no response expected; the vector proves the header peek sees it.
    fire = KafkaProducer(bootstrap_servers=bootstrap, acks=0)
    fire.send(topic, key=b"fire", value=b"and-forget")
    fire.flush(15)
    fire.close()
    producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"g-{topic}",
                             auto_offset_reset="earliest", session_timeout_ms=6000,
                             heartbeat_interval_ms=1000, consumer_timeout_ms=8000)
    got = sum(1 for _ in consumer)
    consumer.commit()
    consumer.close()
    assert got >= MESSAGES, got


def scenario_aiokafka(bootstrap: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async def run() -> None:
        topic = f"ak-{uuid.uuid4().hex[:8]}"
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        await admin.create_topics([NewTopic(topic, 2, 1)])
        await admin.close()
        # tansu answers aiokafka's InitProducerId with UNKNOWN (-1), so no idempotence here.
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        for i in range(MESSAGES):
            await producer.send_and_wait(topic, key=f"k{i}".encode(), value=f"v{i}".encode())
        await producer.stop()
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"g-{topic}",
                                    auto_offset_reset="earliest", session_timeout_ms=6000,
                                    heartbeat_interval_ms=1000)
        await consumer.start()
        got = 0
        deadline = time.monotonic() + 30
        while got < MESSAGES and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            got += sum(len(v) for v in batch.values())
        await consumer.commit()
        await consumer.stop()
        assert got == MESSAGES, got

    asyncio.run(run())


def capture_telemetry() -> list[dict[str, object]]:
    """Real librdkafka PushTelemetry frames, one run per push compression.

    The broker does not serve telemetry, so the recorders sit in front of kproxy,
    which answers it: client -> recorder -> kproxy -> tansu. kproxy advertises the
    broker recorder's port and binds its own (--broker-port-base vs
    --broker-bind-port-base), so every connection crosses a recorder.
    """
    import tempfile

    from confluent_kafka import Producer

    from kproxy.embedded_broker import free_port
    from tests.support import kproxy_process

    rows: list[dict[str, object]] = []
    tmp = Path(tempfile.mkdtemp())
    (tmp / "t.toml").write_text('[[telemetry.subscriptions]]\nmetrics = ["*"]\n'
                                "interval_ms = 500\n")
    with TansuBroker() as broker:
        for codec in ("zstd", "lz4", "gzip", "snappy"):
            bind = free_port()
            rec_broker = Recorder(("127.0.0.1", bind)).start()
            with kproxy_process(broker.bootstrap, tmp, "--config", str(tmp / "t.toml"),
                                "--telemetry-compression-types", codec,
                                "--broker-port-base", str(rec_broker.port),
                                "--broker-bind-port-base", str(bind)) as kp:
                rec_boot = Recorder(("127.0.0.1", kp.bootstrap_port)).start()
                producer = Producer({"bootstrap.servers": rec_boot.bootstrap, "linger.ms": 5})
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and sum(
                        1 for c in rec_broker.frames + rec_boot.frames
                        if c.api_key == 72 and c.direction == "response") < 2:
                    producer.produce("telemetry-capture", b"x" * 100)
                    producer.poll(0.05)
                producer.flush(5)
                rec_boot.close()
            rec_broker.close()
            for c in rec_boot.frames + rec_broker.frames:
                if c.api_key in (71, 72) and len(c.frame) <= MAX_FRAME:
                    rows.append({"client": "confluent-kafka", "direction": c.direction,
                                 "api_key": c.api_key, "api_name": api_name(c.api_key),
                                 "api_version": c.api_version, "compression": codec,
                                 "hex": c.frame.hex()})
    return rows


SCENARIOS: dict[str, Callable[[str], None]] = {
    "confluent-kafka": scenario_confluent,
    "kafka-python": scenario_kafka_python,
    "aiokafka": scenario_aiokafka,
}


def capture(client: str) -> list[dict[str, object]]:
    from kproxy.embedded_broker import free_port, wait_for_port

    broker_port = free_port()
    rec = Recorder(("127.0.0.1", broker_port))
    with TansuBroker(port=broker_port, advertised=rec.bootstrap):
        rec.start()
        assert wait_for_port("127.0.0.1", rec.port, 5)
        SCENARIOS[client](rec.bootstrap)
        time.sleep(0.5)
        rec.close()
    rows = []
    for c in rec.frames:
        if len(c.frame) > MAX_FRAME or c.api_key < 0:
            continue
        rows.append({"client": client, "direction": c.direction, "api_key": c.api_key,
                     "api_name": api_name(c.api_key), "api_version": c.api_version,
                     "hex": c.frame.hex()})
    return rows


def main() -> None:
    OUT.mkdir(exist_ok=True)
    wanted = sys.argv[1:] or [*SCENARIOS, "telemetry"]
    if "telemetry" in wanted:
        wanted.remove("telemetry")
        rows = capture_telemetry()
        path = OUT / "librdkafka-telemetry.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"{path}: {len(rows)} frames")
    for client in wanted:
        rows = capture(client)
        path = OUT / f"{client}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        kinds = sorted({(r["api_name"], r["api_version"], r["direction"]) for r in rows})
        print(f"{path}: {len(rows)} frames; {kinds}")


if __name__ == "__main__":
    main()
