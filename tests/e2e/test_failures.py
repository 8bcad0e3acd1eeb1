"""Failure behaviour of the `kproxy run` process: broker loss, drain on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import trio

from kproxy.codecs import api_keys
from kproxy.embedded_broker import TansuBroker, wait_for_port

from ..fake_broker import FakeBroker
from ..support import RawClient, broker_port_base, encode_request, free_port, kproxy_process

METADATA_V12 = {"topics": [], "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False}


@pytest.mark.broker
def test_broker_killed_mid_produce_then_back(tmp_path: Path) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = TansuBroker(port=free_port(), log_path=tmp_path / "tansu.log").start()
    topic = f"kill-{uuid.uuid4().hex[:6]}"
    try:
        with kproxy_process(broker.bootstrap, tmp_path) as kp:
            admin = AdminClient({"bootstrap.servers": kp.bootstrap})
            admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(20)
            errors: list[str] = []
            delivered: list[int] = []
            failed: list[int] = []
            producer = Producer({
                "bootstrap.servers": kp.bootstrap, "acks": "all", "linger.ms": 2,
                "message.timeout.ms": 8000, "reconnect.backoff.max.ms": 500,
                "error_cb": lambda err: errors.append(err.str())})

            def on_delivery(err: object, msg: object) -> None:
                (failed if err else delivered).append(1)

            def produce_for(seconds: float) -> None:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    producer.produce(topic, b"x" * 100, on_delivery=on_delivery)
                    producer.poll(0.01)

            produce_for(1.0)
            assert delivered and not failed
            broker.stop()  # mid-produce
            killed_at = time.monotonic()
            produce_for(1.0)
            # The client is told (error callback), it does not hang.
            while not errors and time.monotonic() - killed_at < 15:
                producer.poll(0.2)
            assert errors, "the client saw no error after the broker died"
            # The proxy itself stays up and answers, and closes new client
            # connections promptly instead of leaving them hanging.
            assert kp.process.poll() is None
            assert kp.http_get("/healthz")[0] == 200
            t0 = time.monotonic()

            async def probe() -> bytes | None:
                client = await RawClient.connect(kp.bootstrap_port)
                return await client.read_frame(timeout=12)

            assert trio.run(probe) is None
            assert time.monotonic() - t0 < 12
            producer.flush(15)  # messages queued while down time out: errors, not a hang
            assert failed

            # The broker comes back on the same address (empty: in-memory storage): the
            # same client recovers. Its own metadata request may auto-create the topic
            # before the admin call below does; either way the topic exists.
            broker.start()
            from confluent_kafka import KafkaError, KafkaException

            try:
                admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(20)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
            before = len(delivered)
            deadline = time.monotonic() + 30
            while len(delivered) == before and time.monotonic() < deadline:
                produce_for(0.5)
                producer.flush(5)
            assert len(delivered) > before, "the client did not recover"
            _, metrics = kp.http_get("/metrics")
            assert "kproxy_upstream_disconnects_total" in metrics
    finally:
        broker.stop()


async def test_sigterm_drains_in_flight_then_exits_zero(nursery: trio.Nursery,
                                                         tmp_path: Path) -> None:
    fake = await FakeBroker(node_ids=[0]).start(nursery)
    bootstrap, http = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kproxy.cli", "run", "--workers", "1",
         "--upstream", fake.bootstrap,
         "--listen", f"127.0.0.1:{bootstrap}", "--http", f"127.0.0.1:{http}",
         "--broker-port-base", str(broker_port_base()), "--node-id-range", "0-0",
         "--drain-timeout", "10"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        with trio.fail_after(15):
            while not await trio.to_thread.run_sync(wait_for_port, "127.0.0.1", bootstrap, 0.2):
                pass
        fake.delay = 1.5  # the answer is still on its way when SIGTERM arrives
        client = await RawClient.connect(bootstrap)
        await client.send(encode_request(api_keys.METADATA, 12, 42, METADATA_V12))
        with trio.fail_after(30):  # in flight: the broker has it (and answers 1.5 s later)
            while (api_keys.METADATA, 12, 42) not in fake.requests:
                await trio.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(10):  # no new connections once draining: refused
            while True:
                try:
                    stream = await trio.open_tcp_stream("127.0.0.1", bootstrap)
                except OSError:
                    break
                await stream.aclose()  # accepted before the signal was handled
                await trio.sleep(0.05)
        frame = await client.read_frame(timeout=5)
        assert frame is not None  # the in-flight request was answered
        assert await client.read_frame(timeout=5) is None  # then the connection closed
        rc = await trio.to_thread.run_sync(proc.wait, 10)
        assert rc == 0
        out = proc.stdout.read().decode() if proc.stdout else ""
        assert "draining" in out and "kproxy stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
