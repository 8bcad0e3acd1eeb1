"""The ACL filter without sockets: each API's decision and its error shape."""

from __future__ import annotations

from typing import Any

import pytest

from kproxy.codecs import api_keys
from kproxy.codecs.headers import RequestHeader, read_response_header, write_request_header
from kproxy.codecs.interpreter import decode_from, encode_into
from kproxy.codecs.messages import decode_response, encode_response_parts
from kproxy.codecs.peek import peek_request
from kproxy.codecs.primitives import Reader, Writer
from kproxy.codecs.schemas import txn_responses as tx
from kproxy.config.filters import acl_filter
from kproxy.policies.addressing import PortMap
from kproxy.policies.auth.acl import parse_acls
from kproxy.policies.connection import Answer, Close, ConnectionState, Forward
from kproxy.policies.filters.acl import AclFilter, principal_of
from kproxy.policies.filters.acl_admin import ENTRY_APIS
from kproxy.policies.filters.acl_apis import APIS
from kproxy.policies.filters.chain import DecisionCounts, FilterChain
from kproxy.policies.handlers import builtin_filters
from kproxy.policies.proxy_state import ProxyState

from ..produce_frames import produce_body

RULES = [
    {"principal": "User:alice", "operations": ["write", "read"], "resource": "topic",
     "pattern": "orders*", "permission": "allow"},
    {"principal": "alice", "operations": ["read"], "resource": "group", "pattern": "app-*",
     "permission": "allow"},
    {"principal": "User:alice", "operations": ["write"], "resource": "transactional_id",
     "pattern": "tx-*", "permission": "allow"},
    {"principal": "User:alice", "operations": ["create", "delete"], "resource": "topic",
     "pattern": "new-*", "permission": "allow"},
    {"principal": "*", "operations": ["all"], "resource": "topic", "pattern": "orders-secret",
     "permission": "deny"},
]


def _setup(principal: str | None = "alice") -> tuple[AclFilter, ConnectionState,
                                                      list[dict[str, Any]]]:
    flt = acl_filter({"acls": RULES}, "")
    assert flt is not None
    denials: list[dict[str, Any]] = []
    flt.on_deny = denials.append
    chain = FilterChain(builtin_filters(), [flt], DecisionCounts())
    state = ProxyState(PortMap("proxy.local", 30000, 30000, 0, 1023))
    conn = ConnectionState(state, chain.handlers, "bootstrap", None, ("10.0.0.9", 1))
    conn.principal = principal
    return flt, conn, denials


def _api(key: int) -> Any:
    """The schemas of an API the filter checks, whole or per entry."""
    return APIS.get(key) or ENTRY_APIS[key]


def _frame(key: int, version: int, body: dict[str, Any], corr: int = 7) -> bytes:
    w = Writer()
    write_request_header(w, RequestHeader(key, version, corr, "t"))
    encode_into(_api(key).request, version, body, w)
    return w.getvalue()


def _call(flt: AclFilter, conn: ConnectionState, frame: bytes) -> Any:
    view = memoryview(frame)
    return flt.on_request(conn, peek_request(view), view)


def _resp(key: int, version: int, frame: bytes) -> dict[str, Any]:
    r = Reader(frame)
    read_response_header(r, key, version)
    return decode_from(_api(key).response, version, r)


def test_principal_format() -> None:
    _, conn, _ = _setup(None)
    assert principal_of(conn) == "User:ANONYMOUS"
    conn.principal = "bob"
    assert principal_of(conn) == "User:bob"


def test_produce_denied_partitions_get_29_and_the_rest_is_forwarded() -> None:
    flt, conn, denials = _setup()
    frame = produce_body(9, 5, [("orders", [(0, b"x")]), ("payments", [(0, b"y"), (1, b"z")])])
    decision = _call(flt, conn, frame)
    assert isinstance(decision, Forward) and decision.then is not None
    assert b"payments" not in decision.body
    broker = encode_response_parts(api_keys.PRODUCE, 9, 5, {"responses": [
        {"name": "orders", "partition_responses": [{"index": 0, "error_code": 0,
                                                    "base_offset": 10}]}]})
    merged = decode_response(decision.then(memoryview(broker), 9), api_keys.PRODUCE, 9).body
    codes = {(t["name"], p["index"]): p["error_code"] for t in merged["responses"]
             for p in t["partition_responses"]}
    assert codes == {("orders", 0): 0, ("payments", 0): 29, ("payments", 1): 29}
    assert denials[0] | {} == {"event": "acl_denied", "principal": "User:alice",
                               "api": "Produce", "resource": "topic", "name": "payments",
                               "operation": "WRITE"}


