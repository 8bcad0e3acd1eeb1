"""A flood of distinct, long client ids against a running proxy, and its memory cost.

Each id is used for one round of the requests that make a proxy remember a
client: ApiVersions v3 (software name and version set to the id too), Metadata
(the rebootstrap memory), GetTelemetrySubscriptions with a zero instance id (a
new telemetry instance) and a PushTelemetry (series labelled with the id). The
ids are spread over a few connections, pipelined in batches.

``python -m tests.client_id_flood [IDS] [ID_BYTES]`` starts a tansu broker and
``kproxy run``, floods it, and prints the proxy's RSS before and after (the
figure quoted in docs/security.md comes from ``IDS=35000 ID_BYTES=30000``).
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from pathlib import Path

import trio

from kproxy.codecs import api_keys, compression
from kproxy.codecs.messages import decode_response

from .otlp_samples import librdkafka_like_payload
from .support import RawClient, encode_request, kproxy_process, push_body, rss_kib

BATCH = 25
PUSH = compression.compress(4, librdkafka_like_payload(points=1))


def rss_mib(pids: int | list[int]) -> float:
    """Resident memory of one process, or of several together (a proxy's workers)."""
    return sum(rss_kib(pid) for pid in ([pids] if isinstance(pids, int) else pids)) / 1024


def client_id(conn: int, i: int, size: int) -> str:
    return f"flood-{conn:02d}-{i:07d}-".ljust(size, "x")


async def flood(port: int, ids: int, size: int, connections: int = 4) -> int:
    """Sends the rounds; returns how many ids went through all four requests."""
    done = 0

    async def one(conn: int) -> None:
        nonlocal done
        client = await RawClient.connect(port)
        mine = range(conn, ids, connections)
        for start in range(0, len(mine), BATCH):
            batch = [client_id(conn, i, size) for i in mine[start : start + BATCH]]
            out = []
            for n, cid in enumerate(batch):
                out.append(encode_request(api_keys.API_VERSIONS, 3, 3 * n, {
                    "client_software_name": cid, "client_software_version": cid}, cid))
                out.append(encode_request(api_keys.METADATA, 12, 3 * n + 1, {
                    "topics": [], "allow_auto_topic_creation": False,
                    "include_topic_authorized_operations": False}, cid))
                out.append(encode_request(api_keys.GET_TELEMETRY_SUBSCRIPTIONS, 0, 3 * n + 2,
                                          {"client_instance_id": uuid.UUID(int=0)}, cid))
            await client.send(b"".join(out))
            pushes = []
            for n, cid in enumerate(batch):
                for _ in range(2):  # ApiVersions, Metadata
                    assert await client.read_frame(60) is not None
                frame = await client.read_frame(60)
                assert frame is not None
                got = decode_response(frame, api_keys.GET_TELEMETRY_SUBSCRIPTIONS, 0).body
                assert got["error_code"] == 0, got
                pushes.append(encode_request(api_keys.PUSH_TELEMETRY, 0, n,
                                             push_body(got, PUSH, 4), cid))
            await client.send(b"".join(pushes))
            for _ in batch:
                frame = await client.read_frame(60)
                assert frame is not None
                answer = decode_response(frame, api_keys.PUSH_TELEMETRY, 0).body
                assert answer["error_code"] == 0, answer
            done += len(batch)
        await client.aclose()

    async with trio.open_nursery() as nursery:
        for conn in range(connections):
            nursery.start_soon(one, conn)
    return done


def settle(pid: int | list[int], timeout: float = 10.0) -> float:
    """RSS once it stops moving (two readings 0.2 s apart within 1 MiB), or at timeout."""
    deadline = time.monotonic() + timeout
    last = rss_mib(pid)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = rss_mib(pid)
        if abs(now - last) < 1:
            return now
        last = now
    return last


def main() -> None:
    from kproxy.embedded_broker import TansuBroker

    ids = int(sys.argv[1]) if len(sys.argv) > 1 else 35_000
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 30_000
    with tempfile.TemporaryDirectory() as tmp, TansuBroker(
            log_path=Path(tmp) / "tansu.log") as broker, kproxy_process(
            broker.bootstrap, Path(tmp)) as kp:
        pid = kp.process.pid
        trio.run(flood, kp.bootstrap_port, 2000, 16)  # warm up with short ids
        before = settle(pid)
        started = time.monotonic()
        sent = trio.run(flood, kp.bootstrap_port, ids, size)
        took = time.monotonic() - started
        after = settle(pid)
        print(f"{sent} ids of {size} bytes in {took:.1f}s: proxy RSS {before:.0f} MiB -> "
              f"{after:.0f} MiB, retained {after - before:.0f} MiB "
              f"({(after - before) * 1024 * 1024 / max(sent, 1):.0f} bytes per id)")


if __name__ == "__main__":
    main()
