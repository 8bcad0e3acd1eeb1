"""Names of every Kafka API key and the first version of each that is flexible.

The flexible threshold decides the request header version (v2 when flexible,
else v1) and the response header version (v1 when flexible, else v0), which the
proxy needs for every frame it decodes. Keys newer than this table are flexible
from v0, as every API added since KIP-482 is.
"""

from __future__ import annotations

from enum import IntEnum

# api key -> (name, first flexible version or None when never flexible)
API_KEYS: dict[int, tuple[str, int | None]] = {
    0: ("Produce", 9),
    1: ("Fetch", 12),
    2: ("ListOffsets", 6),
    3: ("Metadata", 9),
    4: ("LeaderAndIsr", 4),
    5: ("StopReplica", 2),
    6: ("UpdateMetadata", 6),
    7: ("ControlledShutdown", 3),
    8: ("OffsetCommit", 8),
    9: ("OffsetFetch", 6),
    10: ("FindCoordinator", 3),
    11: ("JoinGroup", 6),
    12: ("Heartbeat", 4),
    13: ("LeaveGroup", 4),
    14: ("SyncGroup", 4),
    15: ("DescribeGroups", 5),
    16: ("ListGroups", 3),
    17: ("SaslHandshake", None),
    18: ("ApiVersions", 3),
    19: ("CreateTopics", 5),
    20: ("DeleteTopics", 4),
    21: ("DeleteRecords", 2),
    22: ("InitProducerId", 2),
    23: ("OffsetForLeaderEpoch", 4),
    24: ("AddPartitionsToTxn", 3),
    25: ("AddOffsetsToTxn", 3),
    26: ("EndTxn", 3),
    27: ("WriteTxnMarkers", 1),
    28: ("TxnOffsetCommit", 3),
    29: ("DescribeAcls", 2),
    30: ("CreateAcls", 2),
    31: ("DeleteAcls", 2),
    32: ("DescribeConfigs", 4),
    33: ("AlterConfigs", 2),
    34: ("AlterReplicaLogDirs", 2),
    35: ("DescribeLogDirs", 2),
    36: ("SaslAuthenticate", 2),
    37: ("CreatePartitions", 2),
    38: ("CreateDelegationToken", 2),
    39: ("RenewDelegationToken", 2),
    40: ("ExpireDelegationToken", 2),
    41: ("DescribeDelegationToken", 2),
    42: ("DeleteGroups", 2),
    43: ("ElectLeaders", 2),
    44: ("IncrementalAlterConfigs", 1),
    45: ("AlterPartitionReassignments", 0),
    46: ("ListPartitionReassignments", 0),
    47: ("OffsetDelete", None),
    48: ("DescribeClientQuotas", 1),
    49: ("AlterClientQuotas", 1),
    50: ("DescribeUserScramCredentials", 0),
    51: ("AlterUserScramCredentials", 0),
    52: ("Vote", 0),
    53: ("BeginQuorumEpoch", 1),
    54: ("EndQuorumEpoch", 1),
    55: ("DescribeQuorum", 0),
    56: ("AlterPartition", 0),
    57: ("UpdateFeatures", 0),
    58: ("Envelope", 0),
    59: ("FetchSnapshot", 0),
    60: ("DescribeCluster", 0),
    61: ("DescribeProducers", 0),
    62: ("BrokerRegistration", 0),
    63: ("BrokerHeartbeat", 0),
    64: ("UnregisterBroker", 0),
    65: ("DescribeTransactions", 0),
    66: ("ListTransactions", 0),
    67: ("AllocateProducerIds", 0),
    68: ("ConsumerGroupHeartbeat", 0),
    69: ("ConsumerGroupDescribe", 0),
    70: ("ControllerRegistration", 0),
    71: ("GetTelemetrySubscriptions", 0),
    72: ("PushTelemetry", 0),
    73: ("AssignReplicasToDirs", 0),
    74: ("ListConfigResources", 0),
    75: ("DescribeTopicPartitions", 0),
    76: ("ShareGroupHeartbeat", 0),
    77: ("ShareGroupDescribe", 0),
    78: ("ShareFetch", 0),
    79: ("ShareAcknowledge", 0),
    80: ("AddRaftVoter", 0),
    81: ("RemoveRaftVoter", 0),
    82: ("UpdateRaftVoter", 0),
    83: ("InitializeShareGroupState", 0),
    84: ("ReadShareGroupState", 0),
    85: ("WriteShareGroupState", 0),
    86: ("DeleteShareGroupState", 0),
    87: ("ReadShareGroupStateSummary", 0),
    88: ("StreamsGroupHeartbeat", 0),
    89: ("StreamsGroupDescribe", 0),
    90: ("DescribeShareGroupOffsets", 0),
    91: ("AlterShareGroupOffsets", 0),
    92: ("DeleteShareGroupOffsets", 0),
}



