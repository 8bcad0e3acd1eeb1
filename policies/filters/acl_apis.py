"""What each API needs under ACLs, and its answer when that is denied.

Kafka's mapping of API to operation and resource (facts from Kafka's broker): Produce
WRITE topic (and WRITE transactional_id); Fetch READ topic (a follower's CLUSTER_ACTION
cluster); ListOffsets, OffsetForLeaderEpoch and Metadata DESCRIBE topic; JoinGroup,
SyncGroup, Heartbeat, LeaveGroup and OffsetCommit READ group (OffsetCommit READ topic
too); OffsetFetch DESCRIBE group and topic; FindCoordinator DESCRIBE of the group or
transactional id; CreateTopics CREATE cluster or topic; DeleteTopics DELETE topic;
InitProducerId WRITE transactional_id (without one IDEMPOTENT_WRITE cluster, or WRITE on
some topic); AddPartitionsToTxn WRITE transactional_id and topic; AddOffsetsToTxn WRITE
transactional_id and READ group; EndTxn WRITE transactional_id; TxnOffsetCommit WRITE
transactional_id, READ group and topic.

``Need`` is one check; ``whole`` answers a request refused as a whole, in the API's own
shape and error. Produce and Metadata are handled by the filter itself
(``policies.filters.acl``); CreateTopics, DeleteTopics, batched FindCoordinator and the
admin APIs are refused entry by entry (``policies.filters.acl_admin``); the data APIs
with a ``layout`` per partition (``policies.filters.acl_partitions``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kproxy.codecs import api_keys
from kproxy.codecs.registry import DECODED
from kproxy.codecs.schema import MessageSpec, Versions
from kproxy.codecs.schemas import tenancy_groups as tg
from kproxy.codecs.schemas import tenancy_topics as tt
from kproxy.codecs.schemas import txn_responses as tx
from kproxy.policies.api_versions import NAMELESS
from kproxy.policies.filters.acl_partitions import GROUP_DENIED, TOPIC_DENIED, Layout

CLUSTER_DENIED = 31
TXN_DENIED = 53
CLUSTER = "kafka-cluster"
ERROR_OF = {"topic": TOPIC_DENIED, "group": GROUP_DENIED, "cluster": CLUSTER_DENIED,
            "transactional_id": TXN_DENIED}

Msg = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Need:
    operation: str
    resource: str
    name: str

    @property
    def error(self) -> int:
        return ERROR_OF[self.resource]


Needs = Callable[[Msg, int], list[Need]]
# request, version, error, the denied topics -> response body
Whole = Callable[[Msg, int, int, frozenset[str]], Msg]
NONE: frozenset[str] = frozenset()
NOT_ATTEMPTED = 55  # OPERATION_NOT_ATTEMPTED


@dataclass(frozen=True)
class AclApi:
    api_key: int
    versions: Versions
    request: MessageSpec
    response: MessageSpec
    needs: Needs
    whole: Whole | None = None  # None: Produce and Metadata, the filter's own
    layout: Layout | None = None  # topics refused per partition (``acl_partitions``)


def _spec(key: int) -> tuple[MessageSpec, MessageSpec]:
    api = DECODED[key]
    assert api.request is not None
    return api.request, api.response


def topics(op: str, field: str = "topics", name: str = "name") -> Callable[[Msg], list[Need]]:
    return lambda m: [Need(op, "topic", t[name]) for t in m.get(field) or []
                      if t.get(name) is not None]


def _fetch_needs(m: Msg, v: int) -> list[Need]:
    if m.get("replica_id", -1) >= 0:
        return [Need("cluster_action", "cluster", CLUSTER)]
    return topics("read", "topics", "topic")(m)


def _whole(layout: Layout, fixed: int | None = None) -> Whole:
    """Every partition refused, with the check's error (or Kafka's ``fixed`` one)."""
    def whole(m: Msg, v: int, err: int, bad: frozenset[str] = NONE) -> Msg:
        return layout.whole(m, fixed or err)
    return whole


def _commit_needs(m: Msg, v: int) -> list[Need]:
    return [Need("read", "group", m["group_id"]), *topics("read")(m)]


def _offset_fetch_needs(m: Msg, v: int) -> list[Need]:
    if v >= 8:
        groups = m.get("groups") or []
        return [*(Need("describe", "group", g["group_id"]) for g in groups),
                *(n for g in groups for n in topics("describe")(g))]
    return [Need("describe", "group", m["group_id"]), *topics("describe")(m)]


def _offset_fetch_whole(m: Msg, v: int, err: int, bad: frozenset[str] = NONE) -> Msg:
    """v0-7 (a refused group at v8+ is answered per group): the error at the top level
    (v2+) and in every partition named."""
    return {**OFFSET_FETCH.whole(m, err), "error_code": err}


# Where the data APIs keep topics and partitions, and a refused partition's entry
# (Kafka's: FetchResponse.partitionResponse, ListOffsets' UNKNOWN offset and timestamp,
# OffsetFetch's UNAUTHORIZED_PARTITION). Fetch's records are empty, not null:
# librdkafka fails a whole response on a null partition record set.
FETCH = Layout("read", name="topic", index="partition", out_topics="responses",
               entry={"high_watermark": -1, "last_stable_offset": -1,
                      "log_start_offset": -1, "aborted_transactions": None,
                      "preferred_read_replica": -1, "records": b""},
               forgotten="forgotten_topics_data", session="session_id")
LIST_OFFSETS = Layout("describe", entry={"timestamp": -1, "offset": -1, "leader_epoch": -1})
EPOCHS = Layout("describe", name="topic", index="partition", out_index="partition",
                entry={"leader_epoch": -1, "end_offset": -1})
COMMIT = Layout("read")
OFFSET_FETCH = Layout("describe", partitions="partition_indexes", index=None,
                      entry={"committed_offset": -1, "committed_leader_epoch": -1,
                             "metadata": ""}, groups_from=8)


def _group(op: str) -> Needs:
    return lambda m, v: [Need(op, "group", m["group_id"])]


def _error_only(m: Msg, v: int, err: int, bad: frozenset[str] = NONE) -> Msg:
    return {"error_code": err}


def _join_whole(m: Msg, v: int, err: int, bad: frozenset[str] = NONE) -> Msg:
    return {"error_code": err, "generation_id": -1, "protocol_name": None if v >= 7 else "",
            "member_id": m.get("member_id", "")}


def _coordinator_needs(m: Msg, v: int) -> list[Need]:
    kind = "transactional_id" if m.get("key_type", 0) == 1 else "group"
    keys = m.get("coordinator_keys") or [] if v >= 4 else [m.get("key", "")]
    return [Need("describe", kind, k) for k in keys]


def _coordinator_whole(m: Msg, v: int, err: int, bad: frozenset[str] = NONE) -> Msg:
    if v >= 4:
        return {"coordinators": [{"key": k, "node_id": -1, "host": "", "port": -1,
                                  "error_code": err, "error_message": None}
                                 for k in m.get("coordinator_keys") or []]}
    return {"error_code": err, "error_message": None, "node_id": -1, "host": "", "port": -1}


def _init_pid_needs(m: Msg, v: int) -> list[Need]:
    txn = m.get("transactional_id")
    if txn:
        return [Need("write", "transactional_id", txn)]
    return [Need("idempotent_write", "cluster", CLUSTER)]


def _init_pid_whole(m: Msg, v: int, err: int, bad: frozenset[str] = NONE) -> Msg:
    return {"error_code": err, "producer_id": -1, "producer_epoch": -1}


def _add_parts_needs(m: Msg, v: int) -> list[Need]:
    return [Need("write", "transactional_id", m["transactional_id"]), *topics("write")(m)]


def _add_parts_whole(m: Msg, v: int, err: int, bad: frozenset[str] = NONE) -> Msg:
    """Kafka's shape: denied topics' partitions get 29, the others were not attempted."""
    def code(name: str) -> int:
        return err if err != TOPIC_DENIED or name in bad else NOT_ATTEMPTED

    return {"results": [
        {"name": t["name"], "results_by_partition": [
            {"partition_index": i, "partition_error_code": code(t["name"])}
            for i in t.get("partitions") or []]} for t in m.get("topics") or []]}


def _add_offsets_needs(m: Msg, v: int) -> list[Need]:
    return [Need("write", "transactional_id", m["transactional_id"]),
            Need("read", "group", m["group_id"])]


def _end_txn_needs(m: Msg, v: int) -> list[Need]:
    return [Need("write", "transactional_id", m["transactional_id"])]


def _txn_commit_needs(m: Msg, v: int) -> list[Need]:
    return [Need("write", "transactional_id", m["transactional_id"]),
            Need("read", "group", m["group_id"]), *topics("read")(m)]


def _metadata_needs(m: Msg, v: int) -> list[Need]:
    return []  # decided on the response (and auto-creation on the request)


def _apis() -> dict[int, AclApi]:
    md_req, md_resp = _spec(api_keys.METADATA)
    join_req, join_resp = _spec(api_keys.JOIN_GROUP)
    sync_req, sync_resp = _spec(api_keys.SYNC_GROUP)
    hb_req, hb_resp = _spec(api_keys.HEARTBEAT)
    leave_req, leave_resp = _spec(api_keys.LEAVE_GROUP)
    commit_req, commit_resp = _spec(api_keys.OFFSET_COMMIT)
    ofetch_req, ofetch_resp = _spec(api_keys.OFFSET_FETCH)
    coord_req, coord_resp = _spec(api_keys.FIND_COORDINATOR)
    produce_resp = DECODED[api_keys.PRODUCE].response
    fetch_resp = DECODED[api_keys.FETCH].response
    return {api.api_key: api for api in (
        AclApi(api_keys.PRODUCE, Versions(0, 12), tt.PRODUCE_REQUEST, produce_resp,
               lambda m, v: []),
        AclApi(api_keys.FETCH, Versions(4, 12), tt.FETCH_REQUEST, fetch_resp, _fetch_needs,
               _whole(FETCH, TOPIC_DENIED), FETCH),  # Kafka: 29 for a follower too
        AclApi(api_keys.LIST_OFFSETS, Versions(0, 9), tt.LIST_OFFSETS_REQUEST,
               tt.LIST_OFFSETS_RESPONSE, lambda m, v: topics("describe")(m),
               _whole(LIST_OFFSETS), LIST_OFFSETS),
        AclApi(23, Versions(0, 4), tt.OFFSET_FOR_LEADER_EPOCH_REQUEST,
               tt.OFFSET_FOR_LEADER_EPOCH_RESPONSE,
               lambda m, v: topics("describe", "topics", "topic")(m), _whole(EPOCHS),
               EPOCHS),
        AclApi(api_keys.METADATA, Versions(0, 13), md_req, md_resp, _metadata_needs),
        AclApi(api_keys.OFFSET_COMMIT, Versions(0, 9), commit_req, commit_resp,
               _commit_needs, _whole(COMMIT), COMMIT),
        AclApi(api_keys.OFFSET_FETCH, Versions(0, 9), ofetch_req, ofetch_resp,
               _offset_fetch_needs, _offset_fetch_whole, OFFSET_FETCH),
        AclApi(api_keys.FIND_COORDINATOR, Versions(0, 6), coord_req, coord_resp,
               _coordinator_needs, _coordinator_whole),
        AclApi(api_keys.JOIN_GROUP, Versions(0, 9), join_req, join_resp, _group("read"),
               _join_whole),
        AclApi(api_keys.SYNC_GROUP, Versions(0, 5), sync_req, sync_resp, _group("read"),
               _error_only),
        AclApi(api_keys.HEARTBEAT, Versions(0, 4), hb_req, hb_resp, _group("read"),
               _error_only),
        AclApi(api_keys.LEAVE_GROUP, Versions(0, 5), leave_req, leave_resp, _group("read"),
               _error_only),
        AclApi(22, Versions(0, 5), tg.INIT_PRODUCER_ID_REQUEST, tx.INIT_PRODUCER_ID_RESPONSE,
               _init_pid_needs, _init_pid_whole),
        AclApi(24, Versions(0, 3), tg.ADD_PARTITIONS_TO_TXN_REQUEST,
               tg.ADD_PARTITIONS_TO_TXN_RESPONSE, _add_parts_needs, _add_parts_whole),
        AclApi(25, Versions(0, 3), tg.ADD_OFFSETS_TO_TXN_REQUEST,
               tx.ADD_OFFSETS_TO_TXN_RESPONSE, _add_offsets_needs, _error_only),
        AclApi(26, Versions(0, 3), tg.END_TXN_REQUEST, tx.END_TXN_RESPONSE, _end_txn_needs,
               _error_only),
        AclApi(28, Versions(0, 3), tg.TXN_OFFSET_COMMIT_REQUEST,
               tg.TXN_OFFSET_COMMIT_RESPONSE, _txn_commit_needs, _whole(COMMIT), COMMIT),
    )}


APIS: dict[int, AclApi] = _apis()

# APIs that need no authorization (Kafka checks none): the handshake, SASL, the
# telemetry the proxy answers, and DescribeCluster (it lists the brokers, as Metadata).
FREE = NAMELESS


def offered(api_key: int) -> Versions | None:
    """The versions a client is offered of an API while ACLs are set; None: hidden."""
    api = APIS.get(api_key)
    return api.versions if api is not None else FREE.get(api_key)
