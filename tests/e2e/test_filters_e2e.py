"""Filters under a running `kproxy run` with real clients: record validation refuses
invalid JSON and schema violations per partition and lets valid records through (every
codec), a decompression bomb is refused, a user filter loaded by import path acts, a
bad filter config stops start-up (exit 2) and a bad reload keeps the running chain."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kproxy.codecs import api_keys
from kproxy.codecs.compression import compress
from kproxy.codecs.framing import FrameReader
from kproxy.codecs.messages import decode_response
from kproxy.codecs.record_batch import encode_batch, encode_records
from kproxy.embedded_broker import TansuBroker

from ..produce_frames import produce_body
from ..support import KproxyProcess, encode_request, kproxy_process, metric_value, value_of

pytestmark = pytest.mark.broker
ROOT = Path(__file__).resolve().parents[2]
SCHEMA = {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}}
CONFIG = """
default_filters = ["json", "orders", "gate"]
[[filters]]
name = "json"
type = "record-validation"
topics = ["json-*"]
value_format = "json"
max_decompressed_bytes = 1048576
[[filters]]
name = "orders"
type = "record-validation"
topics = ["orders-*"]
value_schema = "order.schema.json"
[[filters]]
name = "gate"
type = "tests.user_filters:ClientIdGate"
refuse = "blocked-client"
"""


@pytest.fixture(scope="module")
def proxy(shared_tansu: TansuBroker,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[KproxyProcess]:
    tmp = tmp_path_factory.mktemp("filters")
    (tmp / "order.schema.json").write_text(json.dumps(SCHEMA))
    (tmp / "kproxy.toml").write_text(CONFIG)
    with kproxy_process(shared_tansu.bootstrap, tmp, "--config", str(tmp / "kproxy.toml"),
                        env={"PYTHONPATH": str(ROOT)}) as kp:
        yield kp


def _topic(prefix: str, partitions: int = 1) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _create(kp: KproxyProcess, *topics: str, partitions: int = 1) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": kp.bootstrap})
    for f in admin.create_topics([NewTopic(t, num_partitions=partitions)
                                  for t in topics]).values():
        f.result(20)


def _consume(kp: KproxyProcess, topic: str, partitions: int = 1) -> list[bytes]:
    """Every value in the topic, read to the end of each partition (tansu's "latest" is
    not to be trusted: partition EOF instead)."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": kp.bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
                  "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[bytes] = []
    ended: set[int | None] = set()
    deadline = time.monotonic() + 30
    while len(ended) < partitions and time.monotonic() < deadline:
        msg = c.poll(0.5)
        if msg is None:
            continue
        if (error := msg.error()) is not None:
            if error.code() == -191:  # _PARTITION_EOF
                ended.add(msg.partition())
            continue
        values.append(value_of(msg))
    c.close()
    assert len(ended) == partitions, "did not reach the end of the topic"
    return values


def test_confluent_kafka_every_codec_and_a_schema(proxy: KproxyProcess) -> None:
    from confluent_kafka import KafkaError, Producer
    json_topic, orders = _topic("json"), _topic("orders")
    _create(proxy, json_topic, orders)
    sent: list[bytes] = []
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "compression.type": codec,
                             "message.timeout.ms": 20000})
        outcomes: list[int | None] = []

        def report(err: KafkaError | None, _msg: object, out: list[int | None] = outcomes,
                   ) -> None:
            out.append(None if err is None else err.code())

        for value in (json.dumps({"codec": codec}).encode(), b"{broken " + codec.encode()):
            producer.produce(json_topic, value, on_delivery=report)
            assert producer.flush(20) == 0  # one batch each: one valid, one invalid
        assert outcomes == [None, KafkaError.INVALID_RECORD], codec
        sent.append(json.dumps({"codec": codec}).encode())
    producer = Producer({"bootstrap.servers": proxy.bootstrap})
    results: list[int | None] = []
    for value in (b'{"id": 1}', b'{"id": "one"}', b'{"name": "x"}'):
        producer.produce(orders, value, on_delivery=lambda err, _m: results.append(
            None if err is None else err.code()))
        assert producer.flush(20) == 0
    assert results == [None, KafkaError.INVALID_RECORD, KafkaError.INVALID_RECORD]
    assert _consume(proxy, json_topic) == sent
    assert _consume(proxy, orders) == [b'{"id": 1}']


def test_kafka_python_refuses_one_partition_and_writes_the_other(
        proxy: KproxyProcess) -> None:
    """Both partitions in one Produce request (lingering): the invalid one refused, the
    valid one forwarded, the client told each."""
    from kafka import KafkaProducer
    from kafka.errors import InvalidRecordError
    topic = _topic("json")
    _create(proxy, topic, partitions=2)
    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, linger_ms=500,
                             compression_type="gzip", retries=0)
    bad = producer.send(topic, b"not json", partition=0)
    good = producer.send(topic, b'{"ok": true}', partition=1)
    producer.flush(20)
    assert good.get(20).partition == 1
    with pytest.raises(InvalidRecordError):
        bad.get(20)
    producer.close(5)
    assert _consume(proxy, topic, partitions=2) == [b'{"ok": true}']
    _, text = proxy.http_get("/metrics")  # one request, rewritten: not answered whole
    assert metric_value(text, 'kproxy_filter_decisions_total{decision="changed",'
                        'filter="json"}') >= 1


