"""The classic group membership protocol: JoinGroup (11), Heartbeat (12), LeaveGroup (13),
SyncGroup (14); the heartbeats of groups whose coordinator assigns: ConsumerGroupHeartbeat
(68, KIP-848) and ShareGroupHeartbeat (76, KIP-932).

The proxy forwards these byte for byte; it decodes them only to observe groups
(``policies.groups``). The protocol metadata and assignments inside JoinGroup and
SyncGroup are opaque bytes here; ``consumer_protocol`` reads the consumer's format.
"""

from kproxy.codecs.schema import MessageSpec, array, f, struct, versions

JOIN_GROUP_REQUEST = MessageSpec(
    "JoinGroupRequest", 11, "request", versions("0-9"), versions("6+"),
    struct(
        "JoinGroupRequest",
        f("group_id", "string", "0+"),
        f("session_timeout_ms", "int32", "0+"),
        f("rebalance_timeout_ms", "int32", "1+", default=-1),
        f("member_id", "string", "0+"),
        f("group_instance_id", "string", "5+", nullable="5+"),
        f("protocol_type", "string", "0+"),
        f("protocols", array(struct(
            "JoinGroupRequestProtocol",
            f("name", "string", "0+"),
            f("metadata", "bytes", "0+"),
        )), "0+"),
        f("reason", "string", "8+", nullable="8+"),
    ),
)

JOIN_GROUP_RESPONSE = MessageSpec(
    "JoinGroupResponse", 11, "response", versions("0-9"), versions("6+"),
    struct(
        "JoinGroupResponse",
        f("throttle_time_ms", "int32", "2+"),
        f("error_code", "int16", "0+"),
        f("generation_id", "int32", "0+", default=-1),
        f("protocol_type", "string", "7+", nullable="7+"),
        f("protocol_name", "string", "0+", nullable="7+"),
        f("leader", "string", "0+"),
        f("skip_assignment", "bool", "9+"),
        f("member_id", "string", "0+"),
        f("members", array(struct(
            "JoinGroupResponseMember",
            f("member_id", "string", "0+"),
            f("group_instance_id", "string", "5+", nullable="5+"),
            f("metadata", "bytes", "0+"),
        )), "0+"),
    ),
)

SYNC_GROUP_REQUEST = MessageSpec(
    "SyncGroupRequest", 14, "request", versions("0-5"), versions("4+"),
    struct(
        "SyncGroupRequest",
        f("group_id", "string", "0+"),
        f("generation_id", "int32", "0+"),
        f("member_id", "string", "0+"),
        f("group_instance_id", "string", "3+", nullable="3+"),
        f("protocol_type", "string", "5+", nullable="5+"),
        f("protocol_name", "string", "5+", nullable="5+"),
        f("assignments", array(struct(
            "SyncGroupRequestAssignment",
            f("member_id", "string", "0+"),
            f("assignment", "bytes", "0+"),
        )), "0+"),
    ),
)

SYNC_GROUP_RESPONSE = MessageSpec(
    "SyncGroupResponse", 14, "response", versions("0-5"), versions("4+"),
    struct(
        "SyncGroupResponse",
        f("throttle_time_ms", "int32", "1+"),
        f("error_code", "int16", "0+"),
        f("protocol_type", "string", "5+", nullable="5+"),
        f("protocol_name", "string", "5+", nullable="5+"),
        f("assignment", "bytes", "0+"),
    ),
)

HEARTBEAT_REQUEST = MessageSpec(
    "HeartbeatRequest", 12, "request", versions("0-4"), versions("4+"),
    struct(
        "HeartbeatRequest",
        f("group_id", "string", "0+"),
        f("generation_id", "int32", "0+"),
        f("member_id", "string", "0+"),
        f("group_instance_id", "string", "3+", nullable="3+"),
    ),
)

HEARTBEAT_RESPONSE = MessageSpec(
    "HeartbeatResponse", 12, "response", versions("0-4"), versions("4+"),
    struct(
        "HeartbeatResponse",
        f("throttle_time_ms", "int32", "1+"),
        f("error_code", "int16", "0+"),
    ),
)

