"""The consumer-group model (policies.groups) and its handlers, over recorded sequences.

The classic sequences are driven through the real handler table with frames encoded
by this project's schemas; the KIP-848 heartbeats come from an independent encoder,
the ``kio`` package (entities generated from Kafka's message definitions), since no
local broker speaks ConsumerGroupHeartbeat.
"""

from __future__ import annotations

import io
import struct
import uuid
from typing import Any

import pytest

from kproxy.codecs import api_keys
from kproxy.codecs.error_codes import ErrorCode
from kproxy.codecs.headers import ResponseHeader, write_response_header
from kproxy.codecs.interpreter import encode, encode_into
from kproxy.codecs.peek import peek_request
from kproxy.codecs.primitives import Writer
from kproxy.codecs.registry import DECODED, spec_for
from kproxy.codecs.schemas.consumer_protocol import ASSIGNMENT, SUBSCRIPTION, decode_embedded
from kproxy.policies.addressing import PortMap
from kproxy.policies.connection import ConnectionState, Handled
from kproxy.policies.fetch_watermarks import TopicNames, fetch_watermarks
from kproxy.policies.group_handlers import GroupWatch
from kproxy.policies.groups import GroupLimits, GroupTracker, Rebalance
from kproxy.policies.handlers import standard_handlers
from kproxy.policies.proxy_state import ProxyState

from ..support import encode_request


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Bed:
    """A proxy's group handlers and a few client connections, with a settable clock."""

    def __init__(self, limits: GroupLimits | None = None) -> None:
        self.clock = Clock()
        self.events: list[Rebalance] = []
        self.tracker = GroupTracker(limits, on_rebalance=self.events.append)
        self.watch = GroupWatch(self.tracker, self.clock, TopicNames())
        self.handlers = standard_handlers(groups=self.watch)
        self.state = ProxyState(PortMap("proxy.local", 30000, 30000, 0, 1023))
        self.conns: dict[str, ConnectionState] = {}
        self.corr = 0

    def conn(self, who: str) -> ConnectionState:
        if who not in self.conns:
            self.conns[who] = ConnectionState(self.state, self.handlers, "bootstrap", None,
                                              ("127.0.0.1", 40000 + len(self.conns)))
        return self.conns[who]

    def exchange(self, who: str, api_key: int, version: int, req: dict[str, Any],
                 resp: dict[str, Any]) -> None:
        self.corr += 1
        frame = encode_request(api_key, version, self.corr, req)[4:]
        self.send_raw(who, frame, response_frame(api_key, version, self.corr, resp))

    def send_raw(self, who: str, request: bytes, response: bytes) -> None:
        conn = self.conn(who)
        peek = peek_request(memoryview(request))
        assert conn.request(peek, memoryview(request)) is None  # forwarded as received
        assert conn.wants_response(peek.api_key, peek.api_version)
        handled = conn.response(peek.api_key, peek.api_version, peek.api_version,
                                memoryview(response))
        assert handled == Handled()  # relayed unchanged

    # --- the classic protocol, as a member sees it
    def join(self, who: str, group: str, member: str, generation: int, leader: str,
             members: list[str] | None = None, error: int = 0) -> None:
        sub = embed(SUBSCRIPTION, 1, {"topics": ["t"], "user_data": None,
                                      "owned_partitions": []})
        self.exchange(who, api_keys.JOIN_GROUP, 7, {
            "group_id": group, "session_timeout_ms": 6000, "rebalance_timeout_ms": 6000,
            "member_id": member, "group_instance_id": None, "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": sub}]}, {
            "throttle_time_ms": 0, "error_code": error, "generation_id": generation,
            "protocol_type": "consumer", "protocol_name": "range", "leader": leader,
            "member_id": member,
            "members": [{"member_id": m, "group_instance_id": None, "metadata": sub}
                        for m in (members or [])]})

    def sync(self, who: str, group: str, member: str, generation: int,
             partitions: list[int], error: int = 0) -> None:
        assignment = embed(ASSIGNMENT, 0, {"assigned_partitions": [
            {"topic": "t", "partitions": partitions}], "user_data": None})
        self.exchange(who, api_keys.SYNC_GROUP, 5, {
            "group_id": group, "generation_id": generation, "member_id": member,
            "group_instance_id": None, "protocol_type": "consumer", "protocol_name": "range",
            "assignments": []}, {
            "throttle_time_ms": 0, "error_code": error, "protocol_type": "consumer",
            "protocol_name": "range", "assignment": assignment})

    def heartbeat(self, who: str, group: str, member: str, generation: int,
                  error: int = 0) -> None:
        self.exchange(who, api_keys.HEARTBEAT, 4, {
            "group_id": group, "generation_id": generation, "member_id": member,
            "group_instance_id": None}, {"throttle_time_ms": 0, "error_code": error})

    def leave(self, who: str, group: str, member: str) -> None:
        self.exchange(who, api_keys.LEAVE_GROUP, 5, {
            "group_id": group, "members": [{"member_id": member, "group_instance_id": None,
                                            "reason": "bye"}]}, {
            "throttle_time_ms": 0, "error_code": 0, "members": [
                {"member_id": member, "group_instance_id": None, "error_code": 0}]})