def test_aiokafka_schema_violation_is_refused(proxy: KproxyProcess) -> None:
    import asyncio

    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import UnknownError
    topic = _topic("orders")
    _create(proxy, topic)

    async def scenario() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=proxy.bootstrap,
                                    compression_type="lz4")
        await producer.start()
        try:
            await producer.send_and_wait(topic, b'{"id": 7}')
            # aiokafka has no class for code 87: it raises its UnknownError for it.
            with pytest.raises(UnknownError):
                await producer.send_and_wait(topic, b'{"id": 7.5}')
        finally:
            await producer.stop()

    asyncio.run(scenario())
    assert _consume(proxy, topic) == [b'{"id": 7}']


class SyncClient:
    """A stand-in producer for crafted frames (a bomb): plain frames on a socket."""

    def __init__(self, port: int, client_id: str = "stand-in") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.reader = FrameReader()
        self.client_id = client_id

    def send(self, frame: bytes) -> bytes | None:
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        while (got := self.reader.next_frame()) is None:
            data = self.sock.recv(65536)
            if not data:
                return None
            self.reader.feed(data)
        return bytes(got)


def test_a_bomb_is_refused_and_the_connection_carries_on(proxy: KproxyProcess) -> None:
    topic = _topic("json")
    _create(proxy, topic)
    zeros = encode_records([(None, b"0" * 8_000_000)])
    bomb = encode_batch([(None, b"{}")], 4, compressed=compress(4, zeros))
    client = SyncClient(proxy.bootstrap_port)
    reply = client.send(produce_body(9, 1, [(topic, [(0, bomb)])]))
    assert reply is not None
    [entry] = decode_response(reply, api_keys.PRODUCE, 9).body["responses"][0][
        "partition_responses"]
    assert entry["error_code"] == 87
    assert "expands past the limit of 1048576 bytes" in entry["error_message"]
    good = client.send(produce_body(9, 2, [(topic, [(0, encode_batch([(None, b"{}")]))])]))
    assert good is not None
    assert decode_response(good, api_keys.PRODUCE, 9).body["responses"][0][
        "partition_responses"][0]["error_code"] == 0
    client.sock.close()


def test_a_user_filter_by_import_path(proxy: KproxyProcess) -> None:
    metadata = {"topics": [], "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False}
    allowed = SyncClient(proxy.bootstrap_port)
    assert allowed.send(encode_request(api_keys.METADATA, 12, 1, metadata,
                                       client_id="someone")[4:]) is not None
    blocked = SyncClient(proxy.bootstrap_port)
    assert blocked.send(encode_request(api_keys.METADATA, 12, 1, metadata,
                                       client_id="blocked-client")[4:]) is None
    _, text = proxy.http_get("/metrics")
    assert metric_value(text, 'kproxy_filter_decisions_total{decision="close",'
                        'filter="gate"}') >= 1
    assert metric_value(text, 'kproxy_filter_decisions_total{decision="forward",'
                        'filter="gate"}') >= 1
    _, status = proxy.http_get("/status.json")
    names = [f["name"] for f in json.loads(status)["filters"]]
    assert names[:3] == ["json", "orders", "gate"] and "kafka-protocol" in names
    allowed.sock.close()
    blocked.sock.close()


def test_a_bad_filter_config_stops_start_up_with_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('default_filters = ["v"]\n[[filters]]\nname = "v"\n'
                   'type = "record-validation"\ntopics = ["t"]\nvalue_schema = "nope.json"\n')
    done = subprocess.run([sys.executable, "-m", "kproxy.cli", "run", "--config", str(cfg),
                           "--upstream", "127.0.0.1:9"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "filters.v.value_schema: cannot read" in lines[0], lines


def test_a_bad_reload_keeps_the_running_filters(shared_tansu: TansuBroker,
                                                tmp_path: Path) -> None:
    cfg = tmp_path / "kproxy.toml"
    cfg.write_text('default_filters = ["json"]\n[[filters]]\nname = "json"\n'
                   'type = "record-validation"\ntopics = ["json-*"]\nvalue_format = "json"\n')
    with kproxy_process(shared_tansu.bootstrap, tmp_path, "--config", str(cfg)) as kp:
        topic = _topic("json")
        _create(kp, topic)
        client = SyncClient(kp.bootstrap_port)
        cfg.write_text('default_filters = ["json"]\n[[filters]]\nname = "json"\n'
                       'type = "record-validation"\ntopics = ["json-*"]\n'
                       'value_format = "yaml"\n')
        kp.signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while kp.log().count("config reload rejected") < 1:
            assert time.monotonic() < deadline, kp.log()
            time.sleep(0.1)
        assert "filters.json.value_format" in kp.log()
        reply = client.send(produce_body(9, 1, [(topic, [(0, encode_batch([(None, b"x")]))])]))
        assert reply is not None
        assert decode_response(reply, api_keys.PRODUCE, 9).body["responses"][0][
            "partition_responses"][0]["error_code"] == 87
        client.sock.close()