LEAVE_GROUP_REQUEST = MessageSpec(
    "LeaveGroupRequest", 13, "request", versions("0-5"), versions("4+"),
    struct(
        "LeaveGroupRequest",
        f("group_id", "string", "0+"),
        f("member_id", "string", "0-2"),
        f("members", array(struct(
            "MemberIdentity",
            f("member_id", "string", "3+"),
            f("group_instance_id", "string", "3+", nullable="3+"),
            f("reason", "string", "5+", nullable="5+"),
        )), "3+"),
    ),
)

LEAVE_GROUP_RESPONSE = MessageSpec(
    "LeaveGroupResponse", 13, "response", versions("0-5"), versions("4+"),
    struct(
        "LeaveGroupResponse",
        f("throttle_time_ms", "int32", "1+"),
        f("error_code", "int16", "0+"),
        f("members", array(struct(
            "MemberResponse",
            f("member_id", "string", "3+"),
            f("group_instance_id", "string", "3+", nullable="3+"),
            f("error_code", "int16", "3+"),
        )), "3+"),
    ),
)

# KIP-848: the coordinator assigns; members heartbeat with their epoch.
_TOPIC_PARTITIONS = struct(
    "TopicPartitions",
    f("topic_id", "uuid", "0+"),
    f("partitions", array("int32"), "0+"),
)

CONSUMER_GROUP_HEARTBEAT_REQUEST = MessageSpec(
    "ConsumerGroupHeartbeatRequest", 68, "request", versions("0-1"), versions("0+"),
    struct(
        "ConsumerGroupHeartbeatRequest",
        f("group_id", "string", "0+"),
        f("member_id", "string", "0+"),
        f("member_epoch", "int32", "0+"),
        f("instance_id", "string", "0+", nullable="0+"),
        f("rack_id", "string", "0+", nullable="0+"),
        f("rebalance_timeout_ms", "int32", "0+", default=-1),
        f("subscribed_topic_names", array("string"), "0+", nullable="0+"),
        f("subscribed_topic_regex", "string", "1+", nullable="1+"),
        f("server_assignor", "string", "0+", nullable="0+"),
        f("topic_partitions", array(_TOPIC_PARTITIONS), "0+", nullable="0+"),
    ),
)

CONSUMER_GROUP_HEARTBEAT_RESPONSE = MessageSpec(
    "ConsumerGroupHeartbeatResponse", 68, "response", versions("0-1"), versions("0+"),
    struct(
        "ConsumerGroupHeartbeatResponse",
        f("throttle_time_ms", "int32", "0+"),
        f("error_code", "int16", "0+"),
        f("error_message", "string", "0+", nullable="0+"),
        f("member_id", "string", "0+", nullable="0+"),
        f("member_epoch", "int32", "0+"),
        f("heartbeat_interval_ms", "int32", "0+"),
        f("assignment", struct(
            "Assignment",
            f("topic_partitions", array(_TOPIC_PARTITIONS), "0+"),
        ), "0+", nullable="0+"),
    ),
)

# KIP-932 share groups: the coordinator assigns, as in KIP-848. Version 1 only (the
# version Kafka 4.1 made stable; the early-access v0 differed and is relayed unread).
SHARE_GROUP_HEARTBEAT_REQUEST = MessageSpec(
    "ShareGroupHeartbeatRequest", 76, "request", versions("1"), versions("0+"),
    struct(
        "ShareGroupHeartbeatRequest",
        f("group_id", "string", "0+"),
        f("member_id", "string", "0+"),
        f("member_epoch", "int32", "0+"),
        f("rack_id", "string", "0+", nullable="0+"),
        f("subscribed_topic_names", array("string"), "0+", nullable="0+"),
    ),
)

SHARE_GROUP_HEARTBEAT_RESPONSE = MessageSpec(
    "ShareGroupHeartbeatResponse", 76, "response", versions("1"), versions("0+"),
    struct(
        "ShareGroupHeartbeatResponse",
        f("throttle_time_ms", "int32", "0+"),
        f("error_code", "int16", "0+"),
        f("error_message", "string", "0+", nullable="0+"),
        f("member_id", "string", "0+", nullable="0+"),
        f("member_epoch", "int32", "0+"),
        f("heartbeat_interval_ms", "int32", "0+"),
        f("assignment", struct(
            "ShareAssignment",
            f("topic_partitions", array(_TOPIC_PARTITIONS), "0+"),
        ), "0+", nullable="0+"),
    ),
)
