"""ApiVersions (key 18), versions 0-4; flexible from v3."""

from kproxy.codecs.schema import MessageSpec, array, f, struct, versions

REQUEST = MessageSpec(
    "ApiVersionsRequest", 18, "request", versions("0-4"), versions("3+"),
    struct(
        "ApiVersionsRequest",
        f("client_software_name", "string", "3+"),
        f("client_software_version", "string", "3+"),
    ),
)

RESPONSE = MessageSpec(
    "ApiVersionsResponse", 18, "response", versions("0-4"), versions("3+"),
    struct(
        "ApiVersionsResponse",
        f("error_code", "int16", "0+"),
        f("api_keys", array(struct(
            "ApiVersion",
            f("api_key", "int16", "0+"),
            f("min_version", "int16", "0+"),
            f("max_version", "int16", "0+"),
        )), "0+"),
        f("throttle_time_ms", "int32", "1+"),
        f("supported_features", array(struct(
            "SupportedFeatureKey",
            f("name", "string", "3+"),
            f("min_version", "int16", "3+"),
            f("max_version", "int16", "3+"),
        )), "3+", tag=0),
        f("finalized_features_epoch", "int64", "3+", tag=1, default=-1),
        f("finalized_features", array(struct(
            "FinalizedFeatureKey",
            f("name", "string", "3+"),
            f("max_version_level", "int16", "3+"),
            f("min_version_level", "int16", "3+"),
        )), "3+", tag=2),
        f("zk_migration_ready", "bool", "3+", tag=3),
    ),
)
