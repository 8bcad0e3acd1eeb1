"""Frame splitting, header versions and the error type's message."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kproxy.codecs import api_keys, interpreter
from kproxy.codecs.errors import CodecError
from kproxy.codecs.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    FrameReader,
    FrameTooLarge,
    frame,
    uninitialised,
)
from kproxy.codecs.headers import (
    RequestHeader,
    read_request_header,
    read_response_header,
    write_request_header,
)
from kproxy.codecs.primitives import Reader, Writer
from kproxy.codecs.schemas import metadata


def test_frames_split_across_arbitrary_chunks() -> None:
    bodies = [b"a" * 5, b"", b"xyz" * 1000]
    stream = b"".join(frame(b) for b in bodies)
    reader = FrameReader()
    out = []
    for i in range(0, len(stream), 7):
        reader.feed(stream[i : i + 7])
        out.extend(reader.frames())
    assert out == bodies
    assert reader.buffered() == 0


def test_one_chunk_holding_one_frame_exactly() -> None:
    """The usual small request: a view of the chunk, the reader empty after it; a size
    over the limit is refused the same way."""
    reader = FrameReader(max_frame_bytes=10)
    data = frame(b"0123456789")
    reader.feed(data)
    [only] = reader.wire_frames()
    assert only.buf is data and bytes(only.body) == b"0123456789"
    assert reader.buffered() == 0 and reader.held() == 0 and reader.wire_frames() == []
    reader.feed(frame(b"ab") + frame(b"c"))  # two frames in one chunk: the general path
    assert [bytes(f.body) for f in reader.wire_frames()] == [b"ab", b"c"]
    reader.feed(frame(b"x" * 11))
    with pytest.raises(FrameTooLarge):
        reader.wire_frames()


@given(bodies=st.lists(st.binary(max_size=300), max_size=6),
       cuts=st.lists(st.integers(1, 97), min_size=1, max_size=20),
       into_room=st.lists(st.booleans(), min_size=1, max_size=20))
def test_large_frames_received_in_place_come_out_whole_and_in_order(
        bodies: list[bytes], cuts: list[int], into_room: list[bool]) -> None:
    stream = b"".join(frame(b) for b in bodies)
    reader = FrameReader(in_place_from=64)
    out, pos, step = [], 0, 0
    while pos < len(stream):
        size = cuts[step % len(cuts)]
        room = reader.room()
        if room is not None and into_room[step % len(into_room)]:
            n = min(size, len(room), len(stream) - pos)
            room[:n] = stream[pos : pos + n]  # as a socket read into the buffer would
            room.release()
            reader.filled(n)
        else:  # a chunk may also carry the end of an open frame and what follows it
            n = min(size, len(stream) - pos)
            reader.feed(stream[pos : pos + n])
        pos += n
        step += 1
        out.extend(reader.frames())
    assert out == bodies
    assert reader.room() is None and reader.buffered() == 0


def test_uninitialised_buffers_are_plain_bytearrays_of_the_size_asked() -> None:
    for n in (0, 1, 4096, 3 * 1024 * 1024):
        buf = uninitialised(n)
        assert type(buf) is bytearray and len(buf) == n
        buf[:] = b"\x07" * n  # writable and resizable as any bytearray
        buf += b"x"
        assert len(buf) == n + 1 and buf[:n] == b"\x07" * n


def test_in_place_frame_is_not_handed_out_before_its_last_byte() -> None:
    body = b"\x01" * 5000
    reader = FrameReader(in_place_from=100)
    reader.feed(frame(body)[:10])
    assert reader.next_wire() is None
    for _ in range(len(body) - 7):  # all but the last byte, one at a time
        reader.feed(b"\x01")
        assert reader.next_wire() is None
    reader.feed(b"\x01")
    whole = reader.next_wire()
    assert whole is not None and bytes(whole.body) == body


def test_in_place_room_is_the_rest_of_the_declared_frame() -> None:
    body = bytes(range(256)) * 4
    reader = FrameReader(in_place_from=100)
    reader.feed(frame(body)[:10])
    assert reader.next_frame() is None
    room = reader.room()
    assert room is not None and len(room) == len(body) + 4 - 10
    room[:] = frame(body)[10:]
    room.release()
    reader.filled(len(body) + 4 - 10)
    assert reader.room() is None
    assert reader.next_frame() == body
    plain = FrameReader()  # clients never get a buffer of a size they only declared
    plain.feed(frame(body)[:10])
    assert plain.next_frame() is None and plain.room() is None


def test_declared_size_over_limit_is_rejected_before_buffering() -> None:
    assert DEFAULT_MAX_FRAME_BYTES == 100 * 1024 * 1024
    reader = FrameReader(max_frame_bytes=1024)
    reader.feed(struct.pack(">i", 1025))
    with pytest.raises(FrameTooLarge, match="1025 bytes exceeds the limit of 1024"):
        reader.next_frame()
    neg = FrameReader()
    neg.feed(struct.pack(">i", -5))
    with pytest.raises(CodecError, match="negative frame size"):
        neg.next_frame()


@pytest.mark.parametrize(("key", "version", "req", "resp"), [
    (api_keys.PRODUCE, 8, 1, 0), (api_keys.PRODUCE, 9, 2, 1),
    (api_keys.METADATA, 12, 2, 1), (api_keys.METADATA, 8, 1, 0),
    (api_keys.API_VERSIONS, 3, 2, 0), (api_keys.API_VERSIONS, 0, 1, 0),
    (api_keys.SASL_HANDSHAKE, 1, 1, 0), (7, 0, 0, 0),
    (api_keys.PUSH_TELEMETRY, 0, 2, 1), (200, 0, 2, 1),
])
def test_header_versions(key: int, version: int, req: int, resp: int) -> None:
    assert api_keys.request_header_version(key, version) == req
    assert api_keys.response_header_version(key, version) == resp


def test_request_header_v2_keeps_tagged_fields() -> None:
    hdr = RequestHeader(api_keys.METADATA, 12, 7, "me", {5: b"\x01\x02"})
    w = Writer()
    write_request_header(w, hdr)
    assert read_request_header(Reader(w.getvalue())) == hdr


def test_response_header_v1_reads_tags() -> None:
    r = Reader(b"\x00\x00\x00\x09\x00")
    assert read_response_header(r, api_keys.METADATA, 12).correlation_id == 9
    assert r.remaining() == 0


# A Metadata v12 request header (v2) up to its tag section: key, version, id, client id.
_HEAD_V2 = struct.pack(">hhih", api_keys.METADATA, 12, 7, 2) + b"me"


@pytest.mark.parametrize(("tags", "needle"), [
    (b"\x02\x05\x00\x03\x00", "tag 3 out of order"),  # 5 then 3
    (b"\x02\x04\x00\x04\x00", "tag 4 out of order or repeated"),
    (b"\x01\x00\x09\x01", "claims 9 bytes"),
    (b"\x7f", "count 127 exceeds"),
])
def test_header_tags_checked_like_body_tags(tags: bytes, needle: str) -> None:
    """Out of order or repeated header tags are refused: written back sorted and
    deduplicated they would not be the bytes that came in."""
    with pytest.raises(CodecError, match=needle) as err:
        read_request_header(Reader(_HEAD_V2 + tags))
    assert "RequestHeader" in str(err.value)
    with pytest.raises(CodecError, match=needle):
        read_response_header(Reader(b"\x00\x00\x00\x09" + tags), api_keys.METADATA, 12)


def test_ascending_header_tags_round_trip() -> None:
    wire = _HEAD_V2 + b"\x02\x01\x01\xaa\x05\x00"
    hdr = read_request_header(Reader(wire))
    assert hdr.tagged == {1: b"\xaa", 5: b""}
    w = Writer()
    write_request_header(w, hdr)
    assert w.getvalue() == wire


def test_codec_error_names_field_path_and_offset() -> None:
    wire = bytearray(interpreter.encode(metadata.RESPONSE, 1, {
        "brokers": [{"node_id": 1, "host": "h", "port": 1, "rack": None}],
        "controller_id": 1, "topics": []}))
    truncated = bytes(wire[:10])
    with pytest.raises(CodecError) as err:
        interpreter.decode(metadata.RESPONSE, 1, truncated)
    assert "MetadataResponse.brokers[0].host" in str(err.value)
    assert err.value.offset == 10  # the host's two length bytes were there, its bytes not


def test_trailing_bytes_are_an_error() -> None:
    wire = interpreter.encode(metadata.REQUEST, 0, {"topics": []}) + b"\x00"
    with pytest.raises(CodecError, match="trailing"):
        interpreter.decode(metadata.REQUEST, 0, wire)


def test_unknown_tagged_fields_survive() -> None:
    body = {"topics": [], "allow_auto_topic_creation": True,
            "include_topic_authorized_operations": False,
            interpreter.UNKNOWN_TAGS: {42: b"future"}}
    wire = interpreter.encode(metadata.REQUEST, 12, body)
    assert wire.endswith(b"\x01\x2a\x06future")
    assert interpreter.decode(metadata.REQUEST, 12, wire) == body