def test_produce_all_denied_is_answered_and_acks0_closes() -> None:
    flt, conn, _ = _setup("bob")
    decision = _call(flt, conn, produce_body(9, 5, [("orders", [(0, b"x")])]))
    assert isinstance(decision, Answer)
    body = decode_response(decision.body, api_keys.PRODUCE, 9).body
    assert body["responses"][0]["partition_responses"][0]["error_code"] == 29
    assert isinstance(_call(flt, conn, produce_body(9, 5, [("orders", [(0, b"x")])], acks=0)),
                      Close)


def test_deny_wins_over_allow() -> None:
    flt, conn, _ = _setup()
    decision = _call(flt, conn, produce_body(9, 5, [("orders-secret", [(0, b"x")])]))
    assert isinstance(decision, Answer)


def _metadata_response(version: int, names: list[str]) -> bytes:
    return encode_response_parts(api_keys.METADATA, version, 7, {
        "brokers": [], "topics": [{"name": n, "error_code": 0, "partitions": [
            {"partition_index": 0, "leader_id": 1}]} for n in names]})


def test_metadata_lists_only_describable_topics() -> None:
    flt, conn, _ = _setup()
    decision = _call(flt, conn, _frame(3, 12, {"topics": None}))
    assert isinstance(decision, Forward) and decision.then is not None
    out = decision.then(memoryview(_metadata_response(12, ["orders", "payments", "x"])), 12)
    body = decode_response(out, api_keys.METADATA, 12).body
    assert [t["name"] for t in body["topics"]] == ["orders"]


def test_metadata_named_undescribable_topic_gets_29_and_no_auto_create() -> None:
    flt, conn, denials = _setup()
    decision = _call(flt, conn, _frame(3, 12, {"topics": [{"name": "payments"},
                                                          {"name": "orders"}],
                                               "allow_auto_topic_creation": True}))
    assert isinstance(decision, Forward) and decision.then is not None
    sent = decode_from(APIS[3].request, 12, _after_header(decision.body))
    assert sent["allow_auto_topic_creation"] is False
    out = decision.then(memoryview(_metadata_response(12, ["payments", "orders"])), 12)
    topics = decode_response(out, api_keys.METADATA, 12).body["topics"]
    assert [(t["name"], t["error_code"], len(t["partitions"])) for t in topics] == [
        ("payments", 29, 0), ("orders", 0, 1)]
    assert denials and denials[0]["operation"] == "DESCRIBE"


def _after_header(frame: bytes) -> Reader:
    from kproxy.codecs.headers import read_request_header
    r = Reader(frame)
    read_request_header(r)
    return r


FETCH: dict[str, Any] = {"max_wait_ms": 100, "min_bytes": 1, "topics": [
    {"topic": "orders", "partitions": [{"partition": 0, "fetch_offset": 0}]},
    {"topic": "payments", "partitions": [{"partition": 0, "fetch_offset": 0},
                                         {"partition": 1, "fetch_offset": 0}]}]}


@pytest.mark.parametrize("version", [4, 7, 11, 12])
def test_fetch_with_a_denied_topic_forwards_the_allowed_partitions(version: int) -> None:
    flt, conn, _ = _setup()
    decision = _call(flt, conn, _frame(1, version, FETCH))
    assert isinstance(decision, Forward) and decision.then is not None
    assert b"payments" not in decision.body  # per partition: tests/unit/test_acl_partitions
    allowed = {**FETCH, "topics": FETCH["topics"][:1]}
    assert _call(flt, conn, _frame(1, version, allowed)) is None
    denied = {**FETCH, "topics": FETCH["topics"][1:]}
    body = _resp(1, version, _call(flt, conn, _frame(1, version, denied)).body)
    assert [(t["topic"], [p["error_code"] for p in t["partitions"]])
            for t in body["responses"]] == [("payments", [29, 29])]


GROUP_CASES = [
    (11, 5, {"group_id": "other", "session_timeout_ms": 6000, "member_id": "",
             "protocol_type": "consumer", "protocols": []}),
    (14, 3, {"group_id": "other", "generation_id": 1, "member_id": "m"}),
    (12, 4, {"group_id": "other", "generation_id": 1, "member_id": "m"}),
    (13, 4, {"group_id": "other", "members": []}),
]


