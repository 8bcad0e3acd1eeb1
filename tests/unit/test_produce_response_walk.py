"""The hand-written Produce response walk (``codecs.skipping.produce_tags_at``) against the
schema-driven one: the same tag-section offset for every body the schema can encode,
"names no broker" only when the general path finds no NodeEndpoints, and no exception
of any kind on any input (a malformed body takes the general path, which says why)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kproxy.codecs import api_keys
from kproxy.codecs.errors import CodecError
from kproxy.codecs.headers import read_response_header
from kproxy.codecs.interpreter import read_top_level_tags
from kproxy.codecs.messages import encode_response_parts
from kproxy.codecs.primitives import Reader
from kproxy.codecs.registry import DECODED
from kproxy.codecs.skipping import produce_names_no_broker, produce_tags_at
from kproxy.policies.rewrite import rewrite_response_frame

from ..fuzz.targets import PORT_MAP as PM
from ..schema_strategies import INT32, INT64, NODE_ENDPOINT

SPEC = DECODED[api_keys.PRODUCE].response
text = st.text(max_size=40)

partition = st.fixed_dictionaries({
    "index": INT32, "error_code": st.integers(-1, 120), "base_offset": INT64,
    "log_append_time_ms": INT64, "log_start_offset": INT64,
    "record_errors": st.lists(st.fixed_dictionaries({
        "batch_index": INT32, "batch_index_error_message": st.none() | text}), max_size=3),
    "error_message": st.none() | text,
}, optional={"current_leader": st.fixed_dictionaries(
    {"leader_id": INT32, "leader_epoch": INT32})})


@st.composite
def responses(draw: st.DrawFn) -> tuple[int, bytes, bool]:
    version = draw(st.integers(10, 13))
    topic: dict[str, Any] = {"partition_responses": draw(st.lists(partition, max_size=4))}
    topics = draw(st.lists(st.just(topic), max_size=3))
    for t in topics:
        if version >= 13:
            t["topic_id"] = draw(st.uuids())
        else:
            t["name"] = draw(text)
    body: dict[str, Any] = {"responses": topics, "throttle_time_ms": draw(INT32)}
    endpoints = draw(st.none() | st.lists(NODE_ENDPOINT, min_size=1, max_size=3))
    if endpoints is not None:
        body["node_endpoints"] = endpoints
    return version, encode_response_parts(api_keys.PRODUCE, version, 7, body), bool(endpoints)


def general_walk(frame: bytes, version: int) -> tuple[int, dict[str, Any]]:
    r = Reader(frame)
    read_response_header(r, api_keys.PRODUCE, version)
    return read_top_level_tags(SPEC, version, r)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(responses())
def test_same_offset_as_the_schema_walk(case: tuple[int, bytes, bool]) -> None:
    version, frame, has_endpoints = case
    start, tags = general_walk(frame, version)
    assert produce_tags_at(frame, version) == start
    assert produce_tags_at(memoryview(frame), version) == start
    assert produce_names_no_broker(frame, version) is (not has_endpoints)
    assert ("node_endpoints" in tags) is has_endpoints
    out = rewrite_response_frame(api_keys.PRODUCE, version, memoryview(frame), PM)
    assert (out.frame is not None) is has_endpoints  # endpoints still rewritten


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(responses(), st.data())
def test_a_mangled_body_never_raises_and_never_hides_endpoints(
        case: tuple[int, bytes, bool], data: st.DataObject) -> None:
    version, frame, _ = case
    cut = data.draw(st.integers(0, len(frame)))
    noise = data.draw(st.binary(max_size=12))
    at = data.draw(st.integers(0, len(frame)))
    for bad in (frame[:cut], frame[:at] + noise + frame[at + len(noise):], frame + noise):
        assert produce_tags_at(bad, version) is None or isinstance(
            produce_tags_at(bad, version), int)
        if produce_names_no_broker(bad, version):
            # The cheap walk said "nothing to rewrite": the general walk agrees.
            _, tags = general_walk(bad, version)
            assert not tags.get("node_endpoints")


@given(st.binary(max_size=200), st.integers(0, 20))
def test_any_bytes_any_version(raw: bytes, version: int) -> None:
    assert produce_tags_at(raw, version) is None or isinstance(
        produce_tags_at(raw, version), int)
    if produce_names_no_broker(raw, version):
        try:
            _, tags = general_walk(raw, version)
        except CodecError as exc:  # pragma: no cover - would be a disagreement
            raise AssertionError(f"the cheap walk accepted what the general one refuses: "
                                 f"{exc}") from None
        assert not tags.get("node_endpoints")


def test_versions_outside_the_walk_take_the_general_path() -> None:
    body = {"responses": [], "throttle_time_ms": 0}
    for version in (9, 14):
        if version in SPEC.valid:
            frame = encode_response_parts(api_keys.PRODUCE, version, 7, body)
            assert produce_tags_at(frame, version) is None
