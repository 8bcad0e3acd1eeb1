"""Pure policy and ordering logic: address mapping, rewriting, ApiVersions caps, topology."""

from __future__ import annotations

from typing import Any

import pytest

from kproxy.codecs import api_keys, interpreter
from kproxy.codecs.errors import CodecError
from kproxy.codecs.messages import decode_response, encode_response_parts
from kproxy.codecs.primitives import ZERO_UUID
from kproxy.codecs.schemas import api_versions, node_endpoints
from kproxy.policies.addressing import BrokerAddress, PortMap
from kproxy.policies.api_versions import cap_api_versions, default_caps
from kproxy.policies.handlers import standard_handlers
from kproxy.policies.rewrite import (
    COORDINATOR_NOT_AVAILABLE,
    rewrite_describe_cluster,
    rewrite_find_coordinator,
    rewrite_metadata,
    rewrite_response_frame,
)
from kproxy.policies.topology import BackendView
from kproxy.session.errors import ProtocolViolation
from kproxy.session.inflight import OrderedResponses

PM = PortMap("proxy.example", 30000, 40000, 1001, 1003)


def test_port_map_is_deterministic_and_bounded() -> None:
    assert [PM.advertised(n) for n in (1001, 1002, 1003)] == [
        ("proxy.example", p) for p in (30000, 30001, 30002)]
    assert [PM.bind_port(n) for n in (1001, 1003)] == [40000, 40002]
    assert PM.advertised(1000) is None and PM.advertised(1004) is None
    assert PM.node_for_bind_port(40001) == 1002 and PM.node_for_bind_port(39999) is None
    with pytest.raises(ValueError, match="do not fit"):
        PortMap("h", 65000, 65000, 0, 1000)


def test_metadata_brokers_rewritten_and_out_of_range_left_out() -> None:
    body = {"brokers": [
        {"node_id": 1001, "host": "b1.internal", "port": 9092, "rack": "a"},
        {"node_id": 1003, "host": "b3.internal", "port": 9092, "rack": None},
        {"node_id": 7, "host": "stray.internal", "port": 9092, "rack": None},
    ], "cluster_id": "c1", "topics": []}
    seen = rewrite_metadata(body, PM)
    assert body["brokers"] == [
        {"node_id": 1001, "host": "proxy.example", "port": 30000, "rack": "a"},
        {"node_id": 1003, "host": "proxy.example", "port": 30002, "rack": None},
    ]
    assert seen.complete and seen.cluster_id == "c1" and seen.out_of_range == {7}
    assert seen.nodes[1003] == BrokerAddress("b3.internal", 9092, None)
    assert "internal" not in repr(body)


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_find_coordinator_single(version: int) -> None:
    body = {"error_code": 0, "node_id": 1002, "host": "b2.internal", "port": 9093}
    seen = rewrite_find_coordinator(body, version, PM)
    assert (body["host"], body["port"]) == ("proxy.example", 30001)
    assert seen.nodes == {1002: BrokerAddress("b2.internal", 9093)}


def test_find_coordinator_batched_with_out_of_range_and_errors() -> None:
    body = {"coordinators": [
        {"key": "g1", "node_id": 1001, "host": "b1", "port": 1, "error_code": 0,
         "error_message": None},
        {"key": "g2", "node_id": 5, "host": "far", "port": 2, "error_code": 0,
         "error_message": None},
        {"key": "g3", "node_id": -1, "host": "", "port": -1, "error_code": 15,
         "error_message": "loading"},
    ]}
    seen = rewrite_find_coordinator(body, 4, PM)
    g1, g2, g3 = body["coordinators"]
    assert (g1["host"], g1["port"]) == ("proxy.example", 30000)
    assert g2["error_code"] == COORDINATOR_NOT_AVAILABLE and g2["host"] == ""
    assert g3["error_message"] == "loading"
    assert seen.out_of_range == {5}


def test_describe_cluster() -> None:
    body: dict[str, Any] = {"cluster_id": "c", "brokers": [
        {"broker_id": 1002, "host": "b2", "port": 9, "rack": None, "is_fenced": False}]}
    seen = rewrite_describe_cluster(body, PM)
    assert body["brokers"][0]["host"] == "proxy.example" and body["brokers"][0]["port"] == 30001
    assert not seen.complete and seen.cluster_id == "c"


