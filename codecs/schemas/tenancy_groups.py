"""Group and transaction APIs a virtual cluster rewrites (``policies.tenancy``), beyond
the group schemas the proxy already has (``groups``, ``offsets``).

ListGroups, DescribeGroups, DeleteGroups, OffsetDelete, and the transactional APIs
InitProducerId, AddPartitionsToTxn (v0-3, the client's form), AddOffsetsToTxn, EndTxn
and TxnOffsetCommit. Responses without a name in them are not described here: the
virtual cluster relays them unchanged. The facts are Kafka's message definitions.
"""

from kproxy.codecs.schema import MessageSpec, array, f, struct, versions

LIST_GROUPS_REQUEST = MessageSpec(
    "ListGroupsRequest", 16, "request", versions("0-5"), versions("3+"),
    struct(
        "ListGroupsRequest",
        f("states_filter", array("string"), "4+"),
        f("types_filter", array("string"), "5+"),
    ),
)

LIST_GROUPS_RESPONSE = MessageSpec(
    "ListGroupsResponse", 16, "response", versions("0-5"), versions("3+"),
    struct(
        "ListGroupsResponse",
        f("throttle_time_ms", "int32", "1+"),
        f("error_code", "int16", "0+"),
        f("groups", array(struct(
            "ListedGroup",
            f("group_id", "string", "0+"),
            f("protocol_type", "string", "0+"),
            f("group_state", "string", "4+"),
            f("group_type", "string", "5+"),
        )), "0+"),
    ),
)

DESCRIBE_GROUPS_REQUEST = MessageSpec(
    "DescribeGroupsRequest", 15, "request", versions("0-5"), versions("5+"),
    struct(
        "DescribeGroupsRequest",
        f("groups", array("string"), "0+"),
        f("include_authorized_operations", "bool", "3+"),
    ),
)

DESCRIBE_GROUPS_RESPONSE = MessageSpec(
    "DescribeGroupsResponse", 15, "response", versions("0-5"), versions("5+"),
    struct(
        "DescribeGroupsResponse",
        f("throttle_time_ms", "int32", "1+"),
        f("groups", array(struct(
            "DescribedGroup",
            f("error_code", "int16", "0+"),
            f("group_id", "string", "0+"),
            f("group_state", "string", "0+"),
            f("protocol_type", "string", "0+"),
            f("protocol_data", "string", "0+"),
            f("members", array(struct(
                "DescribedGroupMember",
                f("member_id", "string", "0+"),
                f("group_instance_id", "string", "4+", nullable="4+"),
                f("client_id", "string", "0+"),
                f("client_host", "string", "0+"),
                f("member_metadata", "bytes", "0+"),
                f("member_assignment", "bytes", "0+"),
            )), "0+"),
            f("authorized_operations", "int32", "3+", default=-(2**31)),
        )), "0+"),
    ),
)

DELETE_GROUPS_REQUEST = MessageSpec(
    "DeleteGroupsRequest", 42, "request", versions("0-2"), versions("2+"),
    struct(
        "DeleteGroupsRequest",
        f("groups_names", array("string"), "0+"),
    ),
)

DELETE_GROUPS_RESPONSE = MessageSpec(
    "DeleteGroupsResponse", 42, "response", versions("0-2"), versions("2+"),
    struct(
        "DeleteGroupsResponse",
        f("throttle_time_ms", "int32", "0+"),
        f("results", array(struct(
            "DeletableGroupResult",
            f("group_id", "string", "0+"),
            f("error_code", "int16", "0+"),
        )), "0+"),
    ),
)

OFFSET_DELETE_REQUEST = MessageSpec(
    "OffsetDeleteRequest", 47, "request", versions("0"), versions("none"),
    struct(
        "OffsetDeleteRequest",
        f("group_id", "string", "0+"),
        f("topics", array(struct(
            "OffsetDeleteRequestTopic",
            f("name", "string", "0+"),
            f("partitions", array(struct(
                "OffsetDeleteRequestPartition",
                f("partition_index", "int32", "0+"),
            )), "0+"),
        )), "0+"),
    ),
)

OFFSET_DELETE_RESPONSE = MessageSpec(
    "OffsetDeleteResponse", 47, "response", versions("0"), versions("none"),
    struct(
        "OffsetDeleteResponse",
        f("error_code", "int16", "0+"),
        f("throttle_time_ms", "int32", "0+"),
        f("topics", array(struct(
            "OffsetDeleteResponseTopic",
            f("name", "string", "0+"),
            f("partitions", array(struct(
                "OffsetDeleteResponsePartition",
                f("partition_index", "int32", "0+"),
                f("error_code", "int16", "0+"),
            )), "0+"),
        )), "0+"),
    ),
)

