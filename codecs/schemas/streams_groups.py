"""Streams groups (KIP-1071): StreamsGroupHeartbeat (88), version 0, flexible.

Relayed byte for byte and decoded only to observe the group (``policies.groups``), as
ConsumerGroupHeartbeat is. The response may carry host:port endpoints
(``partitions_by_user_endpoint``): they are the Streams application's own
interactive-query servers, not brokers, so nothing here or in the proxy rewrites them.
StreamsGroupDescribe (89) is not decoded at all: it travels as an opaque frame.
The field list follows Kafka's published message definitions; the unit tests check it
against frames written by an independent encoder (``kio``).
"""

from kproxy.codecs.schema import MessageSpec, array, f, struct, versions

_KEY_VALUE = struct("KeyValue", f("key", "string", "0+"), f("value", "string", "0+"))
_TOPIC_INFO = struct(
    "TopicInfo",
    f("name", "string", "0+"),
    f("partitions", "int32", "0+"),
    f("replication_factor", "int16", "0+"),
    f("topic_configs", array(_KEY_VALUE), "0+"),
)
_ENDPOINT = struct("Endpoint", f("host", "string", "0+"), f("port", "uint16", "0+"))
_TASK_OFFSET = struct(
    "TaskOffset",
    f("subtopology_id", "string", "0+"),
    f("partition", "int32", "0+"),
    f("offset", "int64", "0+"),
)
_TASK_IDS = struct(
    "TaskIds",
    f("subtopology_id", "string", "0+"),
    f("partitions", array("int32"), "0+"),
)
_TOPOLOGY = struct(
    "Topology",
    f("epoch", "int32", "0+"),
    f("subtopologies", array(struct(
        "Subtopology",
        f("subtopology_id", "string", "0+"),
        f("source_topics", array("string"), "0+"),
        f("source_topic_regex", array("string"), "0+"),
        f("state_changelog_topics", array(_TOPIC_INFO), "0+"),
        f("repartition_sink_topics", array("string"), "0+"),
        f("repartition_source_topics", array(_TOPIC_INFO), "0+"),
        f("copartition_groups", array(struct(
            "CopartitionGroup",
            f("source_topics", array("int16"), "0+"),
            f("source_topic_regex", array("int16"), "0+"),
            f("repartition_source_topics", array("int16"), "0+"),
        )), "0+"),
    )), "0+"),
)

STREAMS_GROUP_HEARTBEAT_REQUEST = MessageSpec(
    "StreamsGroupHeartbeatRequest", 88, "request", versions("0"), versions("0+"),
    struct(
        "StreamsGroupHeartbeatRequest",
        f("group_id", "string", "0+"),
        f("member_id", "string", "0+"),
        f("member_epoch", "int32", "0+"),
        f("endpoint_information_epoch", "int32", "0+"),
        f("instance_id", "string", "0+", nullable="0+"),
        f("rack_id", "string", "0+", nullable="0+"),
        f("rebalance_timeout_ms", "int32", "0+", default=-1),
        f("topology", _TOPOLOGY, "0+", nullable="0+"),
        f("active_tasks", array(_TASK_IDS), "0+", nullable="0+"),
        f("standby_tasks", array(_TASK_IDS), "0+", nullable="0+"),
        f("warmup_tasks", array(_TASK_IDS), "0+", nullable="0+"),
        f("process_id", "string", "0+", nullable="0+"),
        f("user_endpoint", _ENDPOINT, "0+", nullable="0+"),
        f("client_tags", array(_KEY_VALUE), "0+", nullable="0+"),
        f("task_offsets", array(_TASK_OFFSET), "0+", nullable="0+"),
        f("task_end_offsets", array(_TASK_OFFSET), "0+", nullable="0+"),
        f("shutdown_application", "bool", "0+", default=False),
    ),
)

_TOPIC_PARTITION = struct(
    "TopicPartition",
    f("topic", "string", "0+"),
    f("partitions", array("int32"), "0+"),
)

STREAMS_GROUP_HEARTBEAT_RESPONSE = MessageSpec(
    "StreamsGroupHeartbeatResponse", 88, "response", versions("0"), versions("0+"),
    struct(
        "StreamsGroupHeartbeatResponse",
        f("throttle_time_ms", "int32", "0+"),
        f("error_code", "int16", "0+"),
        f("error_message", "string", "0+", nullable="0+"),
        f("member_id", "string", "0+"),
        f("member_epoch", "int32", "0+"),
        f("heartbeat_interval_ms", "int32", "0+"),
        f("acceptable_recovery_lag", "int32", "0+"),
        f("task_offset_interval_ms", "int32", "0+"),
        f("status", array(struct(
            "Status",
            f("status_code", "int8", "0+"),
            f("status_detail", "string", "0+"),
        )), "0+", nullable="0+"),
        f("active_tasks", array(_TASK_IDS), "0+", nullable="0+"),
        f("standby_tasks", array(_TASK_IDS), "0+", nullable="0+"),
        f("warmup_tasks", array(_TASK_IDS), "0+", nullable="0+"),
        f("endpoint_information_epoch", "int32", "0+"),
        f("partitions_by_user_endpoint", array(struct(
            "EndpointToPartitions",
            f("user_endpoint", _ENDPOINT, "0+"),
            f("active_partitions", array(_TOPIC_PARTITION), "0+"),
            f("standby_partitions", array(_TOPIC_PARTITION), "0+"),
        )), "0+", nullable="0+"),
    ),
)
