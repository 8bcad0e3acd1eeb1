"""The header peek's one-unpack path reads every request exactly as the general reader
(the header, and a Produce request's acks).

``peek_request`` takes a shortcut for the usual header (issue 30: it runs for every
relayed request); ``_peek_request`` is the general reader it falls back to. For any
header, well formed or not, both give the same peek or both refuse it.
"""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from kproxy.codecs.errors import CodecError
from kproxy.codecs.peek import RequestPeek, _peek_request, peek_correlation_id, peek_request
from kproxy.codecs.primitives import Reader


def both(frame: bytes) -> tuple[RequestPeek | None, RequestPeek | None]:
    out: list[RequestPeek | None] = []
    for peek in (peek_request, _peek_request):
        try:
            out.append(peek(frame))
        except CodecError:
            out.append(None)
    return out[0], out[1]


headers = st.builds(
    lambda key, version, cid, client_id, tags, body: (
        struct.pack(">hhi", key, version, cid)
        + (struct.pack(">h", -1) if client_id is None
           else struct.pack(">h", len(client_id)) + client_id)
        + tags + body),
    st.sampled_from([0, 1, 3, 7, 18, 71, 72, 999, -1]), st.integers(0, 15),
    st.integers(-(2**31), 2**31 - 1),
    st.none() | st.binary(max_size=12) | st.sampled_from([b"rdkafka", "é".encode(), b"\xff"]),
    st.sampled_from([b"", b"\x00", b"\x01\x00\x00", b"\x01\x05\x02ab"]),
    st.binary(max_size=24) | st.sampled_from([b"\x00\x00\x00\x01", b"\xff\xff\x00\x00",
                                              b"\x00\x00", b"\x07txn-idx\x00\x01"]))


@settings(max_examples=3000, deadline=None)
@given(headers)
def test_fast_peek_matches_the_general_reader(frame: bytes) -> None:
    fast, general = both(frame)
    assert fast == general


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=40))
def test_fast_peek_matches_on_any_bytes(frame: bytes) -> None:
    fast, general = both(frame)
    assert fast == general


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=8))
def test_the_correlation_id_peek_matches_the_reader(frame: bytes) -> None:
    """Every relayed response's correlation id is read with one unpack; a frame too
    short for one is refused with the reader's own error."""
    try:
        expected: int | None = Reader(frame).int32()
    except CodecError:
        expected = None
    try:
        got: int | None = peek_correlation_id(frame)
    except CodecError:
        got = None
    assert got == expected


def produce_v9(acks: int) -> bytes:
    """Produce v9 (flexible): header with client id "abc" and no tags, then a null
    compact transactional id, then acks."""
    return struct.pack(">hhih", 0, 9, 5, 3) + b"abc" + b"\x00" + b"\x00" + struct.pack(">h", acks)


def test_a_produce_with_acks_0_expects_nothing() -> None:
    peek = peek_request(produce_v9(0))
    assert (peek.api_key, peek.correlation_id, peek.client_id, peek.expects_response) == (
        0, 5, "abc", False)
    assert peek_request(produce_v9(1)).expects_response
