"""confluent-kafka (librdkafka bundled in each wheel) through the matrix scenario."""

from __future__ import annotations

import confluent_kafka
from common import Deadline, Result, args, check_values
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

a = args()
_version = getattr(confluent_kafka, "__version__", None) or confluent_kafka.version()[0]
res = Result(f"{_version} (librdkafka {confluent_kafka.libversion()[0]})")
conf = {"bootstrap.servers": a.bootstrap}
admin = AdminClient(conf)
values: list[int] = []
partitions: set[int] = set()


def create() -> None:
    futures = admin.create_topics([NewTopic(a.topic, a.partitions, 1)], request_timeout=30)
    futures[a.topic].result(30)


def produce() -> str:
    errors: list[str] = []

    def report(err: object, _m: object) -> None:
        if err:
            errors.append(str(err))
    p = Producer({**conf, "linger.ms": 5})
    for i in range(a.messages):
        p.produce(a.topic, key=f"k{i}", value=str(i), on_delivery=report)
        p.poll(0)
    left = p.flush(60)
    if left or errors:
        return f"fail: {left} undelivered, {len(errors)} errors: {errors[:1]}"
    return "ok"


consumer = Consumer({**conf, "group.id": a.group, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, "enable.partition.eof": True,
                     "session.timeout.ms": a.session_timeout_ms})


def consume() -> str:
    consumer.subscribe([a.topic])
    eof: set[int] = set()
    deadline = Deadline(a.deadline)
    while not deadline.passed() and not (len(values) >= a.messages
                                         and len(eof) >= a.partitions):
        m = consumer.poll(1.0)
        if m is None:
            continue
        partition, error, value = m.partition(), m.error(), m.value()
        assert partition is not None
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                eof.add(partition)
                continue
            return f"fail: {error}"
        eof.discard(partition)
        partitions.add(partition)
        if value is None:
            return f"fail: a record without a value at offset {m.offset()}"
        values.append(int(value))
    return check_values(values, a.messages)


def commit() -> str:
    consumer.commit(asynchronous=False)
    tps = [TopicPartition(a.topic, p) for p in range(a.partitions)]
    committed = consumer.committed(tps, timeout=30)
    total = sum(max(tp.offset, 0) for tp in committed)
    return "ok" if total == a.messages else f"fail: committed offsets sum to {total}"


def groups() -> str:
    if hasattr(admin, "list_consumer_groups"):
        listed = admin.list_consumer_groups(request_timeout=30).result(30)
        ids = {g.group_id for g in listed.valid}
        described = admin.describe_consumer_groups([a.group], request_timeout=30)[a.group]
        d = described.result(30)
        if a.group not in ids or d.group_id != a.group:
            return f"fail: listed={a.group in ids} described={d.group_id}"
        return "ok" if d.members else f"ok: the backend describes it with no members ({d.state})"
    listed_old = admin.list_groups(timeout=30)
    return "ok" if any(g.id == a.group for g in listed_old) else "fail: group not listed"


if res.step("admin", create) and res.step("produce", produce) and res.step("consume", consume):
    res.step("commit", commit)
    res.step("groups", groups)
consumer.close()
res.emit()
