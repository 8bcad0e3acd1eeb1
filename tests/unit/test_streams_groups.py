"""Streams groups (KIP-1071) and share groups (KIP-932) through the group handlers:
StreamsGroupHeartbeat and ShareGroupHeartbeat frames written by an independent encoder
(``kio``, generated from Kafka's message definitions), since no local broker speaks
them. The proxy must read them with its own schemas, relay them unchanged (the endpoints
inside a streams answer are the application's) and track the groups."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from kproxy.codecs import api_keys
from kproxy.codecs.interpreter import encode
from kproxy.codecs.messages import decode_request, decode_response
from kproxy.codecs.peek import peek_request
from kproxy.codecs.registry import DECODED
from kproxy.policies.api_versions import cap_api_versions, default_caps

from .test_groups_policy import Bed, _kio_frame

kio = pytest.importorskip("kio")


def frames(corr: int, member: str, epoch: int, resp_epoch: int,
           tasks: list[int] | None, topology: bool = False) -> tuple[bytes, bytes]:
    from kio.schema.request_header.v2.header import RequestHeader
    from kio.schema.response_header.v1.header import ResponseHeader
    from kio.schema.streams_group_heartbeat.v0 import request as kreq
    from kio.schema.streams_group_heartbeat.v0 import response as kresp
    from kio.schema.types import GroupId, TopicName
    from kio.static.primitive import i8, i16, i32, i32Timedelta, u16

    def ms(n: int) -> Any:
        return i32Timedelta.parse(datetime.timedelta(milliseconds=n))

    topo = kreq.Topology(epoch=i32(1), subtopologies=(kreq.Subtopology(
        subtopology_id="0", source_topics=(TopicName("in"),), source_topic_regex=(),
        state_changelog_topics=(kreq.TopicInfo(name=TopicName("app-store-changelog"),
                                               partitions=i32(0),
                                               replication_factor=i16(0), topic_configs=()),),
        repartition_sink_topics=(), repartition_source_topics=(),
        copartition_groups=()),)) if topology else None
    req = kreq.StreamsGroupHeartbeatRequest(
        group_id=GroupId("app"), member_id=member, member_epoch=i32(epoch),
        endpoint_information_epoch=i32(0), rebalance_timeout=ms(30_000), topology=topo,
        active_tasks=None, standby_tasks=None, warmup_tasks=None, process_id="p-1",
        user_endpoint=kreq.Endpoint(host="app-1.internal", port=u16(8080)),
        client_tags=None, task_offsets=None, task_end_offsets=None)
    resp = kresp.StreamsGroupHeartbeatResponse(
        throttle_time=ms(0), error_code=kio.schema.errors.ErrorCode(0), error_message=None,
        member_id=member, member_epoch=i32(resp_epoch), heartbeat_interval=ms(5000),
        acceptable_recovery_lag=i32(10_000), task_offset_interval=ms(60_000),
        status=(kresp.Status(status_code=i8(1), status_detail="missing in"),),
        active_tasks=None if tasks is None else (kresp.TaskIds(
            subtopology_id="0", partitions=tuple(i32(p) for p in tasks)),),
        standby_tasks=None, warmup_tasks=None, endpoint_information_epoch=i32(3),
        partitions_by_user_endpoint=(kresp.EndpointToPartitions(
            user_endpoint=kresp.Endpoint(host="app-1.internal", port=u16(8080)),
            active_partitions=(kresp.TopicPartition(topic=TopicName("in"),
                                                    partitions=(i32(0),)),),
            standby_partitions=()),))
    header = RequestHeader(request_api_key=i16(88), request_api_version=i16(0),
                           correlation_id=i32(corr), client_id="streams-app")
    return _kio_frame(req, header), _kio_frame(resp, ResponseHeader(correlation_id=i32(corr)))


def test_our_schema_reads_kio_frames_and_writes_them_back_byte_for_byte() -> None:
    request, response = frames(7, "m-1", 0, 1, [0, 1], topology=True)
    req = decode_request(memoryview(request))
    assert req.body["group_id"] == "app" and req.body["topology"]["epoch"] == 1
    assert req.body["user_endpoint"] == {"host": "app-1.internal", "port": 8080}
    resp = decode_response(memoryview(response), api_keys.STREAMS_GROUP_HEARTBEAT, 0)
    body = resp.body
    assert body["member_epoch"] == 1 and body["endpoint_information_epoch"] == 3
    assert body["partitions_by_user_endpoint"][0]["user_endpoint"]["host"] == "app-1.internal"
    spec = DECODED[api_keys.STREAMS_GROUP_HEARTBEAT].response
    assert response.endswith(encode(spec, 0, body))  # the header, then the same body bytes


def test_a_streams_group_is_tracked_as_consumer_groups_are_and_relayed_unchanged() -> None:
    bed = Bed()
    # Bed.send_raw asserts the request is forwarded as received and the response relayed
    # unchanged (Handled() with no rewrite): the application's endpoint stays as it is.
    bed.send_raw("a", *frames(1, "m-a", 0, 1, [0, 1, 2], topology=True))
    g = bed.tracker.groups["app"]
    assert g.protocol == "streams" and g.protocol_type == "streams"
    assert [e.protocol for e in bed.events] == ["streams"] and g.generation == 1
    bed.clock.now += 1
    req, resp = frames(2, "m-b", 0, 2, [])
    bed.send_raw("b", req, resp)
    bed.clock.now += 2
    req, resp = frames(3, "m-a", 1, 2, [0, 1])
    bed.send_raw("a", req, resp)
    assert [e.generation for e in bed.events] == [1, 2]
    assert bed.events[1].seconds == pytest.approx(2.0)
    assert {m.member_id: m.assigned for m in g.members.values()} == {"m-a": 2, "m-b": 0}
    # Who each member is, from its connection.
    assert {m.client_id for m in g.members.values()} == {"streams-app"}


def test_streams_heartbeat_capped_at_the_version_read_and_describe_left_alone() -> None:
    body: dict[str, Any] = {"error_code": 0, "throttle_time_ms": 0, "api_keys": [
        {"api_key": 88, "min_version": 0, "max_version": 1},
        {"api_key": 89, "min_version": 0, "max_version": 1}]}
    cap_api_versions(body, default_caps())
    assert {e["api_key"]: e["max_version"] for e in body["api_keys"]} == {88: 0, 89: 1}
    assert api_keys.STREAMS_GROUP_DESCRIBE not in DECODED  # an opaque frame, untouched


def share_frames(corr: int, member: str, epoch: int, resp_epoch: int,
                 partitions: list[int] | None) -> tuple[bytes, bytes]:
    """A ShareGroupHeartbeat v1 exchange (KIP-932), both frames written by kio."""
    import uuid

    from kio.schema.request_header.v2.header import RequestHeader
    from kio.schema.response_header.v1.header import ResponseHeader
    from kio.schema.share_group_heartbeat.v1 import request as kreq
    from kio.schema.share_group_heartbeat.v1 import response as kresp
    from kio.schema.types import GroupId, TopicName
    from kio.static.primitive import i16, i32, i32Timedelta

    req = kreq.ShareGroupHeartbeatRequest(
        group_id=GroupId("shared"), member_id=member, member_epoch=i32(epoch), rack_id=None,
        subscribed_topic_names=(TopicName("t"),) if epoch == 0 else None)
    assignment = None if partitions is None else kresp.Assignment(topic_partitions=(
        kresp.TopicPartitions(topic_id=uuid.UUID(int=5),
                              partitions=tuple(i32(p) for p in partitions)),))
    resp = kresp.ShareGroupHeartbeatResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        error_code=kio.schema.errors.ErrorCode(0), error_message=None, member_id=member,
        member_epoch=i32(resp_epoch),
        heartbeat_interval=i32Timedelta.parse(datetime.timedelta(seconds=5)),
        assignment=assignment)
    header = RequestHeader(request_api_key=i16(76), request_api_version=i16(1),
                           correlation_id=i32(corr), client_id="share-app")
    return _kio_frame(req, header), _kio_frame(resp, ResponseHeader(correlation_id=i32(corr)))


def test_a_share_group_is_tracked_from_kio_frames() -> None:
    bed = Bed()
    bed.send_raw("a", *share_frames(1, "s-a", 0, 1, [0, 1, 2, 3]))
    bed.clock.now += 1
    bed.send_raw("b", *share_frames(2, "s-b", 0, 2, [2, 3]))
    bed.clock.now += 1
    bed.send_raw("a", *share_frames(3, "s-a", 1, 2, [0, 1]))
    g = bed.tracker.groups["shared"]
    assert g.protocol == "share" and [e.protocol for e in bed.events] == ["share", "share"]
    assert {m.member_id: m.assigned for m in g.members.values()} == {"s-a": 2, "s-b": 2}
    assert bed.tracker.decode_failures == 0
    # The early-access v0 is relayed unread: no schema here reads it, nothing is counted.
    v0 = bytearray(share_frames(4, "s-a", 2, 2, None)[0])
    v0[3] = 0  # request_api_version 1 -> 0
    conn = bed.conn("a")
    assert conn.request(peek_request(memoryview(bytes(v0))), memoryview(bytes(v0))) is None
    assert bed.tracker.decode_failures == 0