def _fetch_response(version: int, endpoints: list[dict[str, object]] | None) -> bytes:
    body: dict[str, object] = {
        "throttle_time_ms": 0, "error_code": 0, "session_id": 7,
        "responses": [{"topic": "t", "topic_id": ZERO_UUID, "partitions": [
            {"partition_index": 0, "error_code": 6, "high_watermark": 10,
             "last_stable_offset": 10, "log_start_offset": 0, "aborted_transactions": None,
             "preferred_read_replica": -1, "records": b"RECORD-BYTES" * 10,
             "current_leader": {"leader_id": 1002, "leader_epoch": 3}}]}],
    }
    if endpoints is not None:
        body["node_endpoints"] = endpoints
    return encode_response_parts(api_keys.FETCH, version, 99, body)


@pytest.mark.parametrize("version", [16, 17, 18])
def test_fetch_node_endpoints_rewritten_records_untouched(version: int) -> None:
    frame = _fetch_response(version, [
        {"node_id": 1002, "host": "b2.internal", "port": 9092, "rack": "r"},
        {"node_id": 9, "host": "stray", "port": 1, "rack": None}])
    out = rewrite_response_frame(api_keys.FETCH, version, frame, PM)
    assert out.frame is not None and b"internal" not in out.frame
    body = decode_response(out.frame, api_keys.FETCH, version).body
    assert body["node_endpoints"] == [
        {"node_id": 1002, "host": "proxy.example", "port": 30001, "rack": "r"}]
    original = decode_response(frame, api_keys.FETCH, version).body
    assert body["responses"] == original["responses"]
    assert out.seen.out_of_range == {9}


def test_fetch_without_endpoints_is_left_alone() -> None:
    frame = _fetch_response(16, None)
    assert rewrite_response_frame(api_keys.FETCH, 16, frame, PM).frame is None
    # Which responses a connection must see whole: the rest cut through as bytes.
    wants = standard_handlers().responses
    assert not wants[api_keys.FETCH].wants(15) and wants[api_keys.FETCH].wants(16)
    assert wants[api_keys.PRODUCE].wants(10) and not wants[api_keys.PRODUCE].wants(9)


def test_produce_node_endpoints() -> None:
    body = {"responses": [{"name": "t", "partition_responses": [
        {"index": 0, "error_code": 6, "base_offset": -1, "log_append_time_ms": -1,
         "log_start_offset": -1, "record_errors": [], "error_message": None,
         "current_leader": {"leader_id": 1003, "leader_epoch": 1}}]}],
        "throttle_time_ms": 0,
        "node_endpoints": [{"node_id": 1003, "host": "b3", "port": 1, "rack": None}]}
    assert node_endpoints.PRODUCE_RESPONSE.is_flexible(11)
    frame = encode_response_parts(api_keys.PRODUCE, 11, 5, body)
    out = rewrite_response_frame(api_keys.PRODUCE, 11, frame, PM)
    assert out.frame is not None
    assert decode_response(out.frame, api_keys.PRODUCE, 11).body["node_endpoints"][0][
        "port"] == 30002


def test_truncated_fetch_is_a_codec_error() -> None:
    frame = _fetch_response(16, [{"node_id": 1001, "host": "h", "port": 1, "rack": None}])
    with pytest.raises(CodecError):
        rewrite_response_frame(api_keys.FETCH, 16, frame[:-5], PM)


