"""Reading just enough of a request to route it, without decoding its body.

The proxy relays most frames opaquely; it needs only the api key and version
(to pick a decoder for the response), the correlation id (to keep responses in
order) and whether a Produce request wants an answer at all (``acks=0`` does not).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from kproxy.codecs.api_keys import PRODUCE, api_name, is_flexible
from kproxy.codecs.errors import CodecError
from kproxy.codecs.headers import read_request_header, read_response_header
from kproxy.codecs.primitives import Reader


class RequestPeek(NamedTuple):
    """One per request relayed: a named tuple, made in a third of the time a frozen
    dataclass takes (its ``__init__`` sets each field through ``object.__setattr__``)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int
    expects_response: bool


_CONTROLLED_SHUTDOWN = 7  # v0 of it has no client id in its header
_HEAD = struct.Struct(">hhih")  # api key, version, correlation id, client id length
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
# The first flexible Produce version (compact strings from there on), from the table.
_PRODUCE_FLEXIBLE_SINCE = next(v for v in range(64) if is_flexible(PRODUCE, v))
# The last client id read and its bytes: a connection sends the same one every time.
_last_client_id: tuple[bytes, str] = (b"", "")


def peek_request(frame: bytes | bytearray | memoryview) -> RequestPeek:
    """Read the request header of one frame body (size prefix already removed).

    Every relayed request comes through here. The usual header (a client id of at most
    the frame's length, no tagged fields) is read with one unpack, the client id's text
    reused when its bytes are those of the last request; anything else takes the general
    reader, which also explains what is wrong with a bad header."""
    global _last_client_id
    if len(frame) >= 10:
        api_key, api_version, correlation_id, n = _HEAD.unpack_from(frame)
        pos = 10 + n
        if n >= 0 and pos <= len(frame) and (api_key != _CONTROLLED_SHUTDOWN or api_version):
            if is_flexible(api_key, api_version):  # header v2: tagged fields follow
                if pos >= len(frame) or frame[pos] != 0:
                    return _peek_request(frame)
                pos += 1
            raw = bytes(frame[10 : 10 + n])
            last = _last_client_id
            if raw == last[0]:
                client_id = last[1]
            else:
                try:
                    client_id = str(raw, "utf-8")
                except UnicodeDecodeError:
                    return _peek_request(frame)
                _last_client_id = (raw, client_id)
            expects = True
            if api_key == PRODUCE:
                expects = _produce_acks_at(frame, pos, api_version) != 0
            return RequestPeek(api_key, api_version, correlation_id, client_id, pos, expects)
    return _peek_request(frame)


def _produce_acks_at(frame: bytes | bytearray | memoryview, pos: int, api_version: int) -> int:
    """``produce_acks`` at ``pos``: with no transactional id (a null string, the usual
    producer) one unpack, else the general reader."""
    if api_version < 3:
        at = pos
    elif api_version >= _PRODUCE_FLEXIBLE_SINCE:
        at = pos + 1 if pos < len(frame) and frame[pos] == 0 else -1  # compact null: 0
    else:
        at = pos + 2 if frame[pos:pos + 2] == b"\xff\xff" else -1  # int16 length -1
    if at < 0 or at + 2 > len(frame):
        return produce_acks(Reader(frame, pos), api_version)
    acks: int = _INT16.unpack_from(frame, at)[0]
    return acks


def _peek_request(frame: bytes | bytearray | memoryview) -> RequestPeek:
    r = Reader(frame)
    hdr = read_request_header(r)
    body_offset = r.pos
    expects = True
    if hdr.api_key == PRODUCE:
        expects = produce_acks(r, hdr.api_version) != 0
    return RequestPeek(hdr.api_key, hdr.api_version, hdr.correlation_id, hdr.client_id,
                       body_offset, expects)


def produce_acks(r: Reader, api_version: int) -> int:
    """The ``acks`` of a Produce body; from v3 a transactional id precedes it."""
    try:
        if api_version >= 3:
            at = r.pos
            n = r.string_length(is_flexible(PRODUCE, api_version))
            if n < -1:
                raise CodecError(f"invalid string length {n}", offset=at)
            if n > 0:
                r.skip(n)
        return r.int16()
    except CodecError as exc:
        raise exc.within("ProduceRequest.acks") from None


def peek_correlation_id(frame: bytes | bytearray | memoryview) -> int:
    """The correlation id that opens every response header (every relayed response
    comes through here: one unpack; the reader says what is wrong with a short one)."""
    if len(frame) >= 4:
        correlation_id: int = _INT32.unpack_from(frame)[0]
        return correlation_id
    return Reader(frame).int32()


def peek_response_error(frame: bytes | bytearray | memoryview, api_key: int,
                        api_version: int) -> int:
    """The ErrorCode that opens a response body (SaslAuthenticate, SaslHandshake, ...).

    Reads the header and one int16, nothing after it: for SaslAuthenticate that
    keeps the authentication bytes that follow out of the proxy's hands entirely.
    """
    r = Reader(frame)
    read_response_header(r, api_key, api_version)
    try:
        return r.int16()
    except CodecError as exc:
        raise exc.within(f"{api_name(api_key)}Response.error_code") from None
