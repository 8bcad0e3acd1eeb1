"""The Fetch response walk that relays a response as it arrives (``codecs.partial.fetch_walk``),
and the in-place rewrite of its tail (``policies.rewrite.rewrite_tags_in_place``).

Against the schema: for every body the codec can encode (v12-18), fed in any pieces,
the walk reaches the top-level tagged section exactly where the schema walk does,
reads the same partition heads, and lets every records byte pass as opaque. On any
bytes at all it raises nothing but ``CodecError``. The rewritten tail always has the
original's size and decodes to rewritten endpoints, or to none and a pad."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kproxy.codecs import api_keys
from kproxy.codecs.errors import CodecError
from kproxy.codecs.headers import read_response_header
from kproxy.codecs.interpreter import UNKNOWN_TAGS, decode_top_level_tags, read_top_level_tags
from kproxy.codecs.messages import encode_response_parts
from kproxy.codecs.partial.fetch_walk import FetchWalk, knows
from kproxy.codecs.primitives import Reader
from kproxy.codecs.registry import DECODED
from kproxy.policies.fetch_watermarks import fetch_watermarks
from kproxy.policies.rewrite import PAD_TAG, rewrite_tags_in_place

from ..fuzz.targets import PORT_MAP as PM
from ..fuzz.targets import relay_fetch as drive
from ..schema_strategies import INT32, INT64, NODE_ENDPOINT

SPEC = DECODED[api_keys.FETCH].response
text = st.text(max_size=30)

partition = st.fixed_dictionaries({
    "partition_index": INT32, "error_code": st.integers(-1, 120), "high_watermark": INT64,
    "last_stable_offset": INT64, "log_start_offset": INT64,
    "aborted_transactions": st.none() | st.lists(st.fixed_dictionaries(
        {"producer_id": INT64, "first_offset": INT64}), max_size=3),
    "preferred_read_replica": INT32,
    "records": st.none() | st.binary(max_size=300),
}, optional={
    "current_leader": st.fixed_dictionaries({"leader_id": INT32, "leader_epoch": INT32}),
    "diverging_epoch": st.fixed_dictionaries({"epoch": INT32, "end_offset": INT64}),
})


@st.composite
def responses(draw: st.DrawFn) -> tuple[int, bytes, dict[str, Any]]:
    version = draw(st.integers(12, 18))
    topics = []
    for _ in range(draw(st.integers(0, 3))):
        topic: dict[str, Any] = {"partitions": draw(st.lists(partition, max_size=3))}
        if version >= 13:
            topic["topic_id"] = draw(st.uuids())
        else:
            topic["topic"] = draw(text)
        topics.append(topic)
    body: dict[str, Any] = {"responses": topics, "throttle_time_ms": draw(INT32),
                            "error_code": 0, "session_id": draw(INT32)}
    if version >= 16:
        endpoints = draw(st.none() | st.lists(NODE_ENDPOINT, min_size=1, max_size=3))
        if endpoints is not None:
            body["node_endpoints"] = endpoints
    return version, bytes(encode_response_parts(api_keys.FETCH, version, 7, body)), body


def schema_tail(frame: bytes, version: int) -> int:
    r = Reader(frame)
    read_response_header(r, api_keys.FETCH, version)
    return read_top_level_tags(SPEC, version, r)[0]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(responses(), st.lists(st.integers(1, 64), max_size=6))
def test_the_walk_matches_the_schema_in_any_pieces(
        case: tuple[int, bytes, dict[str, Any]], pieces: list[int]) -> None:
    version, frame, body = case
    walk, out, _ = drive(frame, version, pieces)
    assert out == frame
    assert walk.pos == schema_tail(frame, version)
    marks: list[Any] = []
    fetch_watermarks(version, frame, marks)
    assert [(t, i, h) for t, i, e, h in walk.heads if not e] == marks
    expected = [(p["partition_index"], p["error_code"], p["high_watermark"])
                for t in body["responses"] for p in t["partitions"]]
    assert [(i, e, h) for _, i, e, h in walk.heads] == expected


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(responses())
def test_records_not_yet_received_are_spliced_not_walked(
        case: tuple[int, bytes, dict[str, Any]]) -> None:
    version, frame, body = case
    records = sum(len(p["records"] or b"") for t in body["responses"] for p in t["partitions"])
    _, out, spliced = drive(frame, version, [1])  # one byte at a time: nothing ahead
    assert out == frame
    assert spliced >= records  # tag values pass the same way


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(responses(), st.data())
def test_any_bytes_raise_only_codec_error(case: tuple[int, bytes, dict[str, Any]],
                                          data: st.DataObject) -> None:
    version, frame, _ = case
    mangled = bytearray(frame)
    for _ in range(data.draw(st.integers(1, 4))):
        if mangled and data.draw(st.booleans()):
            mangled[data.draw(st.integers(0, len(mangled) - 1))] = data.draw(st.integers(0, 255))
        else:
            del mangled[data.draw(st.integers(0, len(mangled))):]
    pieces = data.draw(st.lists(st.integers(1, 40), max_size=4))
    with contextlib.suppress(CodecError):
        drive(bytes(mangled), version, pieces)


@given(st.binary(max_size=200), st.integers(12, 18))
def test_random_bytes_raise_only_codec_error(junk: bytes, version: int) -> None:
    with contextlib.suppress(CodecError):
        drive(junk, version, [7])


def test_versions_outside_the_layout_are_refused() -> None:
    assert not knows(11) and not knows(19) and knows(16)
    with pytest.raises(CodecError):
        FetchWalk(11, 100)


# ------------------------------------------------------------------ the tail, in place

def section(endpoints: list[dict[str, Any]] | None, version: int = 16) -> bytes:
    from kproxy.codecs.interpreter import encode_top_level_tags

    return encode_top_level_tags(SPEC, version, {} if endpoints is None
                                 else {"node_endpoints": endpoints})


def test_an_empty_section_is_left_alone() -> None:
    out = rewrite_tags_in_place(api_keys.FETCH, 16, section(None), PM)
    assert out.frame is None and not out.seen.nodes


@pytest.mark.parametrize("host", ["broker-1.kafka.internal.cluster.local", "b1x1234567890"])
def test_endpoints_that_fit_are_rewritten_and_padded(host: str) -> None:
    original = section([{"node_id": 1, "host": host, "port": 9092, "rack": None}])
    out = rewrite_tags_in_place(api_keys.FETCH, 16, original, PM)
    assert out.frame is not None and len(out.frame) == len(original)
    tags = decode_top_level_tags(SPEC, 16, Reader(out.frame))
    (ep,) = tags["node_endpoints"]
    assert (ep["host"], ep["port"]) == PM.advertised(1)
    assert 1 in out.seen.nodes
    pad = tags.get(UNKNOWN_TAGS, {})
    assert set(pad) <= {PAD_TAG} and not any(b for v in pad.values() for b in v)


def test_endpoints_that_do_not_fit_are_left_out() -> None:
    original = section([{"node_id": 1, "host": "b", "port": 9092, "rack": None}])
    out = rewrite_tags_in_place(api_keys.FETCH, 16, original, PM)
    assert out.frame is not None and len(out.frame) == len(original)
    tags = decode_top_level_tags(SPEC, 16, Reader(out.frame))
    assert "node_endpoints" not in tags and set(tags[UNKNOWN_TAGS]) == {PAD_TAG}
    assert 1 in out.seen.nodes  # what the broker said is still learned


@settings(max_examples=300)
@given(st.lists(NODE_ENDPOINT, min_size=1, max_size=4), st.integers(16, 18))
def test_the_rewritten_section_keeps_its_size(endpoints: list[dict[str, Any]],
                                              version: int) -> None:
    original = section(endpoints, version)
    out = rewrite_tags_in_place(api_keys.FETCH, version, original, PM)
    assert out.frame is not None and len(out.frame) == len(original)
    tags = decode_top_level_tags(SPEC, version, Reader(out.frame))
    for ep in tags.get("node_endpoints", []):
        assert ep["host"] == "proxy.example"
    assert "node_endpoints" in tags or PAD_TAG in tags[UNKNOWN_TAGS]


def test_every_section_size_is_kept_when_the_endpoints_are_left_out() -> None:
    # One pad skips a total where its length field takes a byte more (at 128 and 16,384
    # bytes of padding): a section of 132 bytes once failed. An empty host rewritten to
    # the proxy's never fits, so every size here is made of padding alone.
    for rack_len in (*range(400), *range(16_250, 16_450)):
        original = section([{"node_id": 1, "host": "", "port": 9092, "rack": "r" * rack_len}])
        out = rewrite_tags_in_place(api_keys.FETCH, 16, original, PM)
        assert out.frame is not None and len(out.frame) == len(original), len(original)
        assert "node_endpoints" not in decode_top_level_tags(SPEC, 16, Reader(out.frame))


@given(st.binary(max_size=64))
def test_a_section_it_cannot_read_raises_codec_error(junk: bytes) -> None:
    try:
        out = rewrite_tags_in_place(api_keys.FETCH, 16, junk, PM)
    except CodecError:
        return
    assert out.frame is None or len(out.frame) == len(junk)
