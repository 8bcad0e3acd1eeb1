"""High watermarks read from a Fetch response without decoding it.

The walk reads each partition's index and high watermark (its first fields) and
skips the rest of the partition, records included, with the compiled skip program:
nothing is copied. It stops quietly where the bytes stop, so it also reads the first
partitions of a response whose head is all the proxy holds (a large response relayed
cut-through): those partitions are reported, the rest are not.

Topics are named (Fetch v0-12) or identified by topic id (v13+); ids are reported as
such and the caller maps them to names (``TopicNames``).
"""

from __future__ import annotations

import struct
import uuid
from collections import OrderedDict
from typing import Any

from kproxy.codecs import api_keys
from kproxy.codecs.errors import CodecError
from kproxy.codecs.headers import read_response_header
from kproxy.codecs.primitives import Reader
from kproxy.codecs.registry import DECODED
from kproxy.codecs.schema import ArrayOf, Struct
from kproxy.codecs.skipping import skip_struct_at, skip_tags

_HEAD = struct.Struct(">ihq")  # partition_index, error_code, high_watermark

TopicKey = str | uuid.UUID
Watermark = tuple[TopicKey, int, int]


def _partition_struct() -> Struct:
    spec = DECODED[api_keys.FETCH].response
    topics = next(fld for fld in spec.body.fields if fld.name == "responses")
    assert isinstance(topics.type, ArrayOf) and isinstance(topics.type.item, Struct)
    parts = next(fld for fld in topics.type.item.fields if fld.name == "partitions")
    assert isinstance(parts.type, ArrayOf) and isinstance(parts.type.item, Struct)
    return parts.type.item


_PARTITION = _partition_struct()


def fetch_watermarks(api_version: int, frame: bytes | memoryview,
                     out: list[Watermark]) -> int | None:
    """Append (topic, partition, high watermark) for every partition without error that
    lies wholly or by its head within ``frame``. Returns where the topics end (in a
    flexible response, where its top-level tagged fields start), or None when the walk
    could not get there."""
    flexible = api_version >= 12
    r = Reader(frame)
    try:
        read_response_header(r, api_keys.FETCH, api_version)
        r.skip((4 if api_version >= 1 else 0) + (6 if api_version >= 7 else 0))
        for _ in range(_count(r, flexible)):
            topic: TopicKey | None = r.uuid() if api_version >= 13 else r.string(flexible)
            if topic is None:
                raise CodecError("null topic name")
            for _ in range(_count(r, flexible)):
                at = r.pos
                if at + _HEAD.size > r.end:
                    return None
                index, error, hwm = _HEAD.unpack_from(r.buf, at)
                if error == 0:
                    out.append((topic, index, hwm))
                r.pos = skip_struct_at(_PARTITION, api_version, flexible, r, at)
            if flexible:
                skip_tags(r)
    except CodecError:
        return None
    return r.pos


def _count(r: Reader, flexible: bool) -> int:
    n = r.array_length(flexible)
    if n < 0 or n > r.remaining():
        raise CodecError(f"invalid array length {n}")
    return n


class TopicNames:
    """Topic id -> name, learned from Metadata responses (v10+ carry both); bounded."""

    def __init__(self, max_topics: int = 100_000) -> None:
        self.max_topics = max_topics
        self.names: OrderedDict[uuid.UUID, str] = OrderedDict()

    def learn(self, topics: list[dict[str, Any]]) -> None:
        for t in topics:
            topic_id, name = t.get("topic_id"), t.get("name")
            if not isinstance(topic_id, uuid.UUID) or not name or topic_id.int == 0:
                continue
            self.names[topic_id] = name
            self.names.move_to_end(topic_id)
            while len(self.names) > self.max_topics:
                self.names.popitem(last=False)

    def name(self, key: TopicKey) -> str | None:
        return key if isinstance(key, str) else self.names.get(key)
