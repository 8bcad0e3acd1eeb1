"""The ACL filter's per-entry APIs (``policies.filters.acl_admin``) without sockets.

For every API checked entry by entry and every version it is offered at: a request
mixing allowed and denied resources is forwarded with exactly the allowed entries, and
the response the client gets holds every requested entry once, the broker's result for
the allowed ones and Kafka's error for the denied ones; a request denied entirely is
answered by the proxy. ListGroups keeps only describable groups. The ACL filter in
front of a virtual cluster checks the tenant's own names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kproxy.codecs import api_keys, interpreter
from kproxy.codecs.headers import (
    RequestHeader,
    ResponseHeader,
    read_request_header,
    read_response_header,
    write_request_header,
    write_response_header,
)
from kproxy.codecs.interpreter import decode_from, encode_into
from kproxy.codecs.messages import decode_response, encode_response_parts
from kproxy.codecs.peek import peek_request
from kproxy.codecs.primitives import Reader, Writer
from kproxy.codecs.schema import MessageSpec
from kproxy.codecs.schemas import alter_configs as ac
from kproxy.codecs.schemas import tenancy_groups as tg
from kproxy.config.filters import acl_filter
from kproxy.policies.addressing import PortMap
from kproxy.policies.connection import Answer, Close, ConnectionState, Forward
from kproxy.policies.filters.acl import AclFilter
from kproxy.policies.filters.acl_admin import ENTRY_APIS, LISTINGS
from kproxy.policies.filters.chain import DecisionCounts, FilterChain
from kproxy.policies.handlers import builtin_filters
from kproxy.policies.proxy_state import ProxyState
from kproxy.policies.tenancy.virtual_cluster import VirtualClusterFilter

from ..schema_strategies import message_strategy
from .test_virtual_clusters import _kio_class, _sane

RULES = [
    {"principal": "User:alice", "operations": ["read", "delete", "alter", "create"],
     "resource": "topic", "pattern": "orders*", "permission": "allow"},
    {"principal": "User:alice", "operations": ["describe", "delete"], "resource": "group",
     "pattern": "app-*", "permission": "allow"},
    {"principal": "User:alice", "operations": ["alter_configs"], "resource": "topic",
     "pattern": "orders*", "permission": "allow"},
    {"principal": "User:alice", "operations": ["alter_configs"], "resource": "group",
     "pattern": "app-*", "permission": "allow"},
    {"principal": "User:alice", "operations": ["describe"], "resource": "transactional_id",
     "pattern": "tx-*", "permission": "allow"},
    {"principal": "User:ops", "operations": ["describe", "alter_configs"],
     "resource": "cluster", "pattern": "kafka-cluster", "permission": "allow"},
]
Msg = dict[str, Any]
Row = tuple[Any, ...]


def _setup(principal: str, *before: Any) -> tuple[FilterChain, ConnectionState,
                                                  list[Msg]]:
    flt = acl_filter({"acls": RULES}, "")
    assert isinstance(flt, AclFilter)
    denials: list[Msg] = []
    flt.on_deny = denials.append
    chain = FilterChain(builtin_filters(), [flt, *before], DecisionCounts())
    state = ProxyState(PortMap("proxy.local", 30000, 30000, 0, 1023))
    conn = ConnectionState(state, chain.handlers, "bootstrap", None, ("10.0.0.9", 1))
    conn.principal = principal
    return chain, conn, denials


def _request(spec: MessageSpec, version: int, body: Msg) -> bytes:
    w = Writer()
    write_request_header(w, RequestHeader(spec.api_key, version, 7, "t"))
    encode_into(spec, version, body, w)
    return w.getvalue()


def _response(spec: MessageSpec, version: int, body: Msg) -> bytes:
    w = Writer()
    write_response_header(w, ResponseHeader(7), spec.api_key, version)
    encode_into(spec, version, body, w)
    return w.getvalue()


def _sent(spec: MessageSpec, version: int, frame: bytes) -> Msg:
    r = Reader(frame)
    read_request_header(r)
    return decode_from(spec, version, r)


def _got(spec: MessageSpec, version: int, frame: bytes) -> Msg:
    r = Reader(frame)
    read_response_header(r, spec.api_key, version)
    msg = decode_from(spec, version, r)
    r.expect_end(spec.name)
    return msg


def _decide(chain: FilterChain, conn: ConnectionState, frame: bytes) -> Any:
    view = memoryview(frame)
    peek = peek_request(view)
    return conn.request(peek, view)  # as a session does: follow-ups recorded


@dataclass(frozen=True)
class Case:
    """One API: a request of mixed entries, the denied ones' errors (by ``ident``),
    the broker's result for an entry it got, and the rows a response holds."""

    key: int
    body: Callable[[list[Any]], Msg]
    entries: list[Any]
    denied: dict[Any, int]
    ident: Callable[[Any], Any]
    broker: Callable[[Any], Msg]
    rows: Callable[[Msg], list[Row]]  # (ident[, partition], error) per result
    parts: Callable[[Any], list[int]] = lambda e: [-1]  # partitions per entry, -1: none


