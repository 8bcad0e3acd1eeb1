"""Topic-carrying requests and responses a virtual cluster rewrites (``policies.tenancy``).

Produce and Fetch requests, ListOffsets, OffsetForLeaderEpoch, CreateTopics,
DeleteTopics, DeleteRecords, CreatePartitions and DescribeConfigs: each at the versions
that name topics by name. Versions that name them by id (Produce v13, Fetch v13+,
DeleteTopics v6) are left out on purpose: a virtual cluster caps them away.
The protocol facts are Kafka's message definitions; the code is ours.
"""

from kproxy.codecs.schema import MessageSpec, array, f, struct, versions

PRODUCE_REQUEST = MessageSpec(
    "ProduceRequest", 0, "request", versions("3-12"), versions("9+"),
    struct(
        "ProduceRequest",
        f("transactional_id", "string", "3+", nullable="3+"),
        f("acks", "int16", "0+"),
        f("timeout_ms", "int32", "0+"),
        f("topic_data", array(struct(
            "TopicProduceData",
            f("name", "string", "0+"),
            f("partition_data", array(struct(
                "PartitionProduceData",
                f("index", "int32", "0+"),
                f("records", "records", "0+", nullable="0+"),
            )), "0+"),
        )), "0+"),
    ),
)

FETCH_REQUEST = MessageSpec(
    "FetchRequest", 1, "request", versions("4-12"), versions("12+"),
    struct(
        "FetchRequest",
        f("cluster_id", "string", "12+", nullable="12+", tag=0),
        f("replica_id", "int32", "0+", default=-1),
        f("max_wait_ms", "int32", "0+"),
        f("min_bytes", "int32", "0+"),
        f("max_bytes", "int32", "3+", default=0x7FFFFFFF),
        f("isolation_level", "int8", "4+"),
        f("session_id", "int32", "7+"),
        f("session_epoch", "int32", "7+", default=-1),
        f("topics", array(struct(
            "FetchTopic",
            f("topic", "string", "0+"),
            f("partitions", array(struct(
                "FetchPartition",
                f("partition", "int32", "0+"),
                f("current_leader_epoch", "int32", "9+", default=-1),
                f("fetch_offset", "int64", "0+"),
                f("last_fetched_epoch", "int32", "12+", default=-1),
                f("log_start_offset", "int64", "5+", default=-1),
                f("partition_max_bytes", "int32", "0+"),
            )), "0+"),
        )), "0+"),
        f("forgotten_topics_data", array(struct(
            "ForgottenTopic",
            f("topic", "string", "7+"),
            f("partitions", array("int32"), "7+"),
        )), "7+"),
        f("rack_id", "string", "11+"),
    ),
)

LIST_OFFSETS_REQUEST = MessageSpec(
    "ListOffsetsRequest", 2, "request", versions("0-9"), versions("6+"),
    struct(
        "ListOffsetsRequest",
        f("replica_id", "int32", "0+"),
        f("isolation_level", "int8", "2+"),
        f("topics", array(struct(
            "ListOffsetsTopic",
            f("name", "string", "0+"),
            f("partitions", array(struct(
                "ListOffsetsPartition",
                f("partition_index", "int32", "0+"),
                f("current_leader_epoch", "int32", "4+", default=-1),
                f("timestamp", "int64", "0+"),
                f("max_num_offsets", "int32", "0", default=1),
            )), "0+"),
        )), "0+"),
    ),
)

LIST_OFFSETS_RESPONSE = MessageSpec(
    "ListOffsetsResponse", 2, "response", versions("0-9"), versions("6+"),
    struct(
        "ListOffsetsResponse",
        f("throttle_time_ms", "int32", "2+"),
        f("topics", array(struct(
            "ListOffsetsTopicResponse",
            f("name", "string", "0+"),
            f("partitions", array(struct(
                "ListOffsetsPartitionResponse",
                f("partition_index", "int32", "0+"),
                f("error_code", "int16", "0+"),
                f("old_style_offsets", array("int64"), "0"),
                f("timestamp", "int64", "1+", default=-1),
                f("offset", "int64", "1+", default=-1),
                f("leader_epoch", "int32", "4+", default=-1),
            )), "0+"),
        )), "0+"),
    ),
)

