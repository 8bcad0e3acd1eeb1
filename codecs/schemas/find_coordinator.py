"""FindCoordinator (key 10), versions 0-6; flexible from v3, batched keys from v4."""

from kproxy.codecs.schema import MessageSpec, array, f, struct, versions

REQUEST = MessageSpec(
    "FindCoordinatorRequest", 10, "request", versions("0-6"), versions("3+"),
    struct(
        "FindCoordinatorRequest",
        f("key", "string", "0-3"),
        f("key_type", "int8", "1+"),
        f("coordinator_keys", array("string"), "4+"),
    ),
)

RESPONSE = MessageSpec(
    "FindCoordinatorResponse", 10, "response", versions("0-6"), versions("3+"),
    struct(
        "FindCoordinatorResponse",
        f("throttle_time_ms", "int32", "1+"),
        f("error_code", "int16", "0-3"),
        f("error_message", "string", "1-3", nullable="1-3"),
        f("node_id", "int32", "0-3"),
        f("host", "string", "0-3"),
        f("port", "int32", "0-3"),
        f("coordinators", array(struct(
            "Coordinator",
            f("key", "string", "4+"),
            f("node_id", "int32", "4+"),
            f("host", "string", "4+"),
            f("port", "int32", "4+"),
            f("error_code", "int16", "4+"),
            f("error_message", "string", "4+", nullable="4+"),
        )), "4+"),
    ),
)
