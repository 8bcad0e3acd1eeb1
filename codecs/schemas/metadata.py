"""Metadata (key 3), versions 0-13; flexible from v9.

v13 adds only the top-level ``error_code`` to the response (KIP-1102), which is
why the proxy can serve v13 to clients over a v12 backend.
"""

from kproxy.codecs.schema import MessageSpec, array, f, struct, versions

REQUEST = MessageSpec(
    "MetadataRequest", 3, "request", versions("0-13"), versions("9+"),
    struct(
        "MetadataRequest",
        f("topics", array(struct(
            "MetadataRequestTopic",
            f("topic_id", "uuid", "10+"),
            f("name", "string", "0+", nullable="10+"),
        )), "0+", nullable="1+"),
        f("allow_auto_topic_creation", "bool", "4+", default=True),
        f("include_cluster_authorized_operations", "bool", "8-10"),
        f("include_topic_authorized_operations", "bool", "8+"),
    ),
)

BROKER = struct(
    "MetadataResponseBroker",
    f("node_id", "int32", "0+"),
    f("host", "string", "0+"),
    f("port", "int32", "0+"),
    f("rack", "string", "1+", nullable="1+"),
)

RESPONSE = MessageSpec(
    "MetadataResponse", 3, "response", versions("0-13"), versions("9+"),
    struct(
        "MetadataResponse",
        f("throttle_time_ms", "int32", "3+"),
        f("brokers", array(BROKER), "0+"),
        f("cluster_id", "string", "2+", nullable="2+"),
        f("controller_id", "int32", "1+", default=-1),
        f("topics", array(struct(
            "MetadataResponseTopic",
            f("error_code", "int16", "0+"),
            f("name", "string", "0+", nullable="12+"),
            f("topic_id", "uuid", "10+"),
            f("is_internal", "bool", "1+"),
            f("partitions", array(struct(
                "MetadataResponsePartition",
                f("error_code", "int16", "0+"),
                f("partition_index", "int32", "0+"),
                f("leader_id", "int32", "0+"),
                f("leader_epoch", "int32", "7+", default=-1),
                f("replica_nodes", array("int32"), "0+"),
                f("isr_nodes", array("int32"), "0+"),
                f("offline_replicas", array("int32"), "5+"),
            )), "0+"),
            f("topic_authorized_operations", "int32", "8+", default=-(2**31)),
        )), "0+"),
        f("cluster_authorized_operations", "int32", "8-10", default=-(2**31)),
        f("error_code", "int16", "13+"),
    ),
)
