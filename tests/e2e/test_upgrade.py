"""Upgrade without dropping clients: kproxy replaced process by process on the same ports.

With `--reuse-port on`, a new `kproxy run` binds the ports the old one holds; once it is
ready, the old one gets SIGTERM and drains (no new connections, in-flight requests
answered, then its connections close). Clients reconnect to the same address and land
on the new process. A real idempotent acks=all producer and a real consumer group run
throughout, several replacements in a row: no delivery may fail, and reading the topic
back must give every message exactly once.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kproxy.embedded_broker import TansuBroker, wait_for_port

from ..support import broker_port_base, free_port, stop_process, value_of

pytestmark = pytest.mark.broker
REPLACEMENTS = 3
STALL_BOUND_S = 20.0  # generous: a loaded machine; the measured figure is printed


@dataclass
class Generation:
    """One `kproxy run` process of the rolling replacement."""

    process: subprocess.Popen[bytes]
    http_port: int
    log_path: Path

    def ready(self) -> bool:
        import urllib.error
        import urllib.request
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/readyz",
                                        timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False


def start_generation(upstream: str, listen: int, base: int, tmp_path: Path,
                     n: int) -> Generation:
    http = free_port()
    log_path = tmp_path / f"kproxy-gen{n}.log"
    cmd = [sys.executable, "-m", "kproxy.cli", "run", "--workers", "1",
           "--upstream", upstream,
           "--listen", f"127.0.0.1:{listen}", "--http", f"127.0.0.1:{http}",
           "--broker-port-base", str(base), "--node-id-range", "111-111",
           "--reuse-port", "on", "--discovery-interval", "2"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    gen = Generation(proc, http, log_path)
    deadline = time.monotonic() + 30
    while not gen.ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process(proc)
            raise AssertionError(f"generation {n} did not become ready:\n"
                                 + log_path.read_text()[-3000:])
        time.sleep(0.1)
    return gen


@dataclass
class Traffic:
    """What the producer and consumer threads saw, with the time of every event."""

    delivered: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    consumed: list[int] = field(default_factory=list)
    consumed_at: list[float] = field(default_factory=list)
    produced: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)


def longest_gap(times: list[float], start: float, end: float) -> float:
    points = [start, *sorted(t for t in times if start <= t <= end), end]
    return max(b - a for a, b in itertools.pairwise(points))


def produce(bootstrap: str, topic: str, traffic: Traffic) -> None:
    from confluent_kafka import KafkaError, Producer

    def report(err: KafkaError | None, _msg: object) -> None:
        if err is None:
            traffic.delivered.append(time.monotonic())
        else:
            traffic.failures.append(str(err))

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5, "message.timeout.ms": 120000})
    try:
        while not traffic.stop.is_set():
            producer.produce(topic, str(traffic.produced).encode(), on_delivery=report)
            traffic.produced += 1
            producer.poll(0.01)
        remaining = producer.flush(120)
        if remaining:
            traffic.failures.append(f"{remaining} messages still queued after flush")
    except Exception as exc:  # surfaced by the test, not lost in the thread
        traffic.errors.append(f"producer: {exc!r}")


def consume(bootstrap: str, topic: str, traffic: Traffic, done: threading.Event) -> None:
    from confluent_kafka import Consumer

    # The client's default session timeout (45 s), as users run it. A short one (6 s,
    # with the default 3 s heartbeat) let the broker evict the member when heartbeats
    # failed across replacements two seconds apart; the member then rejoined as a new one
    # and re-read what it had not committed yet, which Kafka allows after a rebalance.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                         "auto.offset.reset": "earliest",
                         "enable.auto.commit": True, "auto.commit.interval.ms": 500})
    try:
        consumer.subscribe([topic])
        while not done.is_set():
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                traffic.errors.append(f"consumer: {msg.error()}")
                continue
            traffic.consumed.append(int(value_of(msg)))
            traffic.consumed_at.append(time.monotonic())
    except Exception as exc:
        traffic.errors.append(f"consumer: {exc!r}")
    finally:
        consumer.close()


def read_back(bootstrap: str, topic: str, expected: int) -> list[int]:
    """Every message in the topic, read from the start to the end of the partition."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"rb-{topic}",
                         "enable.partition.eof": True, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    out: list[int] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if (error := msg.error()) is not None:
                if error.code() == KafkaError._PARTITION_EOF and len(out) >= expected:
                    break
                continue
            out.append(int(value_of(msg)))
    finally:
        consumer.close()
    return out


@contextmanager
def generations(tmp_path: Path) -> Iterator[list[Generation]]:
    gens: list[Generation] = []
    try:
        yield gens
    finally:
        for g in gens:
            stop_process(g.process)


def wait_until(predicate: Callable[[], object], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_replacing_the_proxy_process_by_process_drops_no_client(
        tansu: TansuBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"upgrade-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    listen, base = free_port(), broker_port_base()
    bootstrap = f"127.0.0.1:{listen}"
    traffic, consumer_done = Traffic(), threading.Event()
    with generations(tmp_path) as gens:
        gens.append(start_generation(tansu.bootstrap, listen, base, tmp_path, 0))
        assert wait_for_port("127.0.0.1", base, 15), "broker listener did not open"
        producer = threading.Thread(target=produce, args=(bootstrap, topic, traffic))
        consumer = threading.Thread(target=consume,
                                    args=(bootstrap, topic, traffic, consumer_done))
        producer.start()
        consumer.start()
        try:
            # Traffic flows end to end before the first replacement.
            assert wait_until(lambda: len(traffic.consumed) >= 100, 90), traffic.errors
            started = time.monotonic()
            for n in range(1, REPLACEMENTS + 1):
                new = start_generation(tansu.bootstrap, listen, base, tmp_path, n)
                gens.append(new)
                old = gens[-2]
                old.process.terminate()  # SIGTERM: the old one drains
                assert old.process.wait(60) == 0, old.log_path.read_text()[-3000:]
                # Clients are back, through the new process, before the next round.
                mark = len(traffic.consumed)
                # Asked only within this iteration: ``mark`` is this round's.
                assert wait_until(lambda: len(traffic.consumed) >= mark + 100, 60), (  # noqa: B023
                    f"traffic did not resume after replacement {n}: {traffic.errors}")
            ended = time.monotonic()
        finally:
            traffic.stop.set()
            producer.join(180)
        assert wait_until(lambda: len(set(traffic.consumed)) >= traffic.produced, 60)
        consumer_done.set()
        consumer.join(30)
        stored = read_back(bootstrap, topic, traffic.produced)
    produce_stall = longest_gap(traffic.delivered, started, ended)
    consume_stall = longest_gap(traffic.consumed_at, started, ended)
    with capsys.disabled():  # the figure shows in `make test`'s output too
        print(f"\nupgrade: {REPLACEMENTS} replacements, {traffic.produced} messages; "
              f"longest stall: {produce_stall:.2f} s between deliveries, "
              f"{consume_stall:.2f} s between consumed messages")
    assert traffic.failures == [] and traffic.errors == []
    assert len(traffic.delivered) == traffic.produced
    assert sorted(stored) == list(range(traffic.produced)), "lost or duplicated in the log"
    assert sorted(traffic.consumed) == list(range(traffic.produced)), \
        "the consumer group lost or re-read messages"
    assert produce_stall < STALL_BOUND_S and consume_stall < STALL_BOUND_S