def _topic(name: str, *parts: int, **extra: Any) -> Msg:
    return {"name": name, "partitions": [{"partition_index": p, **extra} for p in parts]}


def _partition_rows(field: str) -> Callable[[Msg], list[Row]]:
    return lambda m: [(t["name"], p["partition_index"], p["error_code"])
                      for t in m[field] for p in t["partitions"]]


def _resource_rows(field: str) -> Callable[[Msg], list[Row]]:
    return lambda m: [((r["resource_type"], r["resource_name"]), -1, r["error_code"])
                      for r in m[field]]


def _resource(kind: int, name: str, configs: list[Msg] | None = None) -> Msg:
    return {"resource_type": kind, "resource_name": name, "configs": configs or []}


RESOURCES = [(2, "orders"), (2, "payments"), (4, "1"), (8, "1"), (32, "app-1"), (32, "x"),
             (16, "metrics")]
RESOURCE_DENIED = {(2, "payments"): 29, (4, "1"): 31, (8, "1"): 31, (32, "x"): 30,
                   (16, "metrics"): 31}
DENIED_GROUP = {"x": 30, "y": 30}


def _configs_case(key: int, out: str, config: Msg) -> Case:
    return Case(key, lambda es: {"resources": es},
                [_resource(k, n, [config]) for k, n in RESOURCES], RESOURCE_DENIED,
                lambda e: (e["resource_type"], e["resource_name"]),
                lambda e: {"resource_type": e["resource_type"],
                           "resource_name": e["resource_name"], "error_code": 0},
                _resource_rows(out))


CASES = {
    "DescribeGroups": Case(
        15, lambda es: {"groups": es}, ["app-1", "x", "app-2", "y"], DENIED_GROUP,
        lambda e: e, lambda e: {"group_id": e, "group_state": "Stable",
                                "protocol_type": "consumer", "members": []},
        lambda m: [(g["group_id"], -1, g["error_code"]) for g in m["groups"]]),
    "DeleteGroups": Case(
        42, lambda es: {"groups_names": es}, ["app-1", "x", "y", "app-2"], DENIED_GROUP,
        lambda e: e, lambda e: {"group_id": e, "error_code": 0},
        lambda m: [(g["group_id"], -1, g["error_code"]) for g in m["results"]]),
    "OffsetDelete": Case(
        47, lambda es: {"group_id": "app-1", "topics": es},
        [_topic("orders", 0, 1), _topic("payments", 0, 2), _topic("orders-b", 3)],
        {"payments": 29}, lambda e: e["name"],
        lambda e: _topic(e["name"], *[p["partition_index"] for p in e["partitions"]],
                         error_code=0),
        _partition_rows("topics"), lambda e: [p["partition_index"] for p in e["partitions"]]),
    "DeleteRecords": Case(
        21, lambda es: {"topics": es, "timeout_ms": 1000},
        [_topic("payments", 0, offset=5), _topic("orders", 0, 1, offset=5),
         _topic("other", 4, offset=1)],
        {"payments": 29, "other": 29}, lambda e: e["name"],
        lambda e: {"name": e["name"], "partitions": [
            {"partition_index": p["partition_index"], "low_watermark": 5, "error_code": 0}
            for p in e["partitions"]]},
        _partition_rows("topics"), lambda e: [p["partition_index"] for p in e["partitions"]]),
    "CreatePartitions": Case(
        37, lambda es: {"topics": es, "timeout_ms": 1000},
        [{"name": "orders", "count": 3, "assignments": None},
         {"name": "payments", "count": 3, "assignments": None}],
        {"payments": 29}, lambda e: e["name"],
        lambda e: {"name": e["name"], "error_code": 0, "error_message": None},
        lambda m: [(r["name"], -1, r["error_code"]) for r in m["results"]]),
    "CreateTopics": Case(
        19, lambda es: {"topics": es},
        [{"name": "orders-new", "num_partitions": 1, "replication_factor": 1},
         {"name": "zzz", "num_partitions": 1, "replication_factor": 1}],
        {"zzz": 29}, lambda e: e["name"], lambda e: {"name": e["name"], "error_code": 0},
        lambda m: [(t["name"], -1, t["error_code"]) for t in m["topics"]]),
    "DeleteTopics": Case(
        20, lambda es: {"topic_names": es, "timeout_ms": 1000}, ["orders", "zzz"],
        {"zzz": 29}, lambda e: e, lambda e: {"name": e, "error_code": 0},
        lambda m: [(t["name"], -1, t["error_code"]) for t in m["responses"]]),
    "FindCoordinator": Case(
        10, lambda es: {"key_type": 1, "coordinator_keys": es}, ["tx-1", "other", "tx-2"],
        {"other": 53}, lambda e: e, lambda e: {"key": e, "node_id": 111, "host": "h",
                                               "port": 9092, "error_code": 0},
        lambda m: [(c["key"], -1, c["error_code"]) for c in m["coordinators"]]),
    "DescribeConfigs": _configs_case(32, "results", {}),
    "AlterConfigs": _configs_case(33, "responses", {"name": "retention.ms", "value": "1"}),
    "IncrementalAlterConfigs": _configs_case(
        44, "responses", {"name": "retention.ms", "config_operation": 0, "value": "1"}),
}
VERSIONED = [(name, v) for name, case in CASES.items()
             for v in range(ENTRY_APIS[case.key].versions.lo,
                            ENTRY_APIS[case.key].versions.hi + 1)]


