"""kafka-python (pure Python) through the matrix scenario."""

from __future__ import annotations

import kafka
from common import Deadline, Result, args, check_values
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

a = args()
res = Result(kafka.__version__)
admin = KafkaAdminClient(bootstrap_servers=a.bootstrap, request_timeout_ms=30000)
values: list[int] = []
consumer: KafkaConsumer | None = None


def create() -> None:
    admin.create_topics([NewTopic(a.topic, num_partitions=a.partitions, replication_factor=1)])


def produce() -> str:
    p = KafkaProducer(bootstrap_servers=a.bootstrap, linger_ms=5)
    futures = [p.send(a.topic, key=f"k{i}".encode(), value=str(i).encode())
               for i in range(a.messages)]
    p.flush(60)
    failed = [f for f in futures if f.failed()]
    p.close()
    return "ok" if not failed else f"fail: {len(failed)} sends failed: {failed[0].exception}"


def consume() -> str:
    global consumer
    consumer = KafkaConsumer(a.topic, bootstrap_servers=a.bootstrap, group_id=a.group,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             session_timeout_ms=a.session_timeout_ms,
                             heartbeat_interval_ms=1000)
    deadline = Deadline(a.deadline)
    while not deadline.passed() and len(values) < a.messages:
        for records in consumer.poll(timeout_ms=1000).values():
            values.extend(int(r.value) for r in records)
    return check_values(values, a.messages)


def commit() -> str:
    assert consumer is not None
    consumer.commit()
    total = sum(consumer.committed(TopicPartition(a.topic, p)) or 0
                for p in range(a.partitions))
    return "ok" if total == a.messages else f"fail: committed offsets sum to {total}"


def _field(obj: object, *names: str) -> object:
    """kafka-python 2.x returns tuples and objects, 3.x dicts: read either."""
    for name in names:
        if isinstance(obj, dict) and name in obj:
            return obj[name]
        if hasattr(obj, name):
            return getattr(obj, name)
    return None


def groups() -> str:
    if hasattr(admin, "list_consumer_groups"):  # 2.x
        listed = {g[0] for g in admin.list_consumer_groups()}
        described = admin.describe_consumer_groups([a.group])[0]
    else:  # 3.x renamed them
        listed = {_field(g, "group_id") for g in admin.list_groups()}
        described = admin.describe_groups([a.group])[0]
    if a.group not in listed or _field(described, "group", "group_id") != a.group:
        return f"fail: listed={a.group in listed} described={described}"[:300]
    members = _field(described, "members")
    return "ok" if members else (
        f"ok: the backend describes it with no members ({_field(described, 'state')})")


if res.step("admin", create) and res.step("produce", produce) and res.step("consume", consume):
    res.step("commit", commit)
    res.step("groups", groups)
if consumer is not None:
    consumer.close()
admin.close()
res.emit()