OFFSET_FOR_LEADER_EPOCH_REQUEST = MessageSpec(
    "OffsetForLeaderEpochRequest", 23, "request", versions("0-4"), versions("4+"),
    struct(
        "OffsetForLeaderEpochRequest",
        f("replica_id", "int32", "3+", default=-2),
        f("topics", array(struct(
            "OffsetForLeaderTopic",
            f("topic", "string", "0+"),
            f("partitions", array(struct(
                "OffsetForLeaderPartition",
                f("partition", "int32", "0+"),
                f("current_leader_epoch", "int32", "2+", default=-1),
                f("leader_epoch", "int32", "0+"),
            )), "0+"),
        )), "0+"),
    ),
)

OFFSET_FOR_LEADER_EPOCH_RESPONSE = MessageSpec(
    "OffsetForLeaderEpochResponse", 23, "response", versions("0-4"), versions("4+"),
    struct(
        "OffsetForLeaderEpochResponse",
        f("throttle_time_ms", "int32", "2+"),
        f("topics", array(struct(
            "OffsetForLeaderTopicResult",
            f("topic", "string", "0+"),
            f("partitions", array(struct(
                "EpochEndOffset",
                f("error_code", "int16", "0+"),
                f("partition", "int32", "0+"),
                f("leader_epoch", "int32", "1+", default=-1),
                f("end_offset", "int64", "0+", default=-1),
            )), "0+"),
        )), "0+"),
    ),
)

CREATE_TOPICS_REQUEST = MessageSpec(
    "CreateTopicsRequest", 19, "request", versions("0-7"), versions("5+"),
    struct(
        "CreateTopicsRequest",
        f("topics", array(struct(
            "CreatableTopic",
            f("name", "string", "0+"),
            f("num_partitions", "int32", "0+"),
            f("replication_factor", "int16", "0+"),
            f("assignments", array(struct(
                "CreatableReplicaAssignment",
                f("partition_index", "int32", "0+"),
                f("broker_ids", array("int32"), "0+"),
            )), "0+"),
            f("configs", array(struct(
                "CreatableTopicConfig",
                f("name", "string", "0+"),
                f("value", "string", "0+", nullable="0+"),
            )), "0+"),
        )), "0+"),
        f("timeout_ms", "int32", "0+", default=60000),
        f("validate_only", "bool", "1+"),
    ),
)

CREATE_TOPICS_RESPONSE = MessageSpec(
    "CreateTopicsResponse", 19, "response", versions("0-7"), versions("5+"),
    struct(
        "CreateTopicsResponse",
        f("throttle_time_ms", "int32", "2+"),
        f("topics", array(struct(
            "CreatableTopicResult",
            f("name", "string", "0+"),
            f("topic_id", "uuid", "7+"),
            f("error_code", "int16", "0+"),
            f("error_message", "string", "1+", nullable="0+"),
            f("topic_config_error_code", "int16", "5+", tag=0),
            f("num_partitions", "int32", "5+", default=-1),
            f("replication_factor", "int16", "5+", default=-1),
            f("configs", array(struct(
                "CreatableTopicConfigs",
                f("name", "string", "5+"),
                f("value", "string", "5+", nullable="5+"),
                f("read_only", "bool", "5+"),
                f("config_source", "int8", "5+", default=-1),
                f("is_sensitive", "bool", "5+"),
            )), "5+", nullable="5+"),
        )), "0+"),
    ),
)

DELETE_TOPICS_REQUEST = MessageSpec(
    "DeleteTopicsRequest", 20, "request", versions("0-5"), versions("4+"),
    struct(
        "DeleteTopicsRequest",
        f("topic_names", array("string"), "0+"),
        f("timeout_ms", "int32", "0+"),
    ),
)

DELETE_TOPICS_RESPONSE = MessageSpec(
    "DeleteTopicsResponse", 20, "response", versions("0-5"), versions("4+"),
    struct(
        "DeleteTopicsResponse",
        f("throttle_time_ms", "int32", "1+"),
        f("responses", array(struct(
            "DeletableTopicResult",
            f("name", "string", "0+"),
            f("error_code", "int16", "0+"),
            f("error_message", "string", "5+", nullable="5+"),
        )), "0+"),
    ),
)

