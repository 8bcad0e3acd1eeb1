"""Kafka's canonical encoding where kproxy re-encodes a response, byte-exact elsewhere."""

from __future__ import annotations

import uuid

import pytest

from kproxy.codecs import api_keys, interpreter
from kproxy.codecs.canonical import omit_default_tags
from kproxy.codecs.interpreter import UNKNOWN_TAGS
from kproxy.codecs.messages import decode_response, encode_response, encode_response_parts
from kproxy.codecs.schema import MessageSpec, array, f, struct, versions
from kproxy.codecs.schemas import api_versions
from kproxy.policies.addressing import PortMap
from kproxy.policies.api_versions import cap_api_versions, default_caps
from kproxy.policies.rewrite import rewrite_response_frame

from ..conftest import load_vectors

PM = PortMap("127.0.0.1", 30000, 30000, 111, 111)

# tansu's ApiVersions v3+ responses end with all four tags at their defaults:
# SupportedFeatures=[], FinalizedFeaturesEpoch=-1, FinalizedFeatures=[], ZkMigrationReady=false.
TANSU_TAGS = bytes.fromhex("04" "000101" "0108ffffffffffffffff" "020101" "030100")
TANSU_API_VERSIONS = [
    v for v in load_vectors()
    if v.api_key == api_keys.API_VERSIONS and v.direction == "response" and v.api_version >= 3
]


def test_the_captured_backend_writes_default_tags() -> None:
    assert TANSU_API_VERSIONS, "no ApiVersions v3+ response among the captured vectors"
    assert all(v.frame.endswith(TANSU_TAGS) for v in TANSU_API_VERSIONS)


@pytest.mark.parametrize("vec", TANSU_API_VERSIONS, ids=lambda v: v.id)
def test_capped_api_versions_are_canonical(vec: object) -> None:
    frame = vec.frame  # type: ignore[attr-defined]
    version = vec.api_version  # type: ignore[attr-defined]
    resp = decode_response(frame, api_keys.API_VERSIONS, version)
    assert encode_response(resp) == frame  # decode -> encode alone stays byte-exact
    cap_api_versions(resp.body, default_caps())
    out = encode_response(resp)
    # Exactly the four default tags went: the same body with them written back
    # differs only in its tag section.
    with_tags = {**resp.body, "supported_features": [], "finalized_features_epoch": -1,
                 "finalized_features": [], "zk_migration_ready": False}
    written = encode_response_parts(api_keys.API_VERSIONS, version, 1, with_tags)
    assert written.endswith(TANSU_TAGS)
    assert out[4:] == written[4:-len(TANSU_TAGS)] + b"\x00"
    again = decode_response(out, api_keys.API_VERSIONS, version).body
    assert set(again) == {"error_code", "api_keys", "throttle_time_ms"}


def test_non_default_tags_are_kept() -> None:
    body = {"error_code": 0, "api_keys": [], "throttle_time_ms": 0,
            "supported_features": [{"name": "kraft.version", "min_version": 0,
                                    "max_version": 1}],
            "finalized_features_epoch": 7, "finalized_features": [],
            "zk_migration_ready": True, UNKNOWN_TAGS: {9: b"\x00"}}
    cap_api_versions(body, default_caps())
    assert set(body) == {"error_code", "api_keys", "throttle_time_ms", "supported_features",
                         "finalized_features_epoch", "zk_migration_ready", UNKNOWN_TAGS}
    frame = encode_response_parts(api_keys.API_VERSIONS, 3, 1, body)
    assert decode_response(frame, api_keys.API_VERSIONS, 3).body[UNKNOWN_TAGS] == {9: b"\x00"}


_NESTED = MessageSpec(
    "Nested", 9999, "response", versions("0"), versions("0+"),
    struct(
        "Nested",
        f("items", array(struct(
            "Item",
            f("leader", struct("Leader", f("id", "int32", "0+", default=-1),
                               f("epoch", "int32", "0+", default=-1)), "0+", tag=0),
            f("flag", "bool", "0+", tag=1),
            f("count", "int32", "0+", tag=2),
        )), "0+"),
        f("rack", "string", "0+", nullable="0+", tag=0),
        f("id", "uuid", "0+", tag=1),
        f("plain", "int32", "0+", default=-1),
    ),
)


def test_nested_structs_and_types_follow_kafka_defaults() -> None:
    msg = {"items": [{"leader": {"id": -1, "epoch": -1}, "flag": False, "count": 0},
                     {"leader": {"id": 4, "epoch": -1}, "flag": True, "count": 0}],
           "rack": None, "id": uuid.UUID(int=0), "plain": -1}
    omit_default_tags(_NESTED, msg)
    # A null rack is not the default (""), so it stays; a regular field is never removed.
    assert msg == {"items": [{}, {"leader": {"id": 4, "epoch": -1}, "flag": True}],
                   "rack": None, "plain": -1}
    out = interpreter.encode(_NESTED, 0, msg)
    assert interpreter.decode(_NESTED, 0, out) == msg


def test_removing_a_default_regular_field_writes_the_same_bytes() -> None:
    body = {"error_code": 0, "api_keys": [], "throttle_time_ms": 0}
    before = interpreter.encode(api_versions.RESPONSE, 3, body)
    omit_default_tags(api_versions.RESPONSE, body)
    assert interpreter.encode(api_versions.RESPONSE, 3, body) == before


def test_find_coordinator_rewrite_still_exact_for_known_fields() -> None:
    body = {"throttle_time_ms": 0, "coordinators": [
        {"key": "g", "node_id": 111, "host": "b", "port": 9092, "error_code": 0,
         "error_message": None}]}
    frame = encode_response_parts(api_keys.FIND_COORDINATOR, 4, 3, body)
    out = rewrite_response_frame(api_keys.FIND_COORDINATOR, 4, frame, PM)
    assert out.frame is not None
    assert decode_response(out.frame, api_keys.FIND_COORDINATOR, 4).body["coordinators"][0][
        "port"] == 30000


def test_walked_responses_keep_their_bytes() -> None:
    """Produce/Fetch are walked, not re-encoded: nothing there is canonicalised."""
    body = {"responses": [{"name": "t", "partition_responses": [
        {"index": 0, "error_code": 0, "base_offset": 5, "log_append_time_ms": -1,
         "log_start_offset": -1, "record_errors": [], "error_message": None,
         "current_leader": {"leader_id": -1, "leader_epoch": -1}}]}],
        "throttle_time_ms": 0}
    frame = encode_response_parts(api_keys.PRODUCE, 10, 1, body)
    assert rewrite_response_frame(api_keys.PRODUCE, 10, frame, PM).frame is None
