"""Virtual clusters under `kproxy run` (its default two workers) with real clients on one
tansu: two tenants create the same topic name and group id with confluent-kafka,
kafka-python and aiokafka, read back only their own records, and never see the other's
topics, groups or offsets; the main listener sees both, prefixed. An API a virtual
cluster does not translate is left out of its ApiVersions and closes the connection;
the status page and /metrics count per virtual cluster; a reload that moves a prefix is
refused with one line and the old one keeps serving."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kproxy.codecs.messages import decode_response
from kproxy.embedded_broker import TansuBroker

from ..support import (
    KproxyProcess,
    broker_port_base,
    free_port,
    kproxy_process,
    metric_value,
    value_of,
)

pytestmark = pytest.mark.broker
TENANTS = ("alpha", "beta")
GROUP_TIMEOUTS = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


class Bed:
    def __init__(self, kp: KproxyProcess, ports: dict[str, int], config: Path,
                 text: str) -> None:
        self.kp, self.ports, self.config, self.text = kp, ports, config, text

    def bootstrap(self, tenant: str) -> str:
        return f"127.0.0.1:{self.ports[tenant]}"


def _config(ports: dict[str, int], bases: dict[str, int], prefix_of_alpha: str = "alpha.") -> str:
    prefixes = {"alpha": prefix_of_alpha, "beta": "beta."}
    return "".join(f'[[virtual_clusters]]\nname = "{t}"\nlisten = "127.0.0.1:{ports[t]}"\n'
                   f'broker_port_base = {bases[t]}\nprefix = "{prefixes[t]}"\n'
                   for t in TENANTS)


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    tmp = tmp_path_factory.mktemp("vclusters")
    ports = {t: free_port() for t in TENANTS}
    bases = {t: broker_port_base() for t in TENANTS}
    text = _config(ports, bases)
    cfg = tmp / "kproxy.toml"
    cfg.write_text(text)
    with TansuBroker(log_path=tmp / "tansu.log") as broker, kproxy_process(
            broker.bootstrap, tmp, "--config", str(cfg)) as kp:
        yield Bed(kp, ports, cfg, text)


def _confluent(bootstrap: str, topic: str, group: str, value: bytes) -> tuple[list[bytes], str]:
    from confluent_kafka import Consumer, KafkaError, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, num_partitions=1)]).values():
        f.result(20)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, value)
    assert producer.flush(20) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.partition.eof": True,
                         "enable.auto.commit": False, **GROUP_TIMEOUTS})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if (error := msg.error()) is not None:
            if error.code() == KafkaError._PARTITION_EOF and got:
                break
            continue
        got.append(value_of(msg))
    consumer.commit(asynchronous=False)
    consumer.close()
    cluster_id = admin.list_topics(timeout=10).cluster_id
    assert cluster_id is not None
    return got, cluster_id


def test_confluent_tenants_share_names_and_never_see_each_other(bed: Bed) -> None:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    ids = {}
    for tenant in TENANTS:
        got, ids[tenant] = _confluent(bed.bootstrap(tenant), "orders", "g",
                                      f"from-{tenant}".encode())
        assert got == [f"from-{tenant}".encode()]
    main = AdminClient({"bootstrap.servers": bed.kp.bootstrap})
    main_meta = main.list_topics(timeout=10)
    assert {"alpha.orders", "beta.orders"} <= set(main_meta.topics)
    assert len({ids["alpha"], ids["beta"], main_meta.cluster_id}) == 3
    for tenant in TENANTS:
        admin = AdminClient({"bootstrap.servers": bed.bootstrap(tenant)})
        assert set(admin.list_topics(timeout=10).topics) == {"orders"}
        groups = admin.list_consumer_groups().result(20)
        assert {g.group_id for g in groups.valid} == {"g"}
        from confluent_kafka import ConsumerGroupTopicPartitions
        offsets = admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions("g", [TopicPartition("orders", 0)])])
        result = offsets["g"].result(20)
        assert [(tp.topic, tp.offset) for tp in result.topic_partitions] == [("orders", 1)]
        # A second connection agrees on the cluster id (derived, stable), and so does
        # DescribeCluster.
        assert admin.list_topics(timeout=10).cluster_id == ids[tenant]
        assert admin.describe_cluster().result(20).cluster_id == ids[tenant]


def test_kafka_python_tenants(bed: Bed) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic

    for tenant in TENANTS:
        bootstrap = bed.bootstrap(tenant)
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        admin.create_topics([NewTopic("payments", 1, 1)])
        producer = KafkaProducer(bootstrap_servers=bootstrap)
        producer.send("payments", f"kp-{tenant}".encode()).get(20)
        producer.close()
        consumer = KafkaConsumer("payments", bootstrap_servers=bootstrap, group_id="kp",
                                 auto_offset_reset="earliest", consumer_timeout_ms=6000,
                                 session_timeout_ms=6000, heartbeat_interval_ms=500,
                                 enable_auto_commit=False)
        values = []
        for message in consumer:
            values.append(message.value)
            break
        consumer.commit()
        consumer.close()
        assert values == [f"kp-{tenant}".encode()]
        assert "payments" in admin.list_topics()
        assert not [t for t in admin.list_topics() if "." in t]  # no prefix, no one else's
        listed = [g["group_id"] if isinstance(g, dict) else g[0] for g in admin.list_groups()]
        assert "kp" in listed and not [g for g in listed if g.startswith(TENANTS)]
        offsets = admin.list_group_offsets("kp")["kp"]  # OffsetFetch v8+, all topics
        assert {tp.topic: om.offset for tp, om in offsets.items()} == {"payments": 1}
        admin.close()


def test_aiokafka_tenants(bed: Bed) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    async def run(tenant: str) -> tuple[list[bytes], set[str]]:
        bootstrap = bed.bootstrap(tenant)
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait("events", f"ak-{tenant}".encode())
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer("events", bootstrap_servers=bootstrap, group_id="ak",
                                    auto_offset_reset="earliest", session_timeout_ms=6000,
                                    heartbeat_interval_ms=500, enable_auto_commit=False)
        await consumer.start()
        try:
            msg = await asyncio.wait_for(consumer.getone(), 40)
            await consumer.commit()
            topics = await consumer.topics()
        finally:
            await consumer.stop()
        return [msg.value], topics

    for tenant in TENANTS:  # auto-created through the virtual cluster
        values, topics = asyncio.run(run(tenant))
        assert values == [f"ak-{tenant}".encode()]
        assert "events" in topics and not [t for t in topics if t.startswith(TENANTS)]


def test_transactions_with_the_same_transactional_id(bed: Bed) -> None:
    """InitProducerId, AddPartitionsToTxn, EndTxn (and FindCoordinator by transactional
    id) through both virtual clusters with one transactional id: two producers, never
    fencing each other, each commit read back by its own tenant."""
    from confluent_kafka import Consumer, KafkaError, Producer

    producers = {}
    for tenant in TENANTS:
        producer = Producer({"bootstrap.servers": bed.bootstrap(tenant),
                             "transactional.id": "tx", "transaction.timeout.ms": 10000})
        producer.init_transactions(30)
        producers[tenant] = producer
    for tenant, producer in producers.items():  # the first one was not fenced
        producer.begin_transaction()
        producer.produce("ledger", f"tx-{tenant}".encode())
        producer.commit_transaction(30)
    for tenant in TENANTS:
        consumer = Consumer({"bootstrap.servers": bed.bootstrap(tenant), "group.id": "txr",
                             "auto.offset.reset": "earliest", "enable.partition.eof": True,
                             "isolation.level": "read_committed", **GROUP_TIMEOUTS})
        consumer.subscribe(["ledger"])
        got: list[bytes] = []
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if (error := msg.error()) is not None:
                if error.code() == KafkaError._PARTITION_EOF and got:
                    break
                continue
            got.append(value_of(msg))
        consumer.close()
        assert got == [f"tx-{tenant}".encode()]


def test_kafkajs_through_a_virtual_cluster(bed: Bed) -> None:
    """The compat scenario (create, produce, consume in a group, commit, list groups) with
    kafkajs, through one virtual cluster; only the tenant's names come back."""
    from ..compat.clients import by_slug
    from ..compat.install import installed
    from ..compat.runner import run_client

    kafkajs = by_slug("kafkajs-2.2.4")
    assert installed(kafkajs), "`make compat-test-tools` installs kafkajs"
    out = run_client(kafkajs, bed.bootstrap("beta"), "vcluster")
    assert out.ok, (out.steps, out.error, bed.kp.log()[-2000:])
    assert [out.steps[s] for s in ("admin", "produce", "consume", "commit")] == ["ok"] * 4