DELETE_RECORDS_REQUEST = MessageSpec(
    "DeleteRecordsRequest", 21, "request", versions("0-2"), versions("2+"),
    struct(
        "DeleteRecordsRequest",
        f("topics", array(struct(
            "DeleteRecordsTopic",
            f("name", "string", "0+"),
            f("partitions", array(struct(
                "DeleteRecordsPartition",
                f("partition_index", "int32", "0+"),
                f("offset", "int64", "0+"),
            )), "0+"),
        )), "0+"),
        f("timeout_ms", "int32", "0+"),
    ),
)

DELETE_RECORDS_RESPONSE = MessageSpec(
    "DeleteRecordsResponse", 21, "response", versions("0-2"), versions("2+"),
    struct(
        "DeleteRecordsResponse",
        f("throttle_time_ms", "int32", "0+"),
        f("topics", array(struct(
            "DeleteRecordsTopicResult",
            f("name", "string", "0+"),
            f("partitions", array(struct(
                "DeleteRecordsPartitionResult",
                f("partition_index", "int32", "0+"),
                f("low_watermark", "int64", "0+"),
                f("error_code", "int16", "0+"),
            )), "0+"),
        )), "0+"),
    ),
)

CREATE_PARTITIONS_REQUEST = MessageSpec(
    "CreatePartitionsRequest", 37, "request", versions("0-3"), versions("2+"),
    struct(
        "CreatePartitionsRequest",
        f("topics", array(struct(
            "CreatePartitionsTopic",
            f("name", "string", "0+"),
            f("count", "int32", "0+"),
            f("assignments", array(struct(
                "CreatePartitionsAssignment",
                f("broker_ids", array("int32"), "0+"),
            )), "0+", nullable="0+"),
        )), "0+"),
        f("timeout_ms", "int32", "0+"),
        f("validate_only", "bool", "0+"),
    ),
)

CREATE_PARTITIONS_RESPONSE = MessageSpec(
    "CreatePartitionsResponse", 37, "response", versions("0-3"), versions("2+"),
    struct(
        "CreatePartitionsResponse",
        f("throttle_time_ms", "int32", "0+"),
        f("results", array(struct(
            "CreatePartitionsTopicResult",
            f("name", "string", "0+"),
            f("error_code", "int16", "0+"),
            f("error_message", "string", "0+", nullable="0+"),
        )), "0+"),
    ),
)

DESCRIBE_CONFIGS_REQUEST = MessageSpec(
    "DescribeConfigsRequest", 32, "request", versions("0-4"), versions("4+"),
    struct(
        "DescribeConfigsRequest",
        f("resources", array(struct(
            "DescribeConfigsResource",
            f("resource_type", "int8", "0+"),
            f("resource_name", "string", "0+"),
            f("configuration_keys", array("string"), "0+", nullable="0+"),
        )), "0+"),
        f("include_synonyms", "bool", "1+"),
        f("include_documentation", "bool", "3+"),
    ),
)

DESCRIBE_CONFIGS_RESPONSE = MessageSpec(
    "DescribeConfigsResponse", 32, "response", versions("0-4"), versions("4+"),
    struct(
        "DescribeConfigsResponse",
        f("throttle_time_ms", "int32", "0+"),
        f("results", array(struct(
            "DescribeConfigsResult",
            f("error_code", "int16", "0+"),
            f("error_message", "string", "0+", nullable="0+"),
            f("resource_type", "int8", "0+"),
            f("resource_name", "string", "0+"),
            f("configs", array(struct(
                "DescribeConfigsResourceResult",
                f("name", "string", "0+"),
                f("value", "string", "0+", nullable="0+"),
                f("read_only", "bool", "0+"),
                f("is_default", "bool", "0"),
                f("config_source", "int8", "1+", default=-1),
                f("is_sensitive", "bool", "0+"),
                f("synonyms", array(struct(
                    "DescribeConfigsSynonym",
                    f("name", "string", "1+"),
                    f("value", "string", "1+", nullable="1+"),
                    f("source", "int8", "1+"),
                )), "1+"),
                f("config_type", "int8", "3+"),
                f("documentation", "string", "3+", nullable="0+"),
            )), "0+"),
        )), "0+"),
    ),
)
