"""Regenerate ``tests/data/archive/``: a telemetry archive written by kproxy for real clients.

    .venv/bin/python tests/capture/capture_archive.py

A tansu broker, `kproxy run --archive` in front of it with a 1 s telemetry
subscription, and for ~10 s: two librdkafka producers (different client ids), one
librdkafka consumer in a group, one kafka-python producer and one aiokafka producer
(neither pushes telemetry; both speak Metadata below v13). The proxy is stopped with
SIGTERM so every archive file is completed.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kproxy.embedded_broker import TansuBroker
from tests.support import kproxy_process

OUT = Path(__file__).resolve().parent.parent / "data" / "archive"
SECONDS = 10.0


def librdkafka(bootstrap: str, stop: threading.Event) -> None:
    from confluent_kafka import Consumer, Producer

    producers = [Producer({"bootstrap.servers": bootstrap, "client.id": cid, "linger.ms": 5})
                 for cid in ("checkout-service", "billing-service")]
    consumer = Consumer({"bootstrap.servers": bootstrap, "client.id": "audit-reader",
                         "group.id": "audit", "auto.offset.reset": "earliest",
                         "session.timeout.ms": 6000})
    consumer.subscribe(["orders"])
    while not stop.is_set():
        for p in producers:
            p.produce("orders", b"x" * 300)
            p.poll(0)
        consumer.poll(0.02)
    for p in producers:
        p.flush(10)
    consumer.close()


def kafka_python(bootstrap: str, stop: threading.Event) -> None:
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, client_id="legacy-exporter",
                      enable_idempotence=False, acks=1)
    while not stop.is_set():
        p.send("orders", b"y" * 100)
        time.sleep(0.01)
    p.flush(10)
    p.close()


def aiokafka(bootstrap: str, stop: threading.Event) -> None:
    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, client_id="async-ingest", acks=1)
        await p.start()
        while not stop.is_set():
            await p.send_and_wait("orders", b"z" * 100)
            await asyncio.sleep(0.02)
        await p.stop()

    asyncio.run(run())


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    archive = tmp / "archive"
    (tmp / "k.toml").write_text('[[telemetry.subscriptions]]\nmetrics = ["*"]\n'
                                "interval_ms = 1000\n")
    with TansuBroker() as broker, kproxy_process(
            broker.bootstrap, tmp, "--config", str(tmp / "k.toml"), "--archive", str(archive),
            "--archive-max-file-seconds", "5") as kp:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": kp.bootstrap})
        admin.create_topics([NewTopic("orders", num_partitions=2)])["orders"].result(20)
        stop = threading.Event()
        threads = [threading.Thread(target=f, args=(kp.bootstrap, stop))
                   for f in (librdkafka, kafka_python, aiokafka)]
        for t in threads:
            t.start()
        time.sleep(SECONDS)
        stop.set()
        for t in threads:
            t.join(30)
        kp.signal(signal.SIGTERM)
        kp.process.wait(30)
    if OUT.exists():
        shutil.rmtree(OUT)
    shutil.copytree(archive, OUT)
    files = sorted(OUT.rglob("*.jsonl"))
    print(f"{OUT}: {len(files)} files, {sum(f.stat().st_size for f in files)} bytes")


if __name__ == "__main__":
    main()
