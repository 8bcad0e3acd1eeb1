"""Produce requests walked, not built: where each topic, partition and its records lie.

A filter that checks records must find every partition's record bytes and, to refuse
some partitions while forwarding the rest, write the request again without them. The
walk records positions in the frame; nothing is copied (records are views), and the
rewrite joins slices of the original frame with new array counts.

Produce v0-12 name their topics; v13 (Kafka 4.1+) names them by id, which is read
but cannot be matched against topic names (``topic`` is None then).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from kproxy.codecs.api_keys import PRODUCE, is_flexible
from kproxy.codecs.errors import CodecError
from kproxy.codecs.headers import read_request_header
from kproxy.codecs.primitives import Reader, Writer

TOPIC_IDS_SINCE = 13


@dataclass(slots=True)
class PartitionData:
    index: int
    records: memoryview | None  # the partition's record batches, a view into the frame
    start: int  # the partition entry's first byte in the frame
    end: int  # one past its last (its tagged fields included)


@dataclass(slots=True)
class TopicData:
    topic: str | None  # None at v13+, where only the id is sent
    topic_id: uuid.UUID | None
    partitions: list[PartitionData]
    name_start: int  # the topic's name (or id) field
    name_end: int
    tags_start: int  # the topic entry's tagged fields (flexible versions), or its end
    end: int


@dataclass(slots=True)
class ProduceRequest:
    api_version: int
    correlation_id: int
    acks: int
    transactional_id: str | None
    topics: list[TopicData] = field(default_factory=list)
    topics_at: int = 0  # where the topics array's length starts
    tail_at: int = 0  # the top-level tagged fields (flexible), or the frame's end


def walk(frame: memoryview) -> ProduceRequest:
    """Read a Produce request frame (header included, no size prefix)."""
    r = Reader(frame)
    header = read_request_header(r)
    if header.api_key != PRODUCE:
        raise CodecError(f"api key {header.api_key} is not Produce", what="ProduceRequest")
    version = header.api_version
    flexible = is_flexible(PRODUCE, version)
    try:
        txn = r.string(flexible) if version >= 3 else None
        acks = r.int16()
        r.int32()  # timeout
        req = ProduceRequest(version, header.correlation_id, acks, txn, topics_at=r.pos)
        for _ in range(_length(r, flexible)):
            req.topics.append(_topic(r, version, flexible))
        req.tail_at = r.pos
        if flexible:
            _skip_tags(r)
        r.expect_end("ProduceRequest")
    except CodecError as exc:
        raise exc.within("ProduceRequest") from None
    return req


def _topic(r: Reader, version: int, flexible: bool) -> TopicData:
    name_start = r.pos
    name = topic_id = None
    if version >= TOPIC_IDS_SINCE:
        topic_id = r.uuid()
    else:
        name = r.string(flexible)
        if name is None:
            raise CodecError("null topic name", offset=name_start)
    name_end = r.pos
    partitions = []
    for _ in range(_length(r, flexible)):
        start = r.pos
        index = r.int32()
        records = r.bytes_(flexible)
        if flexible:
            _skip_tags(r)
        partitions.append(PartitionData(index, records, start, r.pos))
    tags_start = r.pos
    if flexible:
        _skip_tags(r)
    return TopicData(name, topic_id, partitions, name_start, name_end, tags_start, r.pos)


def _length(r: Reader, flexible: bool) -> int:
    at = r.pos
    n = r.array_length(flexible)
    if n < 0 or n > r.remaining():
        raise CodecError(f"invalid array length {n}", offset=at)
    return n


def _skip_tags(r: Reader) -> None:
    for _ in range(r.uvarint()):
        r.uvarint()
        r.skip(r.uvarint())


def without(frame: memoryview, req: ProduceRequest,
            dropped: set[tuple[int, int]]) -> bytes:
    """The request again without the partitions ``dropped`` ((topic position, partition
    position) pairs); a topic left with none is left out. Kept bytes are copied once."""
    flexible = is_flexible(PRODUCE, req.api_version)
    w = Writer()
    w.raw(frame[:req.topics_at])
    kept_topics = [(t, topic) for t, topic in enumerate(req.topics)
                   if any((t, p) not in dropped for p in range(len(topic.partitions)))]
    w.array_length(len(kept_topics), flexible)
    for t, topic in kept_topics:
        w.raw(frame[topic.name_start:topic.name_end])
        kept = [part for p, part in enumerate(topic.partitions) if (t, p) not in dropped]
        w.array_length(len(kept), flexible)
        for part in kept:
            w.raw(frame[part.start:part.end])
        w.raw(frame[topic.tags_start:topic.end])
    w.raw(frame[req.tail_at:])
    return w.getvalue()