def response_frame(api_key: int, version: int, corr: int, body: dict[str, Any]) -> bytes:
    spec = spec_for(api_key, version, response=True)
    assert spec is not None
    w = Writer()
    write_response_header(w, ResponseHeader(corr, {}), api_key, version)
    encode_into(spec, version, body, w)
    return w.getvalue()


def embed(spec: Any, version: int, body: dict[str, Any]) -> bytes:
    return struct.pack(">h", version) + encode(spec, version, body)


def rebalance(bed: Bed, group: str, gen: int, members: list[str], leader: str,
              seconds: float) -> None:
    """Every member joins, then syncs; ``seconds`` pass between the first join and the
    last SyncGroup response."""
    for m in members:
        bed.join(m, group, m, gen, leader, members if m == leader else None)
    bed.clock.now += seconds
    share = {m: [i] for i, m in enumerate(members)}
    for m in members:
        bed.sync(m, group, m, gen, share[m])


def test_a_group_forms_then_grows_then_shrinks() -> None:
    bed = Bed()
    rebalance(bed, "g", 1, ["a", "b", "c"], "a", 0.5)
    assert [(e.generation, e.members_before, e.members_after) for e in bed.events] == [
        (1, 0, 3)]
    assert bed.events[0].seconds == pytest.approx(0.5)
    assert bed.events[0].reason == "new member"
    # A fourth member joins: the others hear REBALANCE_IN_PROGRESS and rejoin.
    for m in ("a", "b", "c"):
        bed.heartbeat(m, "g", m, 1, ErrorCode.REBALANCE_IN_PROGRESS)
    rebalance(bed, "g", 2, ["d", "a", "b", "c"], "a", 1.25)
    # One leaves; the rest rebalance without it.
    bed.leave("b", "g", "b")
    rebalance(bed, "g", 3, ["a", "c", "d"], "a", 0.75)
    g = bed.tracker.groups["g"]
    assert g.rebalances == 3 and g.generation == 3
    assert set(g.members) == {"a", "c", "d"}
    assert [(e.members_before, e.members_after, e.reason) for e in bed.events] == [
        (0, 3, "new member"), (3, 4, "new member"), (4, 3, "member left")]
    assert g.errors == {"REBALANCE_IN_PROGRESS": 3}
    assert (g.protocol_type, g.assignor) == ("consumer", "range")
    assert sum(m.assigned or 0 for m in g.members.values()) == 3


def test_a_member_that_times_out_drops_out_of_the_next_generation() -> None:
    bed = Bed()
    rebalance(bed, "g", 1, ["a", "b"], "a", 0.1)
    # b stops heartbeating; the coordinator expires it and a is told to rejoin.
    bed.clock.now += 7
    bed.heartbeat("a", "g", "a", 1, ErrorCode.REBALANCE_IN_PROGRESS)
    rebalance(bed, "g", 2, ["a"], "a", 0.2)
    g = bed.tracker.groups["g"]
    assert list(g.members) == ["a"] and g.generation == 2
    assert bed.events[-1].members_before == 2 and bed.events[-1].members_after == 1
    # b comes back late: its heartbeat is refused, it is counted and forgotten.
    bed.heartbeat("b", "g", "b", 1, ErrorCode.UNKNOWN_MEMBER_ID)
    assert g.errors["UNKNOWN_MEMBER_ID"] == 1 and "b" not in g.members


