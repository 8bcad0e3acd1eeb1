"""Wire primitives against encodings fixed by the Kafka protocol."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kproxy.codecs.errors import CodecError
from kproxy.codecs.primitives import Reader, Writer


@pytest.mark.parametrize(("value", "wire"), [
    (0, b"\x00"), (1, b"\x01"), (127, b"\x7f"), (128, b"\x80\x01"), (300, b"\xac\x02"),
    (2**31 - 1, b"\xff\xff\xff\xff\x07"),
])
def test_unsigned_varint(value: int, wire: bytes) -> None:
    w = Writer()
    w.uvarint(value)
    assert w.getvalue() == wire
    assert Reader(wire).uvarint() == value


@pytest.mark.parametrize(("value", "wire"), [(0, b"\x00"), (-1, b"\x01"), (1, b"\x02"),
                                             (-64, b"\x7f"), (64, b"\x80\x01")])
def test_zigzag_varint(value: int, wire: bytes) -> None:
    w = Writer()
    w.varint(value)
    assert w.getvalue() == wire
    assert Reader(wire).varint() == value


@given(st.integers(-(2**63), 2**63 - 1))
def test_varlong_roundtrip(value: int) -> None:
    w = Writer()
    w.varlong(value)
    assert Reader(w.getvalue()).varlong() == value


def test_overlong_varint_is_rejected() -> None:
    with pytest.raises(CodecError, match="longer than 5 bytes"):
        Reader(b"\xff\xff\xff\xff\xff\x01").uvarint()


def test_strings_classic_and_compact() -> None:
    w = Writer()
    w.string("kafka", compact=False)
    w.string(None, compact=False)
    w.string("ü", compact=True)
    w.string(None, compact=True)
    assert w.getvalue() == b"\x00\x05kafka\xff\xff\x03\xc3\xbc\x00"
    r = Reader(w.getvalue())
    assert [r.string(False), r.string(False), r.string(True), r.string(True)] == [
        "kafka", None, "ü", None]


def test_bytes_and_arrays_use_int32_lengths_when_not_compact() -> None:
    w = Writer()
    w.bytes_(b"ab", compact=False)
    w.array_length(None, compact=False)
    w.array_length(3, compact=True)
    assert w.getvalue() == b"\x00\x00\x00\x02ab\xff\xff\xff\xff\x04"


def test_uuid_and_bool() -> None:
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    w = Writer()
    w.uuid(u)
    w.boolean(True)
    r = Reader(w.getvalue())
    assert r.uuid() == u and r.boolean() is True
    with pytest.raises(CodecError, match="bool byte"):
        Reader(b"\x02").boolean()


def test_short_reads_report_offset() -> None:
    r = Reader(b"\x00\x01\x02")
    r.int16()
    with pytest.raises(CodecError) as err:
        r.int32()
    assert err.value.offset == 2


def test_invalid_utf8_is_a_codec_error() -> None:
    with pytest.raises(CodecError, match="UTF-8"):
        Reader(b"\x00\x02\xff\xfe").string(compact=False)
