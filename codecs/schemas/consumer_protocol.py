"""The consumer protocol's embedded formats: what "consumer" groups put in JoinGroup
metadata (a member's subscription) and SyncGroup assignments.

Each is an int16 version followed by a non-flexible body. Readers accept versions
newer than they know by reading the fields they know and ignoring the rest (the
later fields are all ignorable), as Kafka's own consumer does.
"""

from __future__ import annotations

from kproxy.codecs.errors import CodecError
from kproxy.codecs.interpreter import Message, decode_from
from kproxy.codecs.primitives import Reader
from kproxy.codecs.schema import MessageSpec, array, f, struct, versions

_TOPIC_PARTITION = struct(
    "TopicPartition",
    f("topic", "string", "0+"),
    f("partitions", array("int32"), "0+"),
)

SUBSCRIPTION = MessageSpec(
    "ConsumerProtocolSubscription", -1, "data", versions("0-3"), versions("none"),
    struct(
        "ConsumerProtocolSubscription",
        f("topics", array("string"), "0+"),
        f("user_data", "bytes", "0+", nullable="0+"),
        f("owned_partitions", array(_TOPIC_PARTITION), "1+"),
        f("generation_id", "int32", "2+", default=-1),
        f("rack_id", "string", "3+", nullable="3+"),
    ),
)

ASSIGNMENT = MessageSpec(
    "ConsumerProtocolAssignment", -1, "data", versions("0-3"), versions("none"),
    struct(
        "ConsumerProtocolAssignment",
        f("assigned_partitions", array(_TOPIC_PARTITION), "0+"),
        f("user_data", "bytes", "0+", nullable="0+"),
    ),
)


def decode_embedded(spec: MessageSpec, data: bytes | memoryview) -> tuple[int, Message]:
    """The version and body of a subscription or assignment; CodecError if unreadable."""
    r = Reader(data)
    version = r.int16()
    if version < spec.valid.lo:
        raise CodecError(f"{spec.name} version {version} is invalid", what=spec.name)
    body = decode_from(spec, min(version, spec.valid.hi), r)
    if version <= spec.valid.hi and r.remaining():
        raise CodecError(f"{r.remaining()} unexpected trailing bytes", what=spec.name,
                         offset=r.pos)
    return version, body