def test_api_versions_capped_and_added() -> None:
    body: dict[str, Any] = {"error_code": 0, "api_keys": [
        {"api_key": 0, "min_version": 3, "max_version": 14},
        {"api_key": 3, "min_version": 0, "max_version": 14},
        {"api_key": 18, "min_version": 0, "max_version": 5},
        {"api_key": 60, "min_version": 5, "max_version": 6},  # entirely above our max
        {"api_key": 11, "min_version": 0, "max_version": 9},  # opaque: untouched
        {"api_key": 78, "min_version": 1, "max_version": 3},  # ShareFetch: rewritten to v2
        {"api_key": 79, "min_version": 1, "max_version": 2},  # ShareAcknowledge
        {"api_key": 71, "min_version": 0, "max_version": 0},
    ]}
    cap_api_versions(body, default_caps(), add={72: (0, 0), 71: (0, 0)})
    got = {e["api_key"]: (e["min_version"], e["max_version"]) for e in body["api_keys"]}
    assert got == {0: (3, 13), 3: (0, 13), 18: (0, 4), 11: (0, 9), 71: (0, 0), 72: (0, 0),
                   78: (1, 2), 79: (1, 2)}
    assert [e["api_key"] for e in body["api_keys"]] == sorted(got)
    assert interpreter.encode(api_versions.RESPONSE, 3, body)


def test_backend_view_epochs() -> None:
    view = BackendView()
    a, b = BrokerAddress("a", 1), BrokerAddress("b", 2)
    assert view.observe({1: a}, "c1", complete=True) is None  # first sight is no change
    assert view.observe({1: a}, "c1", complete=True) is None
    change = view.observe({2: b}, None, complete=False)  # partial: adds, never removes
    assert change is not None and change.epoch == 1 and set(view.nodes) == {1, 2}
    change = view.observe({2: b}, "c1", complete=True)
    assert change is not None and change.removed == {1: a} and view.epoch == 2
    change = view.observe({2: b}, "c2", complete=True)
    assert change is not None and change.cluster_id == ("c1", "c2")
    moved = view.observe({2: BrokerAddress("b", 3)}, "c2", complete=True)
    assert moved is not None and "moved 2=b:3" in moved.describe()
    # The same answer again is no change and leaves the view's broker set as it was;
    # a rack alone changes the set (not the epoch), and so does a partial answer's.
    nodes, epoch = view.nodes, view.epoch
    assert view.observe({2: BrokerAddress("b", 3)}, "c2", complete=True) is None
    assert view.observe({2: BrokerAddress("b", 3)}, None, complete=False) is None
    assert view.nodes is nodes and view.epoch == epoch
    assert view.observe({2: BrokerAddress("b", 3, "r1")}, "c2", complete=True) is None
    assert view.nodes == {2: BrokerAddress("b", 3, "r1")} and view.epoch == epoch
    assert view.observe({2: BrokerAddress("b", 3, "r2")}, None, complete=False) is None
    assert view.nodes == {2: BrokerAddress("b", 3, "r2")} and view.epoch == epoch


def test_ordered_responses_release_strictly_in_order() -> None:
    q = OrderedResponses()
    s1 = q.expect_upstream(1, 3, 12, 0.0)
    q.answer_locally(2, 71, 0, 0.0, b"local-2")
    s3 = q.expect_upstream(3, 3, 12, 0.0)
    assert q.pop_ready() == []  # the local answer waits behind request 1
    first = q.next_upstream(1)
    assert first is not None
    first.wire = b"up-1"
    assert [s.correlation_id for s in q.pop_ready()] == [1, 2]
    with pytest.raises(ProtocolViolation, match="does not match"):
        q.next_upstream(9)
    q.expect_nothing(4)  # an acks=0 request: a broker that answers it anyway is ignored
    assert q.next_upstream(4) is None and q.stray_discarded == 1
    assert q.next_upstream(3) is s3 and s1.wire == b"up-1"
    s3.wire = b"up-3"
    assert [s.wire for s in q.pop_ready()] == [b"up-3"]
    with pytest.raises(ProtocolViolation, match="no request is waiting"):
        q.next_upstream(5)


def test_acks0_memory_is_bounded() -> None:
    from kproxy.session.inflight import ACKS0_REMEMBERED

    q = OrderedResponses()
    for cid in range(ACKS0_REMEMBERED * 3):
        q.expect_nothing(cid)
    acks0 = q._acks0
    assert acks0 is not None and len(acks0) == ACKS0_REMEMBERED
    assert q.next_upstream(ACKS0_REMEMBERED * 3 - 1) is None
    with pytest.raises(ProtocolViolation):
        q.next_upstream(0)  # forgotten long ago: now it is a protocol error