def test_a_new_leader_completes_the_round() -> None:
    bed = Bed()
    rebalance(bed, "g", 1, ["a", "b", "c"], "a", 0.1)
    bed.leave("a", "g", "a")  # the leader leaves; b leads generation 2
    rebalance(bed, "g", 2, ["b", "c"], "b", 0.3)
    assert bed.tracker.groups["g"].generation == 2
    assert [e.generation for e in bed.events] == [1, 2]
    # A stale generation's sync is an error, not a completion.
    bed.sync("c", "g", "c", 1, [], ErrorCode.ILLEGAL_GENERATION)
    assert bed.tracker.groups["g"].errors == {"ILLEGAL_GENERATION": 1}
    assert len(bed.events) == 2


def test_a_round_is_not_complete_until_every_member_has_synced() -> None:
    bed = Bed()
    for m in ("a", "b"):
        bed.join(m, "g", m, 1, "a", ["a", "b"] if m == "a" else None)
    bed.sync("a", "g", "a", 1, [0])
    assert not bed.events
    bed.sync("b", "g", "b", 1, [1])
    assert len(bed.events) == 1


def _kio_frame(entity: Any, header: Any) -> bytes:
    from kio.serial import entity_writer

    buf = io.BytesIO()
    entity_writer(type(header))(buf, header)
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def _cgh_exchange(bed: Bed, who: str, corr: int, member: str, epoch: int,
                  resp_epoch: int, partitions: list[int] | None,
                  error: int = 0) -> None:
    """One KIP-848 heartbeat, both frames written by kio."""
    from kio.schema.consumer_group_heartbeat.v0 import request as kreq
    from kio.schema.consumer_group_heartbeat.v0 import response as kresp
    from kio.schema.errors import ErrorCode as KioError
    from kio.schema.request_header.v2.header import RequestHeader
    from kio.schema.response_header.v1.header import ResponseHeader as KioResponseHeader
    from kio.schema.types import GroupId, TopicName
    from kio.static.primitive import i16, i32, i32Timedelta

    topic = uuid.UUID(int=7)
    req = kreq.ConsumerGroupHeartbeatRequest(
        group_id=GroupId("g848"), member_id=member, member_epoch=i32(epoch),
        rebalance_timeout=i32Timedelta.parse(__import__("datetime").timedelta(seconds=30)),
        subscribed_topic_names=(TopicName("t"),) if epoch == 0 else None,
        server_assignor="uniform" if epoch == 0 else None, topic_partitions=None)
    header = RequestHeader(request_api_key=i16(68), request_api_version=i16(0),
                           correlation_id=i32(corr), client_id="kio")
    assignment = None if partitions is None else kresp.Assignment(topic_partitions=(
        kresp.TopicPartitions(topic_id=topic, partitions=tuple(i32(p) for p in partitions)),))
    resp = kresp.ConsumerGroupHeartbeatResponse(
        throttle_time=i32Timedelta.parse(__import__("datetime").timedelta(0)),
        error_code=KioError(error), error_message=None, member_id=member,
        member_epoch=i32(resp_epoch),
        heartbeat_interval=i32Timedelta.parse(__import__("datetime").timedelta(seconds=5)),
        assignment=assignment)
    bed.send_raw(who, _kio_frame(req, header),
                 _kio_frame(resp, KioResponseHeader(correlation_id=i32(corr))))


