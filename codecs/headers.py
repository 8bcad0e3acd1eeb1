"""Request header v0-v2 and response header v0-v1.

The header version follows from (api key, api version); see ``api_keys``. The
client id is a classic (non-compact) nullable string even in header v2.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kproxy.codecs.api_keys import request_header_version, response_header_version
from kproxy.codecs.errors import CodecError
from kproxy.codecs.primitives import Reader, Writer


@dataclass
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None = None
    tagged: dict[int, bytes] = field(default_factory=dict)

    @property
    def version(self) -> int:
        return request_header_version(self.api_key, self.api_version)


@dataclass
class ResponseHeader:
    correlation_id: int
    tagged: dict[int, bytes] = field(default_factory=dict)


def _read_raw_tags(r: Reader) -> dict[int, bytes]:
    """A header's tag section, checked like a body's: ascending tags, none repeated.

    Tags are kept by number and written back sorted, so a section out of order or with
    a repeat could not be written back as it came; it is refused instead.
    """
    start = r.pos
    count = r.uvarint()
    if count > r.remaining():
        raise CodecError(f"tagged field count {count} exceeds the bytes left", offset=start)
    tags: dict[int, bytes] = {}
    last = -1
    for _ in range(count):
        tag_at = r.pos
        tag = r.uvarint()
        if tag <= last:
            raise CodecError(f"tag {tag} out of order or repeated", what="tagged fields",
                             offset=tag_at)
        last = tag
        size = r.uvarint()
        if size > r.remaining():
            raise CodecError(f"tag {tag} claims {size} bytes, {r.remaining()} left",
                             what="tagged fields", offset=tag_at)
        tags[tag] = bytes(r.view(size))
    return tags


def _write_raw_tags(w: Writer, tags: dict[int, bytes]) -> None:
    w.uvarint(len(tags))
    for tag in sorted(tags):
        w.uvarint(tag)
        w.uvarint(len(tags[tag]))
        w.raw(tags[tag])


def read_request_header(r: Reader) -> RequestHeader:
    try:
        api_key = r.int16()
        api_version = r.int16()
        correlation_id = r.int32()
        hdr = RequestHeader(api_key, api_version, correlation_id)
        version = hdr.version
        if version >= 1:
            hdr.client_id = r.string(compact=False)
        if version >= 2:
            hdr.tagged = _read_raw_tags(r)
    except CodecError as exc:
        raise exc.within("RequestHeader") from None
    return hdr


def write_request_header(w: Writer, hdr: RequestHeader) -> None:
    w.int16(hdr.api_key)
    w.int16(hdr.api_version)
    w.int32(hdr.correlation_id)
    version = hdr.version
    if version >= 1:
        w.string(hdr.client_id, compact=False)
    if version >= 2:
        _write_raw_tags(w, hdr.tagged)


def read_response_header(r: Reader, api_key: int, api_version: int) -> ResponseHeader:
    try:
        hdr = ResponseHeader(r.int32())
        if response_header_version(api_key, api_version) >= 1:
            hdr.tagged = _read_raw_tags(r)
    except CodecError as exc:
        raise exc.within("ResponseHeader") from None
    return hdr


def write_response_header(w: Writer, hdr: ResponseHeader, api_key: int, api_version: int) -> None:
    w.int32(hdr.correlation_id)
    if response_header_version(api_key, api_version) >= 1:
        _write_raw_tags(w, hdr.tagged)