def _expected(case: Case, entries: list[Any]) -> list[Row]:
    return sorted((case.ident(e), p, case.denied.get(case.ident(e), 0))
                  for e in entries for p in case.parts(e))


@pytest.mark.parametrize(("name", "version"), VERSIONED, ids=[f"{n}-v{v}" for n, v in VERSIONED])
def test_mixed_request_forwards_the_allowed_and_merges_the_denied(name: str,
                                                                  version: int) -> None:
    case = CASES[name]
    api = ENTRY_APIS[case.key]
    chain, conn, denials = _setup("alice")
    decision = _decide(chain, conn, _request(api.request, version, case.body(case.entries)))
    assert isinstance(decision, Forward) and decision.then is not None
    forwarded = _sent(api.request, version, decision.body)[api.field]
    allowed = [e for e in case.entries if case.ident(e) not in case.denied]
    assert [case.ident(e) for e in forwarded] == [case.ident(e) for e in allowed]
    broker = _response(api.response, version, {api.out_field: [case.broker(e)
                                                                for e in forwarded]})
    merged = _got(api.response, version, decision.then(memoryview(broker), version))
    assert sorted(case.rows(merged)) == _expected(case, case.entries)
    assert denials and {d["api"] for d in denials} == {api_keys.api_name(case.key)}


@pytest.mark.parametrize(("name", "version"), VERSIONED, ids=[f"{n}-v{v}" for n, v in VERSIONED])
def test_all_denied_is_answered_by_the_proxy(name: str, version: int) -> None:
    case = CASES[name]
    api = ENTRY_APIS[case.key]
    chain, conn, _ = _setup("alice")
    refused = [e for e in case.entries if case.ident(e) in case.denied]
    decision = _decide(chain, conn, _request(api.request, version, case.body(refused)))
    assert isinstance(decision, Answer)
    got = _got(api.response, version, decision.body)
    assert sorted(case.rows(got)) == _expected(case, refused)
    allowed = [e for e in case.entries if case.ident(e) not in case.denied]
    assert _decide(chain, conn, _request(api.request, version, case.body(allowed))) is None


def test_offset_delete_needs_delete_on_the_group_first() -> None:
    api = ENTRY_APIS[47]
    chain, conn, denials = _setup("alice")
    body = {"group_id": "x", "topics": [_topic("orders", 0)]}
    decision = _decide(chain, conn, _request(api.request, 0, body))
    assert isinstance(decision, Answer)
    assert _got(api.response, 0, decision.body) == {
        "error_code": 30, "throttle_time_ms": 0, "topics": []}
    assert denials[0]["resource"] == "group" and denials[0]["operation"] == "DELETE"


def test_cluster_configs_pass_with_the_cluster_right() -> None:
    api = ENTRY_APIS[33]
    chain, conn, _ = _setup("ops")
    body = {"resources": [_resource(4, "1"), _resource(8, "1")]}
    assert _decide(chain, conn, _request(api.request, 1, body)) is None
    # ALTER_CONFIGS implies DESCRIBE_CONFIGS (Kafka's implication)
    assert _decide(chain, conn, _request(ENTRY_APIS[32].request, 4, body)) is None


LIST = LISTINGS[16]
GROUPS = ["app-1", "x", "app-2", "__other"]


