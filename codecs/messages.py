"""Whole frames: header plus body, decoded and encoded in one call.

This is the entry point for code that needs a full message (the policies, the
``kproxy decode`` command, the tests). The relay's hot path uses ``peek`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kproxy.codecs.api_keys import api_name
from kproxy.codecs.errors import CodecError
from kproxy.codecs.headers import (
    RequestHeader,
    ResponseHeader,
    read_request_header,
    read_response_header,
    write_request_header,
    write_response_header,
)
from kproxy.codecs.interpreter import NO_FIELDS, Message, decode_from, encode_into
from kproxy.codecs.primitives import Reader, Writer
from kproxy.codecs.registry import spec_for


@dataclass
class Request:
    header: RequestHeader
    body: Message


@dataclass
class Response:
    api_key: int
    api_version: int
    header: ResponseHeader
    body: Message


def decode_request(frame: bytes | bytearray | memoryview) -> Request:
    """Decode a request frame body (size prefix removed) of an API the proxy knows."""
    r = Reader(frame)
    header = read_request_header(r)
    return Request(header, decode_request_body(frame, header.api_key, header.api_version,
                                               r.pos))


def decode_request_body(frame: bytes | bytearray | memoryview, api_key: int,
                        api_version: int, body_offset: int) -> Message:
    """The body of a request frame whose header was read already (``peek_request``)."""
    spec = spec_for(api_key, api_version, response=False)
    if spec is None:
        raise CodecError(
            f"{api_name(api_key)} v{api_version} requests are not decoded by this proxy",
            what="RequestHeader", offset=0)
    r = Reader(frame, body_offset)
    body = decode_from(spec, api_version, r)
    r.expect_end(spec.name)
    return body


def decode_response(frame: bytes | bytearray | memoryview, api_key: int,
                    api_version: int, opaque: frozenset[str] = NO_FIELDS) -> Response:
    """Decode a response frame body; the caller says which request it answers.

    Top-level fields named in ``opaque`` are skipped and kept as their bytes.
    """
    spec = spec_for(api_key, api_version, response=True)
    if spec is None:
        raise CodecError(f"{api_name(api_key)} v{api_version} responses are not decoded "
                         "by this proxy", what="ResponseHeader", offset=0)
    r = Reader(frame)
    header = read_response_header(r, api_key, api_version)
    body = decode_from(spec, api_version, r, opaque)
    r.expect_end(spec.name)
    return Response(api_key, api_version, header, body)


def encode_request(req: Request) -> bytes:
    spec = spec_for(req.header.api_key, req.header.api_version, response=False)
    if spec is None:
        raise CodecError(f"cannot encode {api_name(req.header.api_key)} "
                         f"v{req.header.api_version} requests")
    w = Writer()
    write_request_header(w, req.header)
    encode_into(spec, req.header.api_version, req.body, w)
    return w.getvalue()


def encode_response(resp: Response) -> bytes:
    return encode_response_parts(resp.api_key, resp.api_version, resp.header.correlation_id,
                                 resp.body, resp.header.tagged)


def encode_response_parts(api_key: int, api_version: int, correlation_id: int, body: Message,
                          header_tags: dict[int, bytes] | None = None) -> bytes:
    """Encode a response frame body (no size prefix) from its parts."""
    spec = spec_for(api_key, api_version, response=True)
    if spec is None:
        raise CodecError(f"cannot encode {api_name(api_key)} v{api_version} responses")
    w = Writer()
    write_response_header(w, ResponseHeader(correlation_id, header_tags or {}), api_key,
                          api_version)
    encode_into(spec, api_version, body, w)
    return w.getvalue()


def to_jsonable(value: Any) -> Any:
    """Decoded messages as JSON-friendly data (UUIDs and bytes become strings)."""
    import uuid

    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_jsonable(v) for v in value]
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return value
