"""DescribeCluster (key 60), versions 0-2; flexible at every version."""

from kproxy.codecs.schema import MessageSpec, array, f, struct, versions

REQUEST = MessageSpec(
    "DescribeClusterRequest", 60, "request", versions("0-2"), versions("0+"),
    struct(
        "DescribeClusterRequest",
        f("include_cluster_authorized_operations", "bool", "0+"),
        f("endpoint_type", "int8", "1+", default=1),
        f("include_fenced_brokers", "bool", "2+"),
    ),
)

RESPONSE = MessageSpec(
    "DescribeClusterResponse", 60, "response", versions("0-2"), versions("0+"),
    struct(
        "DescribeClusterResponse",
        f("throttle_time_ms", "int32", "0+"),
        f("error_code", "int16", "0+"),
        f("error_message", "string", "0+", nullable="0+"),
        f("endpoint_type", "int8", "1+", default=1),
        f("cluster_id", "string", "0+"),
        f("controller_id", "int32", "0+", default=-1),
        f("brokers", array(struct(
            "DescribeClusterBroker",
            f("broker_id", "int32", "0+"),
            f("host", "string", "0+"),
            f("port", "int32", "0+"),
            f("rack", "string", "0+", nullable="0+"),
            f("is_fenced", "bool", "2+"),
        )), "0+"),
        f("cluster_authorized_operations", "int32", "0+", default=-(2**31)),
    ),
)