@pytest.mark.parametrize("version", range(LIST.versions.lo, LIST.versions.hi + 1))
def test_list_groups_keeps_only_describable_groups(version: int) -> None:
    chain, conn, denials = _setup("alice")
    decision = _decide(chain, conn, _request(tg.LIST_GROUPS_REQUEST, version, {}))
    assert isinstance(decision, Forward) and decision.then is not None
    broker = _response(LIST.response, version, {"groups": [
        {"group_id": g, "protocol_type": "consumer"} for g in GROUPS]})
    got = _got(LIST.response, version, decision.then(memoryview(broker), version))
    assert [g["group_id"] for g in got["groups"]] == ["app-1", "app-2"]
    assert denials == []  # not audited, as Kafka logs none of these checks
    chain, conn, _ = _setup("ops")  # DESCRIBE on the cluster: every group
    assert _decide(chain, conn, _request(tg.LIST_GROUPS_REQUEST, version, {})) is None


def test_api_versions_offers_the_checked_admin_apis_and_hides_acl_and_quota_apis() -> None:
    chain, conn, _ = _setup("alice")
    broker = {15: 6, 16: 5, 21: 2, 29: 3, 30: 3, 31: 3, 32: 4, 33: 2, 37: 3, 42: 2, 44: 1,
              47: 0, 48: 1, 49: 1, 50: 0, 51: 0, 65: 0, 66: 1}
    resp = encode_response_parts(api_keys.API_VERSIONS, 3, 1, {"error_code": 0, "api_keys": [
        {"api_key": k, "min_version": 0, "max_version": v} for k, v in broker.items()]})
    handled = chain.handlers.responses[api_keys.API_VERSIONS].response(
        conn, 3, 3, memoryview(resp))
    assert handled.body is not None
    keys = decode_response(handled.body, api_keys.API_VERSIONS, 3).body["api_keys"]
    assert {k["api_key"]: k["max_version"] for k in keys} == {
        15: 5, 16: 5, 21: 2, 32: 4, 33: 2, 37: 3, 42: 2, 44: 1, 47: 0}


def test_in_front_of_a_virtual_cluster_the_tenants_names_are_checked() -> None:
    """The ACL filter runs first: it checks ``app-1`` (not ``t.app-1``), the backend sees
    the prefixed allowed groups only, the client the merged unprefixed answer."""
    spec = ENTRY_APIS[15]
    chain, conn, _ = _setup("alice", VirtualClusterFilter("t", "t."))
    decision = _decide(chain, conn, _request(spec.request, 5, {"groups": ["app-1", "x"]}))
    assert isinstance(decision, Forward) and decision.then is not None
    assert _sent(spec.request, 5, decision.body)["groups"] == ["t.app-1"]
    broker = _response(spec.response, 5, {"groups": [{"group_id": "t.app-1"}]})
    handled = conn.response(15, 5, 5, memoryview(broker))
    assert handled.body is not None
    got = _got(spec.response, 5, bytes(handled.body))
    assert sorted((g["group_id"], g["error_code"]) for g in got["groups"]) == [
        ("app-1", 0), ("x", 30)]


def test_requests_past_the_checked_versions_are_not_offered() -> None:
    from kproxy.policies.filters.acl_admin import offered
    versions = offered(15)
    assert versions is not None and versions.hi == 5
    for hidden in (29, 30, 31, 48, 49, 50, 51):  # ACL, quota and SCRAM admin APIs
        assert offered(hidden) is None
    # A version past the checked ones (not offered) closes the connection, listings
    # included: the chain closes what its filter does not read.
    chain, conn, _ = _setup("alice")
    for key in (15, 16):
        w = Writer()
        write_request_header(w, RequestHeader(key, 6, 7, "t"))
        assert isinstance(_decide(chain, conn, w.getvalue()), Close)


NEW_SPECS = [ac.ALTER_CONFIGS_REQUEST, ac.ALTER_CONFIGS_RESPONSE,
             ac.INCREMENTAL_ALTER_CONFIGS_REQUEST, ac.INCREMENTAL_ALTER_CONFIGS_RESPONSE]
SPEC_VERSIONS = [(spec, v) for spec in NEW_SPECS for v in range(spec.valid.lo,
                                                                 spec.valid.hi + 1)]


@pytest.mark.parametrize(("spec", "version"), SPEC_VERSIONS,
                         ids=[f"{s.name}-v{v}" for s, v in SPEC_VERSIONS])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_alter_configs_schemas_round_trip_and_agree_with_kio(
        spec: MessageSpec, version: int, data: st.DataObject) -> None:
    from kio.serial import entity_reader
    msg = data.draw(message_strategy(spec, version))
    wire = interpreter.encode(spec, version, msg)
    assert interpreter.decode(spec, version, wire) == msg
    assert interpreter.encode(spec, version, interpreter.decode(spec, version, wire)) == wire
    cls = _kio_class(spec, version)
    assert cls is not None
    sane = interpreter.encode(spec, version, _sane(msg))
    _, end = entity_reader(cls)(sane, 0)
    assert end == len(sane)