def test_admin_operations_stay_within_a_tenant(bed: Bed) -> None:
    """DeleteTopics and DescribeConfigs name the tenant's topics only (tansu has no
    CreatePartitions: the unit tests cover it)."""
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

    admins = {t: AdminClient({"bootstrap.servers": bed.bootstrap(t)}) for t in TENANTS}
    for admin in admins.values():
        for f in admin.create_topics([NewTopic("scratch", num_partitions=1)]).values():
            f.result(20)
    for f in admins["alpha"].delete_topics(["scratch"]).values():
        f.result(20)
    deadline = time.monotonic() + 20
    while "scratch" in admins["alpha"].list_topics(timeout=10).topics:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    beta = admins["beta"].list_topics(timeout=10).topics
    assert "scratch" in beta
    described = admins["beta"].describe_configs([ConfigResource("topic", "scratch")])
    for resource, f in described.items():
        f.result(20)
        assert resource.name == "scratch"


def _request(port: int, frame: bytes) -> bytes | None:
    """One request, its response body (None when the proxy closed the connection)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        head = b""
        while len(head) < 4:
            chunk = sock.recv(4 - len(head))
            if not chunk:
                return None
            head += chunk
        size = struct.unpack(">i", head)[0]
        body = b""
        while len(body) < size:
            chunk = sock.recv(size - len(body))
            assert chunk, "connection closed mid-response"
            body += chunk
        return body


def test_untranslated_apis_are_hidden_and_fail_closed(bed: Bed) -> None:
    port = bed.ports["alpha"]
    reply = _request(port, struct.pack(">hhih", 18, 2, 1, 2) + b"vc")
    assert reply is not None
    versions = {e["api_key"]: e["max_version"]
                for e in decode_response(reply, 18, 2).body["api_keys"]}
    assert 29 not in versions and 75 not in versions  # DescribeAcls, DescribeTopicPartitions
    assert versions[1] <= 12 and versions[0] <= 12 and versions[3] == 13
    # DescribeAcls v1 (ResourceType ANY, the rest null/any): closed, never forwarded.
    describe_acls = struct.pack(">hhih", 29, 1, 2, 2) + b"vc" + struct.pack(
        ">bhhhbb", 1, -1, -1, -1, 1, 1)
    assert _request(port, describe_acls) is None
    assert "does not translate DescribeAcls" in bed.kp.log()


def test_status_and_metrics_per_virtual_cluster(bed: Bed) -> None:
    from confluent_kafka.admin import AdminClient

    AdminClient({"bootstrap.servers": bed.bootstrap("beta")}).list_topics(timeout=10)
    deadline = time.monotonic() + 20
    while True:
        _, text = bed.kp.http_get("/metrics")
        try:
            if metric_value(text, 'kproxy_virtual_cluster_connections_accepted_total'
                            '{vcluster="beta"}') >= 1:
                break
        except (AssertionError, ValueError, KeyError):
            pass
        assert time.monotonic() < deadline, text[-2000:]
        time.sleep(0.2)
    assert metric_value(text, 'kproxy_virtual_cluster_bytes_total{direction="in",'
                        'vcluster="beta"}') > 0
    _, status = bed.kp.http_get("/status.json")
    rows = {v["name"]: v for v in json.loads(status)["virtual_clusters"]}
    assert set(rows) == set(TENANTS)
    assert rows["beta"]["prefix"] == "beta." and rows["beta"]["accepted"] >= 1
    assert rows["alpha"]["bootstrap"].endswith(f":{bed.ports['alpha']}")
    _, page = bed.kp.http_get("/")
    assert "Virtual clusters" in page and "alpha." in page


def test_a_reload_that_moves_a_prefix_is_refused(bed: Bed) -> None:
    from confluent_kafka.admin import AdminClient

    before = bed.kp.log().count("config reload rejected")
    bed.config.write_text(bed.text.replace('prefix = "alpha."', 'prefix = "gamma."'))
    try:
        bed.kp.signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while bed.kp.log().count("config reload rejected") < before + 1:
            assert time.monotonic() < deadline, bed.kp.log()[-3000:]
            time.sleep(0.1)
        assert "virtual_clusters: names, prefixes, listeners and ports change only at a " \
            "restart" in bed.kp.log()
    finally:
        bed.config.write_text(bed.text)
    from confluent_kafka.admin import NewTopic

    admin = AdminClient({"bootstrap.servers": bed.bootstrap("alpha")})
    for f in admin.create_topics([NewTopic("kept", num_partitions=1)]).values():
        f.result(20)
    main = AdminClient({"bootstrap.servers": bed.kp.bootstrap})
    assert "alpha.kept" in main.list_topics(timeout=10).topics  # the old prefix serves


def test_a_reload_applies_a_virtual_clusters_filters(bed: Bed) -> None:
    """Filter lists do reload: alpha gains a record-validation filter on its own names."""
    from confluent_kafka import KafkaError, Producer

    text = ('[[filters]]\nname = "json"\ntype = "record-validation"\n'
            'topics = ["json-*"]\nvalue_format = "json"\n'
            + bed.text.replace('prefix = "alpha."\n', 'prefix = "alpha."\nfilters = ["json"]\n'))
    assert text.count("filters = [") == 1
    bed.config.write_text(text)
    try:
        bed.kp.signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while True:  # every worker applied it (the merged generation is the lowest)
            _, status = bed.kp.http_get("/status.json")
            snap = json.loads(status)
            if (snap["proxy"]["config_generation"] or 0) >= 1:
                break
            assert time.monotonic() < deadline, bed.kp.log()[-3000:]
            time.sleep(0.2)
        assert [v["filters"] for v in snap["virtual_clusters"]] == [["json"], []]
        errors: dict[str, int] = {}
        for tenant in TENANTS:
            producer = Producer({"bootstrap.servers": bed.bootstrap(tenant), "retries": 0})

            def report(err: Any, _m: object, t: str = tenant) -> None:
                errors[t] = err.code() if err else 0
            producer.produce("json-events", b"not json", on_delivery=report)
            assert producer.flush(20) == 0
        assert errors == {"alpha": KafkaError.INVALID_RECORD, "beta": 0}
    finally:
        bed.config.write_text(bed.text)


def test_a_bad_virtual_cluster_stops_start_up_with_one_line(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    cfg = tmp_path / "bad.toml"
    cfg.write_text('[[virtual_clusters]]\nname = "a"\nlisten = "127.0.0.1:1"\n'
                   'broker_port_base = 2000\nprefix = ""\n')
    done = subprocess.run([sys.executable, "-m", "kproxy.cli", "run", "--config", str(cfg),
                           "--upstream", "127.0.0.1:9"], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "virtual_clusters.a.prefix:" in lines[0], lines