@pytest.mark.parametrize(("key", "version", "body"), GROUP_CASES)
def test_group_apis_get_30(key: int, version: int, body: dict[str, Any]) -> None:
    flt, conn, _ = _setup()
    decision = _call(flt, conn, _frame(key, version, body))
    assert isinstance(decision, Answer)
    assert _resp(key, version, decision.body)["error_code"] == 30
    assert _call(flt, conn, _frame(key, version, {**body, "group_id": "app-1"})) is None


def test_offset_commit_and_fetch() -> None:
    flt, conn, _ = _setup()
    commit = {"group_id": "app-1", "topics": [{"name": "payments", "partitions": [
        {"partition_index": 0, "committed_offset": 1}]}]}
    decision = _call(flt, conn, _frame(8, 8, commit))
    assert isinstance(decision, Answer)
    assert _resp(8, 8, decision.body)["topics"][0]["partitions"][0]["error_code"] == 29
    decision = _call(flt, conn, _frame(8, 8, {**commit, "group_id": "x"}))
    assert _resp(8, 8, decision.body)["topics"][0]["partitions"][0]["error_code"] == 30
    decision = _call(flt, conn, _frame(9, 7, {"group_id": "x", "topics": None}))
    assert _resp(9, 7, decision.body)["error_code"] == 30
    decision = _call(flt, conn, _frame(9, 8, {"groups": [{"group_id": "x", "topics": None}]}))
    assert _resp(9, 8, decision.body)["groups"][0]["error_code"] == 30


def test_find_coordinator_group_and_transactional_id() -> None:
    flt, conn, _ = _setup()
    decision = _call(flt, conn, _frame(10, 2, {"key": "x", "key_type": 0}))
    assert _resp(10, 2, decision.body)["error_code"] == 30
    decision = _call(flt, conn, _frame(10, 2, {"key": "x", "key_type": 1}))
    assert _resp(10, 2, decision.body)["error_code"] == 53
    assert _call(flt, conn, _frame(10, 2, {"key": "app-1", "key_type": 0})) is None
    decision = _call(flt, conn, _frame(10, 4, {"key_type": 0,
                                               "coordinator_keys": ["app-1", "x"]}))
    assert isinstance(decision, Forward) and decision.then is not None
    broker = encode_response_parts(10, 4, 7, {"coordinators": [
        {"key": "app-1", "node_id": 1, "host": "h", "port": 1, "error_code": 0}]})
    out = _resp(10, 4, decision.then(memoryview(broker), 4))
    assert [(c["key"], c["error_code"]) for c in out["coordinators"]] == [
        ("app-1", 0), ("x", 30)]


def test_create_and_delete_topics_per_topic() -> None:
    flt, conn, _ = _setup()
    create = {"topics": [{"name": "new-a", "num_partitions": 1, "replication_factor": 1},
                         {"name": "zzz", "num_partitions": 1, "replication_factor": 1}]}
    decision = _call(flt, conn, _frame(19, 5, create))
    assert isinstance(decision, Forward) and decision.then is not None
    assert b"zzz" not in decision.body
    broker = _encoded(19, 5, {"topics": [{"name": "new-a", "error_code": 0}]})
    out = _resp(19, 5, decision.then(memoryview(broker), 5))
    assert [(t["name"], t["error_code"]) for t in out["topics"]] == [("new-a", 0),
                                                                     ("zzz", 29)]
    decision = _call(flt, conn, _frame(20, 4, {"topic_names": ["zzz"]}))
    assert isinstance(decision, Answer)
    assert [(t["name"], t["error_code"]) for t in _resp(20, 4, decision.body)["responses"]] \
        == [("zzz", 29)]
    assert _call(flt, conn, _frame(20, 4, {"topic_names": ["new-b"]})) is None


def _encoded(key: int, version: int, body: dict[str, Any]) -> bytes:
    from kproxy.codecs.headers import ResponseHeader, write_response_header
    w = Writer()
    write_response_header(w, ResponseHeader(7), key, version)
    encode_into(_api(key).response, version, body, w)
    return w.getvalue()


TXN_CASES = [
    (22, 3, {"transactional_id": "other", "transaction_timeout_ms": 1000}, "error_code"),
    (25, 2, {"transactional_id": "other", "producer_id": 1, "producer_epoch": 0,
             "group_id": "app-1"}, "error_code"),
    (26, 2, {"transactional_id": "other", "producer_id": 1, "producer_epoch": 0,
             "committed": True}, "error_code"),
]


