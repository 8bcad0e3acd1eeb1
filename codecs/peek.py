"""Reading just enough of a request to route it, without decoding its body.

The proxy relays most frames opaquely; it needs only the api key and version
(to pick a decoder for the response), the correlation id (to keep responses in
order) and whether a Produce request wants an answer at all (``acks=0`` does not).
"""

from __future__ import annotations

from dataclasses import dataclass

from kproxy.codecs.api_keys import PRODUCE, api_name, is_flexible
from kproxy.codecs.errors import CodecError
from kproxy.codecs.headers import read_request_header, read_response_header
from kproxy.codecs.primitives import Reader


@dataclass(frozen=True, slots=True)
class RequestPeek:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int
    expects_response: bool


def peek_request(frame: bytes | bytearray | memoryview) -> RequestPeek:
    """Read the request header of one frame body (size prefix already removed)."""
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
    """The correlation id that opens every response header."""
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
