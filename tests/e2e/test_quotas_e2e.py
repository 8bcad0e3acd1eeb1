"""Quotas per principal at a running `kproxy run` (two workers, the default here) in front
of a tansu broker: confluent-kafka logs in with PLAIN; alice has a produce quota and is
throttled (the run takes at least what the quota allows, librdkafka's throttle_cb sees
throttle_time_ms, nothing is lost), bob has none and is not slowed; carol has a fetch
quota and reads back at its pace."""

from __future__ import annotations

import json
import re
import signal
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kproxy.codecs import api_keys
from kproxy.codecs.framing import FrameReader
from kproxy.embedded_broker import TansuBroker

from ..support import KproxyProcess, encode_request, kproxy_process, value_of, wait_until

pytestmark = pytest.mark.broker
QUOTA = 400 * 1024  # alice's produce bytes per second, over all workers
SAMPLES, SAMPLE_S = 3, 1.0  # a short window, so that 2 MB is far over its first burst
MESSAGE = 10 * 1024
TOTAL = 200 * MESSAGE  # about 2 MB
ANON_RATE = 20  # requests per second before a login, over all workers
USERS = """
[users.alice]
password = "alice-secret"
[users.bob]
password = "bob-secret"
[users.carol]
password = "carol-secret"
"""


@pytest.fixture(scope="module")
def proxy(shared_tansu: TansuBroker,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[KproxyProcess]:
    tmp = tmp_path_factory.mktemp("quotas")
    (tmp / "users.toml").write_text(USERS)
    (tmp / "kproxy.toml").write_text(_config(tmp))
    with kproxy_process(shared_tansu.bootstrap, tmp, "--config", str(tmp / "kproxy.toml")) as kp:
        kp.tmp = tmp  # type: ignore[attr-defined]
        yield kp


def _config(tmp: Path, more: str = "") -> str:
    return f"""
audit_log = "{tmp / 'audit.log'}"
quota_window_samples = {SAMPLES}
quota_window_seconds = {SAMPLE_S}
[sasl]
terminate = true
mechanisms = ["PLAIN"]
users_file = "{tmp / 'users.toml'}"
[[quotas]]
principal = "User:alice"
produce_bytes_per_second = {QUOTA}
[[quotas]]
principal = "carol"
fetch_bytes_per_second = {QUOTA}
[[quotas]]
principal = "User:ANONYMOUS"  # no login yet: ApiVersions, SaslHandshake, SaslAuthenticate
requests_per_second = {ANON_RATE}
{more}"""


def _sasl(kp: KproxyProcess, user: str) -> dict[str, Any]:
    return {"bootstrap.servers": kp.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN", "sasl.username": user, "sasl.password": f"{user}-secret"}


def _floor() -> float:
    """The least time TOTAL bytes can take under QUOTA: at most the quota over the
    window, plus the first burst a fresh window allows (Kafka's rate floor of
    samples - 1). Any machine meets it, as each worker enforces half of it (stricter
    still on one connection)."""
    return (TOTAL - QUOTA * (SAMPLES - 1) * SAMPLE_S) / QUOTA


def _produce(kp: KproxyProcess, user: str, topic: str,
             total: int = TOTAL) -> tuple[float, list[Any], list[int]]:
    """Produce ``total`` bytes as ``user``: the seconds it took, the delivery errors
    (None for each message delivered) and the throttle times librdkafka reported (ms)."""
    from confluent_kafka import Producer

    throttles: list[int] = []
    producer = Producer({
        **_sasl(kp, user), "acks": "all", "linger.ms": 5,
        "batch.size": 64 * 1024,  # many requests, not two
        "throttle_cb": lambda ev: throttles.append(int(ev.throttle_time * 1000))})
    producer.list_topics(topic, timeout=20)  # logged in and the topic made: not timed
    delivered: list[Any] = []
    payload = b"x" * MESSAGE
    began = time.monotonic()
    for _ in range(total // MESSAGE):
        while True:
            try:
                producer.produce(topic, payload, on_delivery=lambda e, m: delivered.append(e))
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(60)
    elapsed = time.monotonic() - began
    producer.poll(0)  # the last throttle callbacks
    assert left == 0
    return elapsed, delivered, throttles


def test_produce_quota_throttles_its_principal_only(proxy: KproxyProcess) -> None:
    throttled, delivered, throttles = _produce(proxy, "alice", f"q-{uuid.uuid4().hex[:8]}")
    assert delivered == [None] * (TOTAL // MESSAGE)  # throttled, never dropped
    assert throttled >= 0.9 * _floor(), (throttled, _floor())
    assert throttles and max(throttles) > 0  # throttle_time_ms reached the client
    _, metrics = proxy.http_get("/metrics")
    count = re.search(r'^kproxy_quota_throttled_total\{kind="produce"\} (\S+)$', metrics, re.M)
    assert count is not None and float(count.group(1)) > 0

    free, delivered, throttles = _produce(proxy, "bob", f"q-{uuid.uuid4().hex[:8]}")
    assert delivered == [None] * (TOTAL // MESSAGE)
    assert not throttles
    assert free < throttled / 2, (free, throttled)


def test_fetch_quota_throttles_the_consumer(proxy: KproxyProcess) -> None:
    from confluent_kafka import Consumer, TopicPartition

    topic = f"qf-{uuid.uuid4().hex[:8]}"
    _, delivered, _ = _produce(proxy, "bob", topic)  # bob has no quota: written at once
    assert delivered == [None] * (TOTAL // MESSAGE)
    expected = TOTAL
    throttles: list[int] = []
    consumer = Consumer({
        **_sasl(proxy, "carol"), "group.id": f"g-{topic}",
        "enable.auto.commit": False, "fetch.max.bytes": 64 * 1024,
        "message.max.bytes": 32 * 1024,
        "max.partition.fetch.bytes": 64 * 1024,  # many responses, not two
        "throttle_cb": lambda ev: throttles.append(int(ev.throttle_time * 1000))})
    try:
        partitions = consumer.list_topics(topic, timeout=20).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        began = time.monotonic()
        read = 0
        deadline = began + 60
        while read < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                read += len(value_of(msg))
        elapsed = time.monotonic() - began
    finally:
        consumer.close()
    assert read == expected
    assert elapsed >= 0.9 * _floor(), (elapsed, _floor())
    assert throttles and max(throttles) > 0


def test_request_rate_mutes_the_channel_and_answers_everything(
        proxy: KproxyProcess) -> None:
    """60 ApiVersions sent at once by a client with no login: the first ones pass, then
    the proxy stops reading it (well past the parking lot's idle delay, which must not
    take the muted session) and answers every request, in order, at the quota's pace."""
    count = 60
    with socket.create_connection(("127.0.0.1", proxy.bootstrap_port), timeout=30) as sock:
        began = time.monotonic()
        sock.sendall(b"".join(encode_request(api_keys.API_VERSIONS, 0, cid, {})
                              for cid in range(count)))
        reader = FrameReader()
        seen: list[int] = []
        while len(seen) < count:
            data = sock.recv(65536)
            assert data, f"closed after {len(seen)} answers"
            reader.feed(data)
            while (frame := reader.next_frame()) is not None:
                seen.append(struct.unpack_from(">i", frame)[0])
        elapsed = time.monotonic() - began
    assert seen == list(range(count))
    floor = (count - ANON_RATE * (SAMPLES - 1) * SAMPLE_S) / ANON_RATE
    assert elapsed >= 0.9 * floor, (elapsed, floor)
    _, metrics = proxy.http_get("/metrics")
    throttled = re.search(r'^kproxy_quota_throttled_total\{kind="request"\} (\S+)$', metrics,
                          re.M)
    assert throttled is not None and float(throttled.group(1)) > 0


def _reloads(tmp: Path, outcome: str) -> int:
    path = tmp / "audit.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return sum(1 for line in lines if json.loads(line).get("event") == "config_reload"
               and json.loads(line)["outcome"] == outcome)



def test_reload_rejects_a_bad_entry_and_applies_a_good_one(proxy: KproxyProcess) -> None:
    """Runs last: it leaves bob with a quota."""
    tmp: Path = proxy.tmp  # type: ignore[attr-defined]
    path = tmp / "kproxy.toml"
    path.write_text(_config(tmp, '[[quotas]]\nprincipal = "bob"\nrequests_per_second = -3\n'))
    proxy.process.send_signal(signal.SIGHUP)
    wait_until(lambda: _reloads(tmp, "rejected") >= 2)  # both workers keep the running config
    _, _, throttles = _produce(proxy, "bob", f"q-{uuid.uuid4().hex[:8]}", TOTAL // 2)
    assert not throttles
    path.write_text(_config(tmp, f'[[quotas]]\nprincipal = "bob"\n'
                                 f'produce_bytes_per_second = {QUOTA}\n'))
    proxy.process.send_signal(signal.SIGHUP)
    wait_until(lambda: _reloads(tmp, "applied") >= 2)
    _, delivered, throttles = _produce(proxy, "bob", f"q-{uuid.uuid4().hex[:8]}", TOTAL // 2)
    assert delivered == [None] * (TOTAL // 2 // MESSAGE) and throttles and max(throttles) > 0


def test_bad_quota_entry_stops_start_up(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "kproxy.toml"
    path.write_text('[[quotas]]\nprincipal = "User:alice"\nrequest_percentage = 10\n')
    proc = subprocess.run([sys.executable, "-m", "kproxy.cli", "run", "--config", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "quotas[0].request_percentage" in lines[0], lines