@pytest.mark.parametrize(("key", "version", "body", "field"), TXN_CASES)
def test_transactional_apis_get_53(key: int, version: int, body: dict[str, Any],
                                   field: str) -> None:
    flt, conn, _ = _setup()
    decision = _call(flt, conn, _frame(key, version, body))
    assert isinstance(decision, Answer)
    assert _resp(key, version, decision.body)[field] == 53
    assert _call(flt, conn, _frame(key, version, {**body, "transactional_id": "tx-1"})) is None


def test_add_partitions_and_txn_offset_commit() -> None:
    flt, conn, _ = _setup()
    add = {"transactional_id": "tx-1", "producer_id": 1, "producer_epoch": 0,
           "topics": [{"name": "payments", "partitions": [0, 1]},
                      {"name": "orders", "partitions": [0]}]}
    decision = _call(flt, conn, _frame(24, 2, add))
    out = _resp(24, 2, decision.body)
    assert [[p["partition_error_code"] for p in t["results_by_partition"]]
            for t in out["results"]] == [[29, 29], [55]]  # OPERATION_NOT_ATTEMPTED
    commit = {"transactional_id": "nope", "group_id": "app-1", "producer_id": 1,
              "producer_epoch": 0, "topics": [{"name": "orders", "partitions": [
                  {"partition_index": 0, "committed_offset": 1}]}]}
    out = _resp(28, 3, _call(flt, conn, _frame(28, 3, commit)).body)
    assert out["topics"][0]["partitions"][0]["error_code"] == 53


def test_idempotent_producer_needs_write_on_some_topic() -> None:
    flt, conn, _ = _setup()
    assert _call(flt, conn, _frame(22, 3, {"transactional_id": None,
                                           "transaction_timeout_ms": 1})) is None
    flt, conn, _ = _setup("bob")
    decision = _call(flt, conn, _frame(22, 3, {"transactional_id": None,
                                               "transaction_timeout_ms": 1}))
    assert _resp(22, 3, decision.body)["error_code"] == 31


def test_unlisted_apis_close_and_are_hidden_from_api_versions() -> None:
    flt, conn, _ = _setup()
    w = Writer()
    write_request_header(w, RequestHeader(29, 1, 1, "t"))  # DescribeAcls: the broker's ACLs
    assert isinstance(_call(flt, conn, w.getvalue()), Close)
    resp = encode_response_parts(api_keys.API_VERSIONS, 3, 1, {"error_code": 0, "api_keys": [
        {"api_key": 0, "min_version": 0, "max_version": 13},
        {"api_key": 1, "min_version": 0, "max_version": 17},
        {"api_key": 29, "min_version": 0, "max_version": 3},
        {"api_key": 18, "min_version": 0, "max_version": 4}]})
    out = flt.on_response(conn, api_keys.API_VERSIONS, 3, memoryview(resp))
    assert out is not None
    keys = decode_response(out, api_keys.API_VERSIONS, 3).body["api_keys"]
    assert [(k["api_key"], k["max_version"]) for k in keys] == [(0, 12), (1, 12), (18, 4)]


def test_bad_rule_names_its_key() -> None:
    from kproxy.config.options import ConfigError
    with pytest.raises(ConfigError, match=r"acls\[0\]\.permission"):
        acl_filter({"acls": [{**RULES[0], "permission": "maybe"}]}, "")
    assert parse_acls([]).active is False


def test_denials_are_rate_bounded() -> None:
    from kproxy.auth.audit import DenialReporter
    now = [0.0]
    lines: list[dict[str, Any]] = []
    count = [0]
    rep = DenialReporter(lines.append, lambda: count.__setitem__(0, count[0] + 1),
                         rate=1.0, burst=3.0, clock=lambda: now[0])
    for _ in range(10):
        rep({"event": "acl_denied"})
    assert count[0] == 10 and len(lines) == 3
    now[0] = 2.0
    rep({"event": "acl_denied"})
    assert lines[-1]["suppressed"] == 7


@pytest.mark.parametrize("spec", [tx.INIT_PRODUCER_ID_RESPONSE, tx.ADD_OFFSETS_TO_TXN_RESPONSE,
                                  tx.END_TXN_RESPONSE], ids=lambda s: s.name)
def test_answer_only_schemas_round_trip(spec: Any) -> None:
    from kproxy.codecs import interpreter
    for version in range(spec.valid.lo, spec.valid.hi + 1):
        msg = {"throttle_time_ms": 5, "error_code": 53}
        if spec is tx.INIT_PRODUCER_ID_RESPONSE:
            msg |= {"producer_id": -1, "producer_epoch": -1}
        wire = interpreter.encode(spec, version, msg)
        assert interpreter.decode(spec, version, wire) == msg
