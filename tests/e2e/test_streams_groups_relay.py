"""Streams groups (KIP-1071) through a running proxy: StreamsGroupHeartbeat and
StreamsGroupDescribe are relayed byte for byte (the host:port inside a heartbeat answer
is the Streams application's own interactive-query server, not a broker, and must not be
rewritten), and the heartbeat still feeds the group model the status page shows.

tansu speaks no streams groups, so the broker is the named FAKE BROKER
(tests/fake_broker.py) answering with frames written by an independent encoder (kio).
"""

from __future__ import annotations

import struct

import pytest
import trio

from kproxy.codecs import api_keys
from kproxy.http.status import snapshot

from ..fake_broker import FakeBroker
from ..support import RawClient
from ..unit.test_streams_groups import frames
from .test_proxy_inprocess import start_proxy

pytest.importorskip("kio")


def describe_frames(corr: int) -> tuple[bytes, bytes]:
    """StreamsGroupDescribe v0 (kproxy never decodes it): a request naming one group, and
    an answer whose bytes only have to come back unchanged."""
    client = b"streams-app"
    request = (struct.pack(">hhih", 89, 0, corr, len(client)) + client + b"\0"
               + b"\x02\x04app" + b"\x00" + b"\x00")  # [app], include_authorized=false
    response = struct.pack(">i", corr) + b"\0" + bytes(range(40))
    return request, response


async def test_streams_heartbeat_and_describe_relayed_byte_for_byte(
        nursery: trio.Nursery) -> None:
    heartbeat_req, heartbeat_resp = frames(11, "m-1", 0, 1, [0, 1], topology=True)
    describe_req, describe_resp = describe_frames(12)
    fake = await FakeBroker(node_ids=[0], canned={
        api_keys.STREAMS_GROUP_HEARTBEAT: (1, heartbeat_resp),
        api_keys.STREAMS_GROUP_DESCRIBE: (1, describe_resp)}).start(nursery)
    proxy = await start_proxy(nursery, fake.bootstrap, node_id_range="0-9")
    client = await RawClient.connect(proxy.bootstrap_port or 0)
    versions = await client.request(api_keys.API_VERSIONS, 3, 1, {
        "client_software_name": "kafka-streams", "client_software_version": "4.2.0"})
    advertised = {e["api_key"]: e["max_version"] for e in versions.body["api_keys"]}
    # The heartbeat is read to observe the group: capped to the version kproxy reads.
    # The describe is never read: the broker's range, untouched.
    assert advertised[api_keys.STREAMS_GROUP_HEARTBEAT] == 0
    assert advertised[api_keys.STREAMS_GROUP_DESCRIBE] == 1

    for request, response in ((heartbeat_req, heartbeat_resp),
                              (describe_req, describe_resp)):
        await client.send(struct.pack(">i", len(request)) + request)
        got = await client.read_frame()
        assert got is not None and bytes(got) == response  # byte for byte
    assert b"app-1.internal" in heartbeat_resp  # the application's endpoint, as sent

    with trio.fail_after(10):
        while not (listed := (snapshot(proxy)["groups"] or {}).get("listed")):
            await trio.sleep(0.05)
    group = listed[0]
    assert (group["group_id"], group["protocol"], group["generation"]) == ("app", "streams", 1)
    assert [(m["member_id"], m["client_id"], m["software"], m["assigned_partitions"])
            for m in group["members"]] == [("m-1", "streams-app", "kafka-streams 4.2.0", 2)]
    await client.aclose()
