"""Faults with real parts: a broker SIGKILLed under a producer and under a consumer group,
and an archive disk that refuses writes. In each, `kproxy run` keeps serving, its
memory and connections return to where they were, and an idempotent producer
loses nothing.
"""

from __future__ import annotations

import re
import resource
import signal
import threading
import time
from pathlib import Path

import pytest

from kproxy.embedded_broker import TansuBroker

from ..support import KproxyProcess, free_port, kproxy_process, value_of, wait_until
from .test_rebootstrap_e2e import read_partition


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def gauge(kp: KproxyProcess, name: str) -> float:
    _, text = kp.http_get("/metrics")
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$",
                                                      text, re.M))


def kill(broker: TansuBroker, signum: int = signal.SIGKILL) -> None:
    """Kill the broker process (SIGKILL by default: no goodbye, as when a node dies)."""
    assert broker.process is not None
    broker.process.send_signal(signum)
    broker.process.wait(10)
    broker.process = None


@pytest.mark.broker
def test_idempotent_producer_loses_nothing_but_the_dying_brokers_last_batch(
        tmp_path: Path, s3_env: dict[str, str]) -> None:
    from confluent_kafka import Producer

    # S3-backed storage (local emulator) keeps the log across the broker's death.
    broker = TansuBroker(port=free_port(), storage="s3://tansu/", cluster_id="faults",
                         extra_env=s3_env, log_path=tmp_path / "tansu.log").start()
    acked: list[int] = []
    errors: list[str] = []
    at_kill = (0, 0)
    try:
        with kproxy_process(broker.bootstrap, tmp_path) as kp:
            producer = Producer({"bootstrap.servers": kp.bootstrap, "enable.idempotence": True,
                                 "acks": "all", "linger.ms": 5, "message.timeout.ms": 90000})

            def done(err: object, msg: object) -> None:
                if err is not None:
                    errors.append(str(err))
                else:
                    acked.append(int(msg.value()))  # type: ignore[attr-defined]

            stop = threading.Event()
            sent = [0]

            def produce() -> None:
                while not stop.is_set():
                    producer.produce("faults", str(sent[0]).encode(), partition=0,
                                     on_delivery=done)
                    sent[0] += 1
                    producer.poll(0.002)

            thread = threading.Thread(target=produce)
            thread.start()
            try:
                wait_until(lambda: len(acked) > 200, 30, "the first acknowledgements")
                kill(broker)  # mid-produce
                at_kill = (sent[0], len(acked))
                time.sleep(2)
                assert kp.http_get("/healthz")[0] == 200
                broker.start()
                wait_until(lambda: len(acked) > at_kill[0] + 200, 60, "produce to resume")
            finally:
                stop.set()
                thread.join(30)
            assert producer.flush(90) == 0
            assert not errors, errors[:5]
            assert len(acked) == sent[0]
        got = [value for _, value in read_partition(broker.bootstrap, "faults", len(acked),
                                                     eof_after=len(acked) - 50)]
        assert len(got) == len(set(got)), "duplicates in the log"
        # tansu 0.6 acknowledges a batch before its storage write is durable: killed
        # (SIGKILL or SIGTERM) it can lose the batch it acknowledged last, 8-12 messages
        # here, the same with the producer connected to it directly. So the check is
        # that nothing is lost outside the requests in flight at the kill: nothing the
        # proxy held, nothing before, nothing after the restart.
        sent_at_kill, acked_at_kill = at_kill
        missing = set(acked) - set(got)
        outside = sorted(v for v in missing if not acked_at_kill <= v < sent_at_kill)
        assert not outside, f"acknowledged messages lost outside the kill: {outside[:20]}"
        assert len(set(acked) - missing) > acked_at_kill + 200
    finally:
        broker.stop()


@pytest.mark.broker
def test_consumer_group_carries_on_after_the_broker_is_killed_and_restarted(
        tmp_path: Path) -> None:
    from confluent_kafka import Consumer, Producer

    broker = TansuBroker(port=free_port(), log_path=tmp_path / "tansu.log").start()
    try:
        with kproxy_process(broker.bootstrap, tmp_path) as kp:
            producer = Producer({"bootstrap.servers": kp.bootstrap, "acks": "all"})
            for i in range(20):
                producer.produce("grouped", str(i).encode(), partition=0)
            assert producer.flush(20) == 0
            seen: list[int] = []
            stop = threading.Event()

            def consume() -> None:
                c = Consumer({"bootstrap.servers": kp.bootstrap, "group.id": "survivors",
                              "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                              "reconnect.backoff.max.ms": 1000})
                c.subscribe(["grouped"])
                try:
                    while not stop.is_set():
                        msg = c.poll(0.5)
                        if msg is not None and not msg.error():
                            seen.append(int(value_of(msg)))
                finally:
                    c.close()

            thread = threading.Thread(target=consume)
            thread.start()
            try:
                wait_until(lambda: len(set(seen)) >= 20, 60, "the group to read the first 20")
                baseline = sum(rss_mb(pid) for pid in kp.worker_pids())
                kill(broker)  # mid consume-group: fetches and heartbeats in flight
                time.sleep(2)
                assert kp.http_get("/healthz")[0] == 200
                broker.start()  # in-memory storage: the topic and group start afresh
                for i in range(100, 120):
                    producer.produce("grouped", str(i).encode(), partition=0)
                assert producer.flush(30) == 0
                wait_until(lambda: set(range(100, 120)) <= set(seen), 90,
                           "the group to read what was produced after the restart")
            finally:
                stop.set()
                thread.join(30)
            del producer
            wait_until(lambda: gauge(kp, "kproxy_client_connections") == 0, 20,
                       "every client connection to close")
            assert sum(rss_mb(pid) for pid in kp.worker_pids()) < baseline + 15
    finally:
        broker.stop()


def limit_file_size() -> None:
    """In the proxy process: the kernel refuses writes past 64 KiB (EFBIG), as a full
    disk refuses them (ENOSPC); Python ignores the SIGXFSZ that comes with it."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))


@pytest.mark.broker
def test_archive_on_a_full_disk_drops_records_and_the_proxy_serves_on(
        tmp_path: Path, tansu: TansuBroker) -> None:
    from confluent_kafka import Producer

    archive = tmp_path / "archive"
    with kproxy_process(tansu.bootstrap, tmp_path, "--archive", str(archive),
                        "--telemetry-default-interval-ms", "500",
                        preexec=limit_file_size) as kp:
        producer = Producer({"bootstrap.servers": kp.bootstrap, "acks": "all",
                             "client.id": "full-disk"})
        delivered: list[bool] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for _ in range(50):
                producer.produce("full-disk", b"x" * 200,
                                 on_delivery=lambda err, _m: delivered.append(err is None))
            producer.flush(10)
            _, text = kp.http_get("/metrics")
            if re.search(r'kproxy_archive_records_total\{kind="telemetry",outcome="dropped"\} '
                         r'[1-9]', text):
                break
        else:
            raise AssertionError("the archive never hit the file size limit")
        assert all(delivered) and len(delivered) >= 50
        assert kp.process.poll() is None and kp.http_get("/readyz")[0] == 200
        del producer
    log = kp.log()
    failures = log.count("archive write failed")
    assert 1 <= failures <= 3, f"{failures} archive failure lines: not rate limited"
    assert "File too large" in log
