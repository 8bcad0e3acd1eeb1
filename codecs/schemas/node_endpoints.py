"""Produce (0), Fetch (1), ShareFetch (78) and ShareAcknowledge (79) responses, as far as
KIP-951's NodeEndpoints need.

The proxy never decodes these bodies in full: it skips the per-partition data
(records included, by length) to reach the NodeEndpoints. In Produce v10+ and Fetch
v16+ they live in the top-level tagged section under tag 0; in ShareFetch and
ShareAcknowledge (v0-v2, KIP-932; v0 was Kafka 4.0's early access) they are the last
regular field.
"""

from kproxy.codecs.schema import Field, MessageSpec, array, f, struct, versions

_LEADER = struct(
    "LeaderIdAndEpoch",
    f("leader_id", "int32", "0+", default=-1),
    f("leader_epoch", "int32", "0+", default=-1),
)


_NODE_ENDPOINT = struct(
    "NodeEndpoint",
    f("node_id", "int32", "0+"),
    f("host", "string", "0+"),
    f("port", "int32", "0+"),
    f("rack", "string", "0+", nullable="0+"),
)


def _endpoints(first: str) -> Field:
    return f("node_endpoints", array(_NODE_ENDPOINT), first, tag=0)


PRODUCE_RESPONSE = MessageSpec(
    "ProduceResponse", 0, "response", versions("0-13"), versions("9+"),
    struct(
        "ProduceResponse",
        f("responses", array(struct(
            "TopicProduceResponse",
            f("name", "string", "0-12"),
            f("topic_id", "uuid", "13+"),  # Kafka 4.1+: topics by id
            f("partition_responses", array(struct(
                "PartitionProduceResponse",
                f("index", "int32", "0+"),
                f("error_code", "int16", "0+"),
                f("base_offset", "int64", "0+"),
                f("log_append_time_ms", "int64", "2+", default=-1),
                f("log_start_offset", "int64", "5+", default=-1),
                f("record_errors", array(struct(
                    "BatchIndexAndErrorMessage",
                    f("batch_index", "int32", "8+"),
                    f("batch_index_error_message", "string", "8+", nullable="8+"),
                )), "8+"),
                f("error_message", "string", "8+", nullable="8+"),
                f("current_leader", _LEADER, "10+", tag=0),
            )), "0+"),
        )), "0+"),
        f("throttle_time_ms", "int32", "1+"),
        _endpoints("10+"),
    ),
)

FETCH_RESPONSE = MessageSpec(
    "FetchResponse", 1, "response", versions("0-18"), versions("12+"),
    struct(
        "FetchResponse",
        f("throttle_time_ms", "int32", "1+"),
        f("error_code", "int16", "7+"),
        f("session_id", "int32", "7+"),
        f("responses", array(struct(
            "FetchableTopicResponse",
            f("topic", "string", "0-12"),
            f("topic_id", "uuid", "13+"),
            f("partitions", array(struct(
                "PartitionData",
                f("partition_index", "int32", "0+"),
                f("error_code", "int16", "0+"),
                f("high_watermark", "int64", "0+"),
                f("last_stable_offset", "int64", "4+", default=-1),
                f("log_start_offset", "int64", "5+", default=-1),
                f("diverging_epoch", struct(
                    "EpochEndOffset",
                    f("epoch", "int32", "0+", default=-1),
                    f("end_offset", "int64", "0+", default=-1),
                ), "12+", tag=0),
                f("current_leader", _LEADER, "12+", tag=1),
                f("snapshot_id", struct(
                    "SnapshotId",
                    f("end_offset", "int64", "0+", default=-1),
                    f("epoch", "int32", "0+", default=-1),
                ), "12+", tag=2),
                f("aborted_transactions", array(struct(
                    "AbortedTransaction",
                    f("producer_id", "int64", "4+"),
                    f("first_offset", "int64", "4+"),
                )), "4+", nullable="4+"),
                f("preferred_read_replica", "int32", "11+", default=-1),
                f("records", "records", "0+", nullable="0+"),
            )), "0+"),
        )), "0+"),
        _endpoints("16+"),
    ),
)

_SHARE_LEADER = struct(
    "ShareLeaderIdAndEpoch",
    f("leader_id", "int32", "0+"),
    f("leader_epoch", "int32", "0+"),
)

SHARE_FETCH_RESPONSE = MessageSpec(
    "ShareFetchResponse", 78, "response", versions("0-2"), versions("0+"),
    struct(
        "ShareFetchResponse",
        f("throttle_time_ms", "int32", "0+"),
        f("error_code", "int16", "0+"),
        f("error_message", "string", "0+", nullable="0+"),
        f("acquisition_lock_timeout_ms", "int32", "1+"),
        f("responses", array(struct(
            "ShareFetchableTopicResponse",
            f("topic_id", "uuid", "0+"),
            f("partitions", array(struct(
                "SharePartitionData",
                f("partition_index", "int32", "0+"),
                f("error_code", "int16", "0+"),
                f("error_message", "string", "0+", nullable="0+"),
                f("acknowledge_error_code", "int16", "0+"),
                f("acknowledge_error_message", "string", "0+", nullable="0+"),
                f("current_leader", _SHARE_LEADER, "0+"),
                f("records", "records", "0+", nullable="0+"),
                f("acquired_records", array(struct(
                    "AcquiredRecords",
                    f("first_offset", "int64", "0+"),
                    f("last_offset", "int64", "0+"),
                    f("delivery_count", "int16", "0+"),
                )), "0+"),
            )), "0+"),
        )), "0+"),
        f("node_endpoints", array(_NODE_ENDPOINT), "0+"),
    ),
)

SHARE_ACKNOWLEDGE_RESPONSE = MessageSpec(
    "ShareAcknowledgeResponse", 79, "response", versions("0-2"), versions("0+"),
    struct(
        "ShareAcknowledgeResponse",
        f("throttle_time_ms", "int32", "0+"),
        f("error_code", "int16", "0+"),
        f("error_message", "string", "0+", nullable="0+"),
        f("acquisition_lock_timeout_ms", "int32", "2+"),
        f("responses", array(struct(
            "ShareAcknowledgeTopicResponse",
            f("topic_id", "uuid", "0+"),
            f("partitions", array(struct(
                "ShareAcknowledgePartitionData",
                f("partition_index", "int32", "0+"),
                f("error_code", "int16", "0+"),
                f("error_message", "string", "0+", nullable="0+"),
                f("current_leader", _SHARE_LEADER, "0+"),
            )), "0+"),
        )), "0+"),
        f("node_endpoints", array(_NODE_ENDPOINT), "0+"),
    ),
)
