"""Consumer groups of real clients through a real proxy (`kproxy run`) to a real tansu
broker: what /metrics and the log say about them must match what the clients report.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kproxy.embedded_broker import TansuBroker

from ..support import KproxyProcess, kproxy_process

pytestmark = pytest.mark.broker
DEADLINE = 120.0
_SAMPLE = re.compile(r'^(\w+)\{([^}]*)\} (\S+)$')


@pytest.fixture
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    # A broker per test: tansu's coordinator keeps the earlier tests' groups, and a
    # kafka-python group behind them was once seen rejoining without end.
    with TansuBroker(log_path=tmp_path_factory.mktemp("tansu") / "tansu.log") as broker:
        yield broker


@pytest.fixture
def proxy(backend: TansuBroker, tmp_path: Path) -> Iterator[KproxyProcess]:
    with kproxy_process(backend.bootstrap, tmp_path, "--archive", str(tmp_path / "archive"),
                        "--log-format", "json") as kp:
        yield kp


def samples(kp: KproxyProcess, name: str, group: str) -> list[tuple[dict[str, str], float]]:
    status, text = kp.http_get("/metrics")
    assert status == 200
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m.group(1) != name:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if labels.get("group") == group:
            out.append((labels, float(m.group(3))))
    return out


def value(kp: KproxyProcess, name: str, group: str) -> float | None:
    found = samples(kp, name, group)
    return found[0][1] if found else None


def wait_for(what: str, check: Callable[[], bool], step: Callable[[], object]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        step()


def test_confluent_group_grows_and_shrinks(proxy: KproxyProcess) -> None:
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic, group = f"gt-{uuid.uuid4().hex[:8]}", f"grp-{uuid.uuid4().hex[:8]}"
    partitions = 6
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic].result(20)

    def make() -> Any:
        c = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": group,
                      "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                      "heartbeat.interval.ms": 500, "partition.assignment.strategy": "range"})
        c.subscribe([topic])
        return c

    members: list[Any] = []

    def poll_all() -> None:
        for c in members:
            c.poll(0.2)

    def settled(n: int) -> Callable[[], bool]:
        def check() -> bool:
            owned = [{tp.partition for tp in c.assignment()} for c in members]
            if len(owned) != n or not all(owned):
                return False
            if set().union(*owned) != set(range(partitions)) or sum(map(len, owned)) != partitions:
                return False
            got = value(proxy, "kproxy_group_members", group)
            per_member = {labels["member"]: v for labels, v in
                          samples(proxy, "kproxy_group_assigned_partitions", group)}
            mine = {c.memberid(): len(c.assignment()) for c in members}
            return got == n and all(per_member.get(k) == v for k, v in mine.items())
        return check

    members.extend(make() for _ in range(3))
    wait_for("three members", settled(3), poll_all)
    r0 = value(proxy, "kproxy_group_rebalances_total", group)
    g0 = value(proxy, "kproxy_group_generation", group)
    assert r0 is not None and r0 >= 1 and g0 is not None

    members.append(make())
    wait_for("four members", settled(4), poll_all)
    r1 = value(proxy, "kproxy_group_rebalances_total", group)
    g1 = value(proxy, "kproxy_group_generation", group)
    assert r1 is not None and g1 is not None
    # Every new generation is one rebalance; a join makes at least one.
    assert r1 - r0 == g1 - g0 >= 1

    members.pop(0).close()  # LeaveGroup
    wait_for("three members again", settled(3), poll_all)
    r2 = value(proxy, "kproxy_group_rebalances_total", group)
    g2 = value(proxy, "kproxy_group_generation", group)
    assert r2 is not None and g2 is not None and r2 - r1 == g2 - g1 >= 1

    # (tansu's DescribeGroups lists no members, so the clients themselves are the truth.)
    assert len({c.memberid() for c in members}) == value(
        proxy, "kproxy_group_members", group) == 3
    info = samples(proxy, "kproxy_group_info", group)
    assert [(i["protocol_type"], i["assignor"]) for i, _ in info] == [("consumer", "range")]
    _, text = proxy.http_get("/metrics")
    count = re.search(r"^kproxy_group_rebalance_seconds_count (\S+)$", text, re.M)
    assert count and float(count.group(1)) >= r2
    for c in members:
        c.close()
    # The log: a structured line per rebalance a worker saw complete, with what that
    # worker saw (a worker that relayed none of a generation's SyncGroups does not see
    # it complete; the merged view, every generation once, is /metrics').
    lines = [json.loads(line) for line in proxy.log().splitlines()
             if "consumer group rebalanced" in line and group in line]
    assert lines, "no rebalance logged"
    for line in lines:
        assert 0 <= line["generation"] <= g2 and 1 <= line["members_after"] <= 4, line
        assert line["protocol"] == "classic" and line["assignor"] == "range", line
    print(lines[-2:])


def test_lag_follows_commits_and_high_watermarks(proxy: KproxyProcess) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    topic, group = f"lag-{uuid.uuid4().hex[:8]}", f"lag-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2)])[topic].result(20)
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 5})
    for i in range(10_000):
        producer.produce(topic, key=str(i % 7).encode(), value=str(i).encode())
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    c = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": group,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    c.subscribe([topic])
    consumed = 0
    positions: dict[int, int] = {}
    deadline = time.monotonic() + DEADLINE
    while consumed < 4_000 and time.monotonic() < deadline:
        for msg in c.consume(min(500, 4_000 - consumed), timeout=0.5):
            assert not msg.error()
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None
            positions[partition] = offset + 1
            consumed += 1
    assert consumed == 4_000
    # Commit the position of both partitions (one may not have been read from yet: its
    # position is still the log start, 0), so lag covers all 10,000 - 4,000.
    c.commit(offsets=[TopicPartition(topic, p, positions.get(p, 0)) for p in (0, 1)],
             asynchronous=False)

    def total_lag() -> float:
        return sum(v for labels, v in samples(proxy, "kproxy_group_lag", group)
                   if labels["topic"] == topic)

    try:
        wait_for("lag 6000", lambda: total_lag() == 6_000, lambda: c.poll(0.2))
    except AssertionError:
        _, text = proxy.http_get("/metrics")
        print([line for line in text.splitlines() if "kproxy_group" in line])
        raise
    while consumed < 10_000 and time.monotonic() < deadline:
        for msg in c.consume(500, timeout=0.5):
            assert not msg.error()
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None
            positions[partition] = offset + 1
            consumed += 1
    assert consumed == 10_000
    c.commit(asynchronous=False)
    wait_for("lag 0", lambda: total_lag() == 0, lambda: c.poll(0.2))
    c.close()


def test_kafka_python_and_aiokafka_feed_the_same_metrics(proxy: KproxyProcess) -> None:
    from kafka import KafkaConsumer
    from kafka.admin import KafkaAdminClient, NewTopic

    topic = f"kp-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=proxy.bootstrap)
    admin.create_topics([NewTopic(topic, 4, 1)])
    admin.close()
    group = f"kp-{uuid.uuid4().hex[:8]}"
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    consumers = [KafkaConsumer(topic, bootstrap_servers=proxy.bootstrap, group_id=group,
                               session_timeout_ms=6000, heartbeat_interval_ms=500,
                               partition_assignment_strategy=[RoundRobinPartitionAssignor])
                 for _ in range(2)]

    def kp_settled() -> bool:
        owned = [c.assignment() for c in consumers]
        gens = {c._coordinator._generation.generation_id for c in consumers}
        return (all(owned) and sum(map(len, owned)) == 4 and len(gens) == 1
                and value(proxy, "kproxy_group_generation", group) == gens.pop()
                and value(proxy, "kproxy_group_members", group) == 2)

    # Each consumer polls in its own thread, as in an application: polled in turn from
    # one thread, a member's join could wait on the other's poll, and the group was
    # once seen rejoining without end.
    stop = threading.Event()

    def poll(c: Any) -> None:
        while not stop.is_set():
            c.poll(200)

    pollers = [threading.Thread(target=poll, args=(c,), daemon=True) for c in consumers]
    for t in pollers:
        t.start()
    try:
        wait_for("kafka-python group", kp_settled, lambda: time.sleep(0.2))
    finally:
        stop.set()
        for t in pollers:
            t.join(30)
    info = samples(proxy, "kproxy_group_info", group)
    assert [i["assignor"] for i, _ in info] == ["roundrobin"]
    for c in consumers:
        c.close()

    agroup = f"ak-{uuid.uuid4().hex[:8]}"

    async def aio() -> None:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.coordinator.assignors.range import RangePartitionAssignor

        members = [AIOKafkaConsumer(topic, bootstrap_servers=proxy.bootstrap, group_id=agroup,
                                    session_timeout_ms=6000, heartbeat_interval_ms=500,
                                    partition_assignment_strategy=(RangePartitionAssignor,))
                   for _ in range(2)]
        for m in members:
            await m.start()
        deadline = time.monotonic() + DEADLINE
        while True:
            assert time.monotonic() < deadline, "aiokafka group never settled"
            for m in members:
                await m.getmany(timeout_ms=200)
            owned = [m.assignment() for m in members]
            gens = {m._coordinator.generation for m in members}
            if (all(owned) and sum(map(len, owned)) == 4 and len(gens) == 1
                    and value(proxy, "kproxy_group_generation", agroup) == gens.pop()
                    and value(proxy, "kproxy_group_members", agroup) == 2):
                break
        for m in members:
            await m.stop()

    asyncio.run(aio())
    assert value(proxy, "kproxy_group_rebalances_total", agroup)
    assert [i["assignor"] for i, _ in samples(proxy, "kproxy_group_info", agroup)] == ["range"]


def test_group_tracking_off_relays_the_same_and_exports_nothing(
        backend: TansuBroker, tmp_path: Path) -> None:
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient, NewTopic

    with kproxy_process(backend.bootstrap, tmp_path, "--group-tracking", "off") as kp:
        topic, group = f"off-{uuid.uuid4().hex[:8]}", f"off-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": kp.bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=2)])[topic].result(20)
        c = Consumer({"bootstrap.servers": kp.bootstrap, "group.id": group,
                      "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
        c.subscribe([topic])
        wait_for("an assignment", lambda: len(c.assignment()) == 2, lambda: c.poll(0.2))
        c.close()
        _, text = kp.http_get("/metrics")
        assert "kproxy_group_" not in text


def test_hostile_group_traffic_is_relayed_and_state_stays_capped(
        backend: TansuBroker, tmp_path: Path) -> None:
    """Junk consumer-protocol metadata and assignments, and 300 distinct group ids, through
    a proxy capped at 50 groups: every request is answered by the broker through the
    proxy, and the proxy tracks at most 50 groups."""
    import trio

    from kproxy.codecs import api_keys

    from ..support import RawClient

    junk = b"\x7f\xff" + b"\xff" * 64

    async def scenario(kp: KproxyProcess) -> None:
        client = await RawClient.connect(kp.bootstrap_port)
        join = {"group_id": "hostile", "session_timeout_ms": 6000,
                "rebalance_timeout_ms": 6000, "member_id": "", "group_instance_id": None,
                "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": junk}]}
        first = await client.request(api_keys.JOIN_GROUP, 5, 1, join)
        member = first.body["member_id"]
        if first.body["error_code"] == 79:  # MEMBER_ID_REQUIRED: join again with it
            joined = await client.request(api_keys.JOIN_GROUP, 5, 2, {**join, "member_id": member})
        else:
            joined = first
        assert joined.body["error_code"] == 0, joined.body
        gen = joined.body["generation_id"]
        synced = await client.request(api_keys.SYNC_GROUP, 3, 3, {
            "group_id": "hostile", "generation_id": gen, "member_id": member,
            "group_instance_id": None,
            "assignments": [{"member_id": member, "assignment": junk}]})
        assert synced.header.correlation_id == 3
        for i in range(300):
            resp = await client.request(api_keys.HEARTBEAT, 3, 10 + i, {
                "group_id": f"flood-{i}", "generation_id": 1, "member_id": "nobody",
                "group_instance_id": None})
            assert resp.header.correlation_id == 10 + i
        await client.aclose()

    with kproxy_process(backend.bootstrap, tmp_path, "--group-max-groups", "50") as kp:
        trio.run(scenario, kp)
        _, text = kp.http_get("/metrics")
        tracked = re.search(r"^kproxy_group_tracked (\S+)$", text, re.M)
        evicted = re.search(r"^kproxy_group_evicted_total (\S+)$", text, re.M)
        assert tracked and float(tracked.group(1)) == 50
        assert evicted and float(evicted.group(1)) >= 250
        assert kp.process.poll() is None
