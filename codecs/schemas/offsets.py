"""OffsetCommit (key 8, v0-9; flexible from v8) and OffsetFetch (key 9, v0-9; flexible
from v6, several groups per request from v8).

Forwarded unchanged; the proxy reads committed offsets from them to report lag.
"""

from kproxy.codecs.schema import MessageSpec, array, f, struct, versions

OFFSET_COMMIT_REQUEST = MessageSpec(
    "OffsetCommitRequest", 8, "request", versions("0-9"), versions("8+"),
    struct(
        "OffsetCommitRequest",
        f("group_id", "string", "0+"),
        f("generation_id_or_member_epoch", "int32", "1+", default=-1),
        f("member_id", "string", "1+"),
        f("group_instance_id", "string", "7+", nullable="7+"),
        f("retention_time_ms", "int64", "2-4", default=-1),
        f("topics", array(struct(
            "OffsetCommitRequestTopic",
            f("name", "string", "0+"),
            f("partitions", array(struct(
                "OffsetCommitRequestPartition",
                f("partition_index", "int32", "0+"),
                f("committed_offset", "int64", "0+"),
                f("committed_leader_epoch", "int32", "6+", default=-1),
                f("commit_timestamp", "int64", "1", default=-1),
                f("committed_metadata", "string", "0+", nullable="0+"),
            )), "0+"),
        )), "0+"),
    ),
)

OFFSET_COMMIT_RESPONSE = MessageSpec(
    "OffsetCommitResponse", 8, "response", versions("0-9"), versions("8+"),
    struct(
        "OffsetCommitResponse",
        f("throttle_time_ms", "int32", "3+"),
        f("topics", array(struct(
            "OffsetCommitResponseTopic",
            f("name", "string", "0+"),
            f("partitions", array(struct(
                "OffsetCommitResponsePartition",
                f("partition_index", "int32", "0+"),
                f("error_code", "int16", "0+"),
            )), "0+"),
        )), "0+"),
    ),
)

OFFSET_FETCH_REQUEST = MessageSpec(
    "OffsetFetchRequest", 9, "request", versions("0-9"), versions("6+"),
    struct(
        "OffsetFetchRequest",
        f("group_id", "string", "0-7"),
        f("topics", array(struct(
            "OffsetFetchRequestTopic",
            f("name", "string", "0-7"),
            f("partition_indexes", array("int32"), "0-7"),
        )), "0-7", nullable="2-7"),
        f("groups", array(struct(
            "OffsetFetchRequestGroup",
            f("group_id", "string", "8+"),
            f("member_id", "string", "9+", nullable="9+"),
            f("member_epoch", "int32", "9+", default=-1),
            f("topics", array(struct(
                "OffsetFetchRequestTopics",
                f("name", "string", "8+"),
                f("partition_indexes", array("int32"), "8+"),
            )), "8+", nullable="8+"),
        )), "8+"),
        f("require_stable", "bool", "7+"),
    ),
)

_PARTITION = struct(
    "OffsetFetchResponsePartition",
    f("partition_index", "int32", "0+"),
    f("committed_offset", "int64", "0+"),
    f("committed_leader_epoch", "int32", "5+", default=-1),
    f("metadata", "string", "0+", nullable="0+"),
    f("error_code", "int16", "0+"),
)

OFFSET_FETCH_RESPONSE = MessageSpec(
    "OffsetFetchResponse", 9, "response", versions("0-9"), versions("6+"),
    struct(
        "OffsetFetchResponse",
        f("throttle_time_ms", "int32", "3+"),
        f("topics", array(struct(
            "OffsetFetchResponseTopic",
            f("name", "string", "0-7"),
            f("partitions", array(_PARTITION), "0-7"),
        )), "0-7"),
        f("error_code", "int16", "2-7"),
        f("groups", array(struct(
            "OffsetFetchResponseGroup",
            f("group_id", "string", "8+"),
            f("topics", array(struct(
                "OffsetFetchResponseTopics",
                f("name", "string", "8+"),
                f("partitions", array(_PARTITION), "8+"),
            )), "8+"),
            f("error_code", "int16", "8+"),
        )), "8+"),
    ),
)