def test_kip848_heartbeats_from_an_independent_encoder_feed_the_same_model() -> None:
    pytest.importorskip("kio")
    bed = Bed()
    _cgh_exchange(bed, "a", 1, "ma", 0, 1, [0, 1, 2, 3])  # a joins: epoch 1, all four
    assert [e.generation for e in bed.events] == [1]
    bed.clock.now += 1
    _cgh_exchange(bed, "b", 2, "mb", 0, 2, [])  # b joins: the group moves to epoch 2
    assert len(bed.events) == 1  # a is still at epoch 1
    bed.clock.now += 2
    # a gives up two partitions and reaches epoch 2: every member is at the group's
    # epoch, the round is over (b receives the freed partitions within the epoch).
    _cgh_exchange(bed, "a", 3, "ma", 1, 2, [0, 1])
    assert len(bed.events) == 2
    _cgh_exchange(bed, "b", 4, "mb", 2, 2, [2, 3])
    g = bed.tracker.groups["g848"]
    assert [e.generation for e in bed.events] == [1, 2]
    assert bed.events[1].seconds == pytest.approx(2.0)
    assert bed.events[1].protocol == "consumer" and g.assignor == "uniform"
    assert {m.member_id: m.assigned for m in g.members.values()} == {"ma": 2, "mb": 2}
    _cgh_exchange(bed, "b", 5, "mb", 2, 2, None, ErrorCode.FENCED_MEMBER_EPOCH)
    assert g.errors == {"FENCED_MEMBER_EPOCH": 1} and "mb" not in g.members
    _cgh_exchange(bed, "a", 6, "ma", -1, -1, None)  # a leaves
    assert not g.members


def test_malformed_consumer_protocol_bytes_never_break_forwarding() -> None:
    bed = Bed()
    bad = [b"", b"\x00", b"\x7f\xff" + b"\xff" * 40, b"\x00\x00\x7f\xff\xff\xff",
           b"\x00\x03" + b"\x00" * 3]
    for i, junk in enumerate(bad):
        bed.exchange("a", api_keys.JOIN_GROUP, 5, {
            "group_id": "h", "session_timeout_ms": 6000, "rebalance_timeout_ms": 6000,
            "member_id": "a", "group_instance_id": None, "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": junk}]}, {
            "throttle_time_ms": 0, "error_code": 0, "generation_id": i + 1,
            "protocol_name": "range", "leader": "a", "member_id": "a",
            "members": [{"member_id": "a", "group_instance_id": None, "metadata": junk}]})
        bed.exchange("a", api_keys.SYNC_GROUP, 3, {
            "group_id": "h", "generation_id": i + 1, "member_id": "a",
            "group_instance_id": None, "assignments": [{"member_id": "a",
                                                        "assignment": junk}]},
            {"throttle_time_ms": 0, "error_code": 0, "assignment": junk})
    assert bed.tracker.groups["h"].generation == len(bad)
    # Frames that are not even valid group messages: counted, forwarded, answered as is.
    before = bed.tracker.decode_failures
    bed.send_raw("a", encode_request(api_keys.HEARTBEAT, 4, 99, {
        "group_id": "h", "generation_id": 1, "member_id": "a",
        "group_instance_id": None})[4:-3], b"\x00\x00\x00\x63\x00\xff")
    assert bed.tracker.decode_failures == before + 1
    with pytest.raises(Exception):  # noqa: B017 - any CodecError will do
        decode_embedded(ASSIGNMENT, b"\x00\x00\x7f\xff\xff\xff")


def test_state_stays_bounded_under_ten_thousand_group_ids() -> None:
    bed = Bed(GroupLimits(max_groups=100, max_members=5, max_label_chars=64))
    for i in range(10_000):
        group = f"group-{i}-" + "x" * 500
        bed.heartbeat("a", group, f"m-{i}", 1)
    assert len(bed.tracker.groups) == 100
    assert bed.tracker.evicted_groups == 9_900
    assert all(len(k) <= 64 for k in bed.tracker.groups)
    for i in range(50):
        bed.heartbeat("a", "one", f"member-{i}", 1)
    assert len(bed.tracker.groups["one"].members) == 5
    assert len(bed.conn("a").pending) == 0  # every request met its response


def test_series_expire_when_a_group_goes_quiet() -> None:
    bed = Bed(GroupLimits(expiry_seconds=60))
    rebalance(bed, "g", 1, ["a"], "a", 0.1)
    bed.clock.now += 61
    bed.tracker.expire(bed.clock.now)
    assert not bed.tracker.groups