INIT_PRODUCER_ID_REQUEST = MessageSpec(
    "InitProducerIdRequest", 22, "request", versions("0-5"), versions("2+"),
    struct(
        "InitProducerIdRequest",
        f("transactional_id", "string", "0+", nullable="0+"),
        f("transaction_timeout_ms", "int32", "0+"),
        f("producer_id", "int64", "3+", default=-1),
        f("producer_epoch", "int16", "3+", default=-1),
    ),
)

ADD_PARTITIONS_TO_TXN_REQUEST = MessageSpec(
    "AddPartitionsToTxnRequest", 24, "request", versions("0-3"), versions("3+"),
    struct(
        "AddPartitionsToTxnRequest",
        f("transactional_id", "string", "0+"),
        f("producer_id", "int64", "0+"),
        f("producer_epoch", "int16", "0+"),
        f("topics", array(struct(
            "AddPartitionsToTxnTopic",
            f("name", "string", "0+"),
            f("partitions", array("int32"), "0+"),
        )), "0+"),
    ),
)

ADD_PARTITIONS_TO_TXN_RESPONSE = MessageSpec(
    "AddPartitionsToTxnResponse", 24, "response", versions("0-3"), versions("3+"),
    struct(
        "AddPartitionsToTxnResponse",
        f("throttle_time_ms", "int32", "0+"),
        f("results", array(struct(
            "AddPartitionsToTxnTopicResult",
            f("name", "string", "0+"),
            f("results_by_partition", array(struct(
                "AddPartitionsToTxnPartitionResult",
                f("partition_index", "int32", "0+"),
                f("partition_error_code", "int16", "0+"),
            )), "0+"),
        )), "0+"),
    ),
)

ADD_OFFSETS_TO_TXN_REQUEST = MessageSpec(
    "AddOffsetsToTxnRequest", 25, "request", versions("0-3"), versions("3+"),
    struct(
        "AddOffsetsToTxnRequest",
        f("transactional_id", "string", "0+"),
        f("producer_id", "int64", "0+"),
        f("producer_epoch", "int16", "0+"),
        f("group_id", "string", "0+"),
    ),
)

END_TXN_REQUEST = MessageSpec(
    "EndTxnRequest", 26, "request", versions("0-3"), versions("3+"),
    struct(
        "EndTxnRequest",
        f("transactional_id", "string", "0+"),
        f("producer_id", "int64", "0+"),
        f("producer_epoch", "int16", "0+"),
        f("committed", "bool", "0+"),
    ),
)

TXN_OFFSET_COMMIT_REQUEST = MessageSpec(
    "TxnOffsetCommitRequest", 28, "request", versions("0-3"), versions("3+"),
    struct(
        "TxnOffsetCommitRequest",
        f("transactional_id", "string", "0+"),
        f("group_id", "string", "0+"),
        f("producer_id", "int64", "0+"),
        f("producer_epoch", "int16", "0+"),
        f("generation_id", "int32", "3+", default=-1),
        f("member_id", "string", "3+"),
        f("group_instance_id", "string", "3+", nullable="3+"),
        f("topics", array(struct(
            "TxnOffsetCommitRequestTopic",
            f("name", "string", "0+"),
            f("partitions", array(struct(
                "TxnOffsetCommitRequestPartition",
                f("partition_index", "int32", "0+"),
                f("committed_offset", "int64", "0+"),
                f("committed_leader_epoch", "int32", "2+", default=-1),
                f("committed_metadata", "string", "0+", nullable="0+"),
            )), "0+"),
        )), "0+"),
    ),
)

TXN_OFFSET_COMMIT_RESPONSE = MessageSpec(
    "TxnOffsetCommitResponse", 28, "response", versions("0-3"), versions("3+"),
    struct(
        "TxnOffsetCommitResponse",
        f("throttle_time_ms", "int32", "0+"),
        f("topics", array(struct(
            "TxnOffsetCommitResponseTopic",
            f("name", "string", "0+"),
            f("partitions", array(struct(
                "TxnOffsetCommitResponsePartition",
                f("partition_index", "int32", "0+"),
                f("error_code", "int16", "0+"),
            )), "0+"),
        )), "0+"),
    ),
)