class ApiKey(IntEnum):
    """The API keys kproxy acts on by name (an IntEnum: compares and encodes as the int)."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    SASL_AUTHENTICATE = 36
    DESCRIBE_CLUSTER = 60
    CONSUMER_GROUP_HEARTBEAT = 68
    GET_TELEMETRY_SUBSCRIPTIONS = 71
    PUSH_TELEMETRY = 72
    SHARE_GROUP_HEARTBEAT = 76
    SHARE_FETCH = 78
    SHARE_ACKNOWLEDGE = 79
    STREAMS_GROUP_HEARTBEAT = 88
    STREAMS_GROUP_DESCRIBE = 89


PRODUCE = ApiKey.PRODUCE
FETCH = ApiKey.FETCH
LIST_OFFSETS = ApiKey.LIST_OFFSETS
METADATA = ApiKey.METADATA
OFFSET_COMMIT = ApiKey.OFFSET_COMMIT
OFFSET_FETCH = ApiKey.OFFSET_FETCH
FIND_COORDINATOR = ApiKey.FIND_COORDINATOR
JOIN_GROUP = ApiKey.JOIN_GROUP
HEARTBEAT = ApiKey.HEARTBEAT
LEAVE_GROUP = ApiKey.LEAVE_GROUP
SYNC_GROUP = ApiKey.SYNC_GROUP
SASL_HANDSHAKE = ApiKey.SASL_HANDSHAKE
API_VERSIONS = ApiKey.API_VERSIONS
SASL_AUTHENTICATE = ApiKey.SASL_AUTHENTICATE
DESCRIBE_CLUSTER = ApiKey.DESCRIBE_CLUSTER
CONSUMER_GROUP_HEARTBEAT = ApiKey.CONSUMER_GROUP_HEARTBEAT
GET_TELEMETRY_SUBSCRIPTIONS = ApiKey.GET_TELEMETRY_SUBSCRIPTIONS
PUSH_TELEMETRY = ApiKey.PUSH_TELEMETRY
SHARE_GROUP_HEARTBEAT = ApiKey.SHARE_GROUP_HEARTBEAT
SHARE_FETCH = ApiKey.SHARE_FETCH
SHARE_ACKNOWLEDGE = ApiKey.SHARE_ACKNOWLEDGE
STREAMS_GROUP_HEARTBEAT = ApiKey.STREAMS_GROUP_HEARTBEAT
STREAMS_GROUP_DESCRIBE = ApiKey.STREAMS_GROUP_DESCRIBE

# The first Metadata version with a top-level ErrorCode (how REBOOTSTRAP_REQUIRED reaches
# a client, KIP-1102).
METADATA_TOP_LEVEL_ERROR_SINCE = 13


def api_name(api_key: int) -> str:
    entry = API_KEYS.get(api_key)
    return entry[0] if entry else f"Unknown{api_key}"


def is_flexible(api_key: int, api_version: int) -> bool:
    entry = API_KEYS.get(api_key)
    first = entry[1] if entry else 0
    return first is not None and api_version >= first


def request_header_version(api_key: int, api_version: int) -> int:
    if api_key == 7 and api_version == 0:  # ControlledShutdown v0 predates client_id
        return 0
    return 2 if is_flexible(api_key, api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    # ApiVersions answers with header v0 at every version, so that a client that
    # sent a version the broker does not know can still read the error.
    if api_key == API_VERSIONS:
        return 0
    return 1 if is_flexible(api_key, api_version) else 0
