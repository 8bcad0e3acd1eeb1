"""Produce request frames written by hand: a stand-in producer for what no client sends
on purpose (a decompression bomb, a crafted batch), and frames for the unit tests."""

from __future__ import annotations

from kproxy.codecs.api_keys import PRODUCE, is_flexible
from kproxy.codecs.headers import RequestHeader, write_request_header
from kproxy.codecs.primitives import Writer

Topics = list[tuple[str, list[tuple[int, bytes | None]]]]


def produce_body(version: int, correlation_id: int, topics: Topics, acks: int = -1,
                 client_id: str = "stand-in-producer") -> bytes:
    """A Produce request frame (header included, no size prefix)."""
    flexible = is_flexible(PRODUCE, version)
    w = Writer()
    write_request_header(w, RequestHeader(PRODUCE, version, correlation_id, client_id))
    if version >= 3:
        w.string(None, flexible)
    w.int16(acks)
    w.int32(30_000)
    w.array_length(len(topics), flexible)
    for name, partitions in topics:
        w.string(name, flexible)
        w.array_length(len(partitions), flexible)
        for index, records in partitions:
            w.int32(index)
            w.bytes_(records, flexible)
            if flexible:
                w.uvarint(0)
        if flexible:
            w.uvarint(0)
    if flexible:
        w.uvarint(0)
    return w.getvalue()
