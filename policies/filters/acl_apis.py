"""What each API needs under ACLs, and its answer when that is denied.

Kafka's mapping of API to operation and resource (facts from Kafka's broker): Produce
WRITE topic (and WRITE transactional_id); Fetch READ topic (a follower's CLUSTER_ACTION
cluster); ListOffsets, OffsetForLeaderEpoch and Metadata DESCRIBE topic; JoinGroup,
SyncGroup, Heartbeat, LeaveGroup and OffsetCommit READ group (OffsetCommit READ topic
too); OffsetFetch DESCRIBE group; FindCoordinator DESCRIBE of the group or
transactional id; CreateTopics CREATE cluster or topic; DeleteTopics DELETE topic;
InitProducerId WRITE transactional_id (without one IDEMPOTENT_WRITE cluster, or WRITE on
some topic); AddPartitionsToTxn WRITE transactional_id and topic; AddOffsetsToTxn WRITE
transactional_id and READ group; EndTxn WRITE transactional_id; TxnOffsetCommit WRITE
transactional_id, READ group and topic.

``Need`` is one check; ``whole`` answers a request refused as a whole, in the API's own
shape and error. Produce and Metadata are handled by the filter itself
(``policies.filters.acl``); CreateTopics, DeleteTopics, batched FindCoordinator and the
admin APIs are refused entry by entry (``policies.filters.acl_admin``).
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

TOPIC_DENIED = 29
GROUP_DENIED = 30
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


def _spec(key: int) -> tuple[MessageSpec, MessageSpec]:
    api = DECODED[key]
    assert api.request is not None
    return api.request, api.response


def topics(op: str, field: str = "topics", name: str = "name") -> Callable[[Msg], list[Need]]:
    return lambda m: [Need(op, "topic", t[name]) for t in m.get(field) or []
                      if t.get(name) is not None]


def _parts(m: Msg, field: str, name: str, parts: str, index: str, out_index: str,
           error: int, extra: Msg | None = None) -> list[Msg]:
    """Mirror a request's topics and partitions as error entries."""
    out = []
    for t in m.get(field) or []:
        entries = []
        for p in t.get(parts) or []:
            idx = p if isinstance(p, int) else p[index]
            entries.append({out_index: idx, "error_code": error, **(extra or {})})
        out.append({"t": t[name], "p": entries})
    return out


def _fetch_needs(m: Msg, v: int) -> list[Need]:
    if m.get("replica_id", -1) >= 0:
        return [Need("cluster_action", "cluster", CLUSTER)]
    return topics("read", "topics", "topic")(m)


def _fetch_whole(m: Msg, v: int, err: int, bad: frozenset[str] = NONE) -> Msg:
    return {"error_code": 0, "session_id": 0, "responses": [
        {"topic": e["t"], "partitions": e["p"]} for e in
        _parts(m, "topics", "topic", "partitions", "partition", "partition_index", err,
               {"high_watermark": -1, "records": None})]}


def _list_offsets_whole(m: Msg, v: int, err: int, bad: frozenset[str] = NONE) -> Msg:
    return {"topics": [{"name": e["t"], "partitions": e["p"]} for e in
                       _parts(m, "topics", "name", "partitions", "partition_index",
                              "partition_index", err)]}


def _epoch_whole(m: Msg, v: int, err: int, bad: frozenset[str] = NONE) -> Msg:
    return {"topics": [{"topic": e["t"], "partitions": e["p"]} for e in
                       _parts(m, "topics", "topic", "partitions", "partition",
                              "partition", err)]}


def _commit_needs(m: Msg, v: int) -> list[Need]:
    return [Need("read", "group", m["group_id"]), *topics("read")(m)]


def _commit_whole(m: Msg, v: int, err: int, bad: frozenset[str] = NONE) -> Msg:
    return {"topics": [{"name": e["t"], "partitions": e["p"]} for e in
                       _parts(m, "topics", "name", "partitions", "partition_index",
                              "partition_index", err)]}


def _offset_fetch_needs(m: Msg, v: int) -> list[Need]:
    if v >= 8:
        return [Need("describe", "group", g["group_id"]) for g in m.get("groups") or []]
    return [Need("describe", "group", m["group_id"])]


def _offset_fetch_whole(m: Msg, v: int, err: int, bad: frozenset[str] = NONE) -> Msg:
    if v >= 8:
        return {"groups": [{"group_id": g["group_id"], "topics": [], "error_code": err}
                           for g in m.get("groups") or []]}
    topics_ = [{"name": t["name"], "partitions": [
        {"partition_index": i, "committed_offset": -1, "committed_metadata": "",
         "error_code": err} for i in t.get("partition_indexes") or []]}
        for t in m.get("topics") or []]
    return {"topics": topics_, "error_code": err}


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
               _fetch_whole),
        AclApi(api_keys.LIST_OFFSETS, Versions(0, 9), tt.LIST_OFFSETS_REQUEST,
               tt.LIST_OFFSETS_RESPONSE, lambda m, v: topics("describe")(m),
               _list_offsets_whole),
        AclApi(23, Versions(0, 4), tt.OFFSET_FOR_LEADER_EPOCH_REQUEST,
               tt.OFFSET_FOR_LEADER_EPOCH_RESPONSE,
               lambda m, v: topics("describe", "topics", "topic")(m), _epoch_whole),
        AclApi(api_keys.METADATA, Versions(0, 13), md_req, md_resp, _metadata_needs),
        AclApi(api_keys.OFFSET_COMMIT, Versions(0, 9), commit_req, commit_resp,
               _commit_needs, _commit_whole),
        AclApi(api_keys.OFFSET_FETCH, Versions(0, 9), ofetch_req, ofetch_resp,
               _offset_fetch_needs, _offset_fetch_whole),
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
               tg.TXN_OFFSET_COMMIT_RESPONSE, _txn_commit_needs, _commit_whole),
    )}


APIS: dict[int, AclApi] = _apis()

# APIs that need no authorization (Kafka checks none): the handshake, SASL, the
# telemetry the proxy answers, and DescribeCluster (it lists the brokers, as Metadata).
FREE = NAMELESS


def offered(api_key: int) -> Versions | None:
    """The versions a client is offered of an API while ACLs are set; None: hidden."""
    api = APIS.get(api_key)
    return api.versions if api is not None else FREE.get(api_key)