def test_lag_from_commits_and_fetch_high_watermarks() -> None:
    bed = Bed()
    bed.exchange("a", api_keys.OFFSET_COMMIT, 8, {
        "group_id": "g", "generation_id_or_member_epoch": 1, "member_id": "a",
        "group_instance_id": None, "topics": [{"name": "t", "partitions": [
            {"partition_index": 0, "committed_offset": 400, "committed_leader_epoch": -1,
             "committed_metadata": None},
            {"partition_index": 1, "committed_offset": 10, "committed_leader_epoch": -1,
             "committed_metadata": None}]}]}, {
        "throttle_time_ms": 0, "topics": [{"name": "t", "partitions": [
            {"partition_index": 0, "error_code": 0},
            {"partition_index": 1, "error_code": ErrorCode.ILLEGAL_GENERATION}]}]})
    fetch = DECODED[api_keys.FETCH].response
    body = {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": [
        {"topic": "t", "partitions": [
            {"partition_index": p, "error_code": 0, "high_watermark": hwm,
             "last_stable_offset": hwm, "log_start_offset": 0, "aborted_transactions": None,
             "preferred_read_replica": -1, "records": b"\x00" * 300}
            for p, hwm in ((0, 1000), (1, 50))]}]}
    w = Writer()
    write_response_header(w, ResponseHeader(5, {}), api_keys.FETCH, 12)
    encode_into(fetch, 12, body, w)
    frame = w.getvalue()
    bed.conn("a").observe(api_keys.FETCH, 12, memoryview(frame))
    g = bed.tracker.groups["g"]
    assert bed.tracker.lag(g) == [("t", 0, 600)]  # partition 1's commit was refused
    # The head of a response relayed cut-through: only the first partition is readable.
    marks: list[Any] = []
    assert fetch_watermarks(12, frame[:80], marks) is None
    assert fetch_watermarks(12, frame, []) == len(frame) - 1  # the empty tag section
    assert marks == [("t", 0, 1000)]


def test_fetch_v16_addresses_are_still_rewritten_with_tracking_on() -> None:
    bed = Bed()
    fetch = DECODED[api_keys.FETCH].response
    topic = uuid.uuid4()
    bed.watch.names.learn([{"topic_id": topic, "name": "t"}])
    base = {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": [
        {"topic_id": topic, "partitions": [
            {"partition_index": 0, "error_code": 0, "high_watermark": 77,
             "last_stable_offset": 77, "log_start_offset": 0, "aborted_transactions": None,
             "preferred_read_replica": -1, "records": b"\x00" * 64}]}]}
    conn = bed.conn("a")
    for endpoints in (None, [{"node_id": 5, "host": "broker-5", "port": 9092, "rack": None}]):
        body = dict(base, **({"node_endpoints": endpoints} if endpoints else {}))
        w = Writer()
        write_response_header(w, ResponseHeader(9, {}), api_keys.FETCH, 16)
        encode_into(fetch, 16, body, w)
        frame = w.getvalue()
        assert conn.wants_response(api_keys.FETCH, 16)
        handled = conn.response(api_keys.FETCH, 16, 16, memoryview(frame))
        if endpoints is None:
            assert handled.body is None
        else:
            assert handled.body is not None and b"proxy.local" in bytes(handled.body)
            assert handled.seen is not None and 5 in handled.seen.nodes
    assert bed.tracker.watermarks[("t", 0)] == 77


def test_a_round_never_seen_to_complete_is_abandoned_not_timed_into_the_next() -> None:
    bed = Bed()
    for m in ("a", "b"):  # b's SyncGroup goes through another proxy: never seen here
        bed.join(m, "g", m, 1, "a", ["a", "b"] if m == "a" else None)
    bed.sync("a", "g", "a", 1, [0])
    assert not bed.events
    bed.clock.now += 3600  # an hour later, a real rebalance this proxy sees whole
    rebalance(bed, "g", 2, ["a"], "a", 0.4)
    assert [round(e.seconds, 3) for e in bed.events] == [0.4]
    assert bed.tracker.groups["g"].abandoned_rounds == 1
