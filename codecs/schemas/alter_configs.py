"""AlterConfigs (33) and IncrementalAlterConfigs (44), read by the ACL filter to check
each resource (``policies.filters.acl_admin``). The facts are Kafka's message
definitions; the code is ours."""

from kproxy.codecs.schema import Field, MessageSpec, Struct, array, f, struct, versions


def _resources(name: str, *config_fields: Field) -> Struct:
    """Both requests: resources, each with configs (``config_fields`` between a
    config's name and value)."""
    return struct(
        name,
        f("resources", array(struct(
            "AlterConfigsResource",
            f("resource_type", "int8", "0+"),
            f("resource_name", "string", "0+"),
            f("configs", array(struct(
                "AlterableConfig",
                f("name", "string", "0+"),
                *config_fields,
                f("value", "string", "0+", nullable="0+"),
            )), "0+"),
        )), "0+"),
        f("validate_only", "bool", "0+"),
    )


def _results(name: str) -> Struct:
    """Both responses: one result per resource, in the same shape."""
    return struct(
        name,
        f("throttle_time_ms", "int32", "0+"),
        f("responses", array(struct(
            "AlterConfigsResourceResponse",
            f("error_code", "int16", "0+"),
            f("error_message", "string", "0+", nullable="0+"),
            f("resource_type", "int8", "0+"),
            f("resource_name", "string", "0+"),
        )), "0+"),
    )


ALTER_CONFIGS_REQUEST = MessageSpec(
    "AlterConfigsRequest", 33, "request", versions("0-2"), versions("2+"),
    _resources("AlterConfigsRequest"),
)

ALTER_CONFIGS_RESPONSE = MessageSpec(
    "AlterConfigsResponse", 33, "response", versions("0-2"), versions("2+"),
    _results("AlterConfigsResponse"),
)

INCREMENTAL_ALTER_CONFIGS_REQUEST = MessageSpec(
    "IncrementalAlterConfigsRequest", 44, "request", versions("0-1"), versions("1+"),
    _resources("IncrementalAlterConfigsRequest", f("config_operation", "int8", "0+")),
)

INCREMENTAL_ALTER_CONFIGS_RESPONSE = MessageSpec(
    "IncrementalAlterConfigsResponse", 44, "response", versions("0-1"), versions("1+"),
    _results("IncrementalAlterConfigsResponse"),
)
