"""aiokafka (asyncio) through the matrix scenario."""

from __future__ import annotations

import asyncio
import sys
import traceback
from collections.abc import Awaitable, Callable

import aiokafka
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from common import Deadline, Result, args, check_values

a = args()
res = Result(aiokafka.__version__)
values: list[int] = []


async def main() -> None:
    admin = None
    try:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    except ImportError:
        AIOKafkaAdminClient = None  # older aiokafka has no admin client
    if AIOKafkaAdminClient is not None:
        admin = AIOKafkaAdminClient(bootstrap_servers=a.bootstrap)
        await admin.start()
    consumer = AIOKafkaConsumer(a.topic, bootstrap_servers=a.bootstrap, group_id=a.group,
                                auto_offset_reset="earliest", enable_auto_commit=False,
                                session_timeout_ms=a.session_timeout_ms,
                                heartbeat_interval_ms=1000)

    async def create() -> str:
        if admin is None:
            return "n/a: no admin client in this version (auto-created on produce)"
        await admin.create_topics([NewTopic(a.topic, num_partitions=a.partitions,
                                            replication_factor=1)])
        return "ok"

    async def produce() -> str:
        p = AIOKafkaProducer(bootstrap_servers=a.bootstrap, linger_ms=5)
        await p.start()
        try:
            futures = [await p.send(a.topic, key=f"k{i}".encode(), value=str(i).encode())
                       for i in range(a.messages)]
            await asyncio.gather(*futures)
        finally:
            await p.stop()
        return "ok"

    async def consume() -> str:
        await consumer.start()
        deadline = Deadline(a.deadline)
        while not deadline.passed() and len(values) < a.messages:
            batch = await consumer.getmany(timeout_ms=1000)
            for records in batch.values():
                values.extend(int(r.value) for r in records)
        return check_values(values, a.messages)

    async def commit() -> str:
        await consumer.commit()
        total = 0
        for p in range(a.partitions):
            total += await consumer.committed(TopicPartition(a.topic, p)) or 0
        return "ok" if total == a.messages else f"fail: committed offsets sum to {total}"

    async def groups() -> str:
        if admin is None:
            return "n/a: no admin client in this version"
        listed = {g[0] for g in await admin.list_consumer_groups()}
        described = await admin.describe_consumer_groups([a.group])
        if a.group not in listed or not described:
            return f"fail: listed={a.group in listed} described={bool(described)}"
        return "ok"

    async def step(name: str, fn: Callable[[], Awaitable[str]]) -> bool:
        try:
            outcome = await fn()
        except Exception as exc:  # a driver reports, never crashes
            traceback.print_exc(file=sys.stderr)
            outcome = f"fail: {type(exc).__name__}: {exc}"[:300]
        res.steps[name] = outcome
        return not outcome.startswith("fail")

    try:
        if await step("admin", create) and await step("produce", produce) and \
                await step("consume", consume):
            await step("commit", commit)
            await step("groups", groups)
    finally:
        await consumer.stop()
        if admin is not None:
            await admin.close()


asyncio.run(main())
res.emit()
