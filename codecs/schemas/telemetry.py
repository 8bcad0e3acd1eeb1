"""KIP-714 client telemetry: GetTelemetrySubscriptions (71) and PushTelemetry (72), v0."""

from kproxy.codecs.schema import MessageSpec, array, f, struct, versions

GET_SUBSCRIPTIONS_REQUEST = MessageSpec(
    "GetTelemetrySubscriptionsRequest", 71, "request", versions("0"), versions("0+"),
    struct(
        "GetTelemetrySubscriptionsRequest",
        f("client_instance_id", "uuid", "0+"),
    ),
)

GET_SUBSCRIPTIONS_RESPONSE = MessageSpec(
    "GetTelemetrySubscriptionsResponse", 71, "response", versions("0"), versions("0+"),
    struct(
        "GetTelemetrySubscriptionsResponse",
        f("throttle_time_ms", "int32", "0+"),
        f("error_code", "int16", "0+"),
        f("client_instance_id", "uuid", "0+"),
        f("subscription_id", "int32", "0+"),
        f("accepted_compression_types", array("int8"), "0+"),
        f("push_interval_ms", "int32", "0+"),
        f("telemetry_max_bytes", "int32", "0+"),
        f("delta_temporality", "bool", "0+"),
        f("requested_metrics", array("string"), "0+"),
    ),
)

PUSH_REQUEST = MessageSpec(
    "PushTelemetryRequest", 72, "request", versions("0"), versions("0+"),
    struct(
        "PushTelemetryRequest",
        f("client_instance_id", "uuid", "0+"),
        f("subscription_id", "int32", "0+"),
        f("terminating", "bool", "0+"),
        f("compression_type", "int8", "0+"),
        f("metrics", "bytes", "0+"),
    ),
)

PUSH_RESPONSE = MessageSpec(
    "PushTelemetryResponse", 72, "response", versions("0"), versions("0+"),
    struct(
        "PushTelemetryResponse",
        f("throttle_time_ms", "int32", "0+"),
        f("error_code", "int16", "0+"),
    ),
)
