"""Every frame captured from real clients and a real broker decodes and re-encodes exactly."""

from __future__ import annotations

import pytest

from kproxy.codecs import api_keys, messages
from kproxy.codecs.headers import read_response_header
from kproxy.codecs.interpreter import encode_top_level_tags, read_top_level_tags
from kproxy.codecs.peek import peek_correlation_id, peek_request
from kproxy.codecs.primitives import Reader
from kproxy.codecs.registry import DECODED, spec_for
from kproxy.codecs.skipping import produce_tags_at

from ..conftest import Vector, load_vectors

VECTORS = load_vectors()
DECODABLE = [
    v for v in VECTORS
    if spec_for(v.api_key, v.api_version, response=v.direction == "response") is not None
]


def test_vectors_cover_every_decoded_api_seen_from_real_clients() -> None:
    clients = {v.client for v in VECTORS}
    assert clients == {"confluent-kafka", "kafka-python", "aiokafka"}
    seen = {(v.api_key, v.direction) for v in DECODABLE}
    for key in (api_keys.API_VERSIONS, api_keys.METADATA, api_keys.FIND_COORDINATOR):
        assert (key, "request") in seen and (key, "response") in seen
    assert (api_keys.DESCRIBE_CLUSTER, "response") in seen
    assert (api_keys.GET_TELEMETRY_SUBSCRIPTIONS, "request") in seen
    assert (api_keys.PRODUCE, "response") in seen and (api_keys.FETCH, "response") in seen
    # Many versions, not one: the three clients speak different ones.
    assert len({v.api_version for v in DECODABLE if v.api_key == api_keys.METADATA}) >= 2
    assert len({v.api_version for v in DECODABLE if v.api_key == api_keys.FIND_COORDINATOR}) >= 3


@pytest.mark.parametrize("vec", DECODABLE, ids=lambda v: v.id)
def test_vector_roundtrips_byte_exact(vec: Vector) -> None:
    if vec.direction == "request":
        req = messages.decode_request(vec.frame)
        assert req.header.api_key == vec.api_key
        assert messages.encode_request(req) == vec.frame
    else:
        resp = messages.decode_response(vec.frame, vec.api_key, vec.api_version)
        assert messages.encode_response(resp) == vec.frame


@pytest.mark.parametrize("vec", [v for v in VECTORS if v.direction == "request"],
                         ids=lambda v: v.id)
def test_peek_reads_every_real_request_header(vec: Vector) -> None:
    peek = peek_request(vec.frame)
    assert (peek.api_key, peek.api_version) == (vec.api_key, vec.api_version)
    assert peek.client_id  # every client names itself
    assert peek.expects_response or vec.api_key == api_keys.PRODUCE


def test_peek_tells_acks_zero_produce_apart() -> None:
    produce = [v for v in VECTORS if v.direction == "request" and v.api_key == api_keys.PRODUCE]
    fire_and_forget = [v for v in produce if not peek_request(v.frame).expects_response]
    # kafka-python's scenario sends exactly one acks=0 batch; everything else wants an answer.
    assert [v.client for v in fire_and_forget] == ["kafka-python"]
    assert b"fire" in fire_and_forget[0].frame
    assert sum(1 for v in produce if peek_request(v.frame).expects_response) >= 20


def test_response_correlation_ids_match_requests() -> None:
    requests = [v for v in VECTORS if v.direction == "request" and v.client == "confluent-kafka"]
    responses = [v for v in VECTORS if v.direction == "response" and v.client == "confluent-kafka"]
    req_ids = {peek_request(v.frame).correlation_id for v in requests}
    assert {peek_correlation_id(v.frame) for v in responses} <= req_ids


@pytest.mark.parametrize(
    "vec",
    [v for v in DECODABLE if v.direction == "response"
     and v.api_key in (api_keys.PRODUCE, api_keys.FETCH)
     and DECODED[v.api_key].response.is_flexible(v.api_version)],
    ids=lambda v: v.id,
)
def test_node_endpoints_walk_reaches_the_tag_section(vec: Vector) -> None:
    spec = DECODED[vec.api_key].response
    r = Reader(vec.frame)
    read_response_header(r, vec.api_key, vec.api_version)
    start, tags = read_top_level_tags(spec, vec.api_version, r)
    has_endpoints = (vec.api_key == api_keys.PRODUCE and vec.api_version >= 10) or (
        vec.api_key == api_keys.FETCH and vec.api_version >= 16)
    if not has_endpoints:
        assert "node_endpoints" not in tags
    # The walk and a full decode agree, and splicing the section back is exact.
    full = messages.decode_response(vec.frame, vec.api_key, vec.api_version).body
    assert tags.get("node_endpoints") == full.get("node_endpoints")
    spliced = vec.frame[:start] + encode_top_level_tags(spec, vec.api_version, tags)
    assert spliced == vec.frame
    if vec.api_key == api_keys.PRODUCE and vec.api_version >= 10:  # the hand-written walk
        assert produce_tags_at(vec.frame, vec.api_version) == start
