"""Responses the ACL filter answers itself that no other part of the proxy reads:
InitProducerId (22), AddOffsetsToTxn (25), EndTxn (26). Only their error shape matters."""

from kproxy.codecs.schema import MessageSpec, f, struct, versions

INIT_PRODUCER_ID_RESPONSE = MessageSpec(
    "InitProducerIdResponse", 22, "response", versions("0-5"), versions("2+"),
    struct(
        "InitProducerIdResponse",
        f("throttle_time_ms", "int32", "0+"),
        f("error_code", "int16", "0+"),
        f("producer_id", "int64", "0+", default=-1),
        f("producer_epoch", "int16", "0+"),
    ),
)

ADD_OFFSETS_TO_TXN_RESPONSE = MessageSpec(
    "AddOffsetsToTxnResponse", 25, "response", versions("0-3"), versions("3+"),
    struct(
        "AddOffsetsToTxnResponse",
        f("throttle_time_ms", "int32", "0+"),
        f("error_code", "int16", "0+"),
    ),
)

END_TXN_RESPONSE = MessageSpec(
    "EndTxnResponse", 26, "response", versions("0-3"), versions("3+"),
    struct(
        "EndTxnResponse",
        f("throttle_time_ms", "int32", "0+"),
        f("error_code", "int16", "0+"),
    ),
)
