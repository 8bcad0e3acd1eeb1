"""Per-partition ACL answers for the data APIs, every version, through the real codec:
the forwarded request holds exactly the allowed topics, the merged response every
requested partition exactly once with the right error, and the all-denied request is
answered without the broker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kproxy.codecs.interpreter import decode_from
from kproxy.policies.connection import Answer, Forward
from kproxy.policies.filters.acl_apis import APIS

from .test_acl_filter import _after_header, _call, _encoded, _frame, _resp, _setup

Msg = dict[str, Any]
Topics = list[tuple[str, list[int]]]
ALLOWED = ("orders", "orders-2")  # alice may READ (and so DESCRIBE) orders*
DENIED = ("payments", "zz")
TAIL = b"\x00\x07\x01"  # bytes after the body travel as sent
TXN = {"transactional_id": "tx-1", "group_id": "app-1", "producer_id": 1,
       "producer_epoch": 0}


def _fetch(topics: Topics, v: int) -> Msg:
    return {"max_wait_ms": 100, "min_bytes": 1, "topics": [
        {"topic": n, "partitions": [{"partition": p, "fetch_offset": 5} for p in ps]}
        for n, ps in topics]}


def _fetch_resp(topics: Topics, v: int) -> Msg:
    return {"session_id": 0, "responses": [
        {"topic": n, "partitions": [{"partition_index": p, "error_code": 0,
                                     "high_watermark": 9, "records": b""} for p in ps]}
        for n, ps in topics]}


def _commit_topics(topics: Topics) -> list[Msg]:
    return [{"name": n, "partitions": [{"partition_index": p, "committed_offset": 3}
                                       for p in ps]} for n, ps in topics]


def _named(topics: Topics, v: int, index: str = "partition_index",
           extra: Msg | None = None) -> Msg:
    """A response of ``topics`` / ``name`` / ``partitions`` / ``index`` entries."""
    return {"topics": [{"name": n, "partitions": [{index: p, "error_code": 0, **(extra or {})}
                                                  for p in ps]} for n, ps in topics]}


def _offset_fetch(topics: Topics, v: int) -> Msg:
    named = [{"name": n, "partition_indexes": ps} for n, ps in topics]
    if v >= 8:
        return {"groups": [{"group_id": "app-1", "topics": named}]}
    return {"group_id": "app-1", "topics": named}


def _offset_fetch_resp(topics: Topics, v: int) -> Msg:
    body = _named(topics, v, extra={"committed_offset": 42})
    return {"groups": [{"group_id": "app-1", **body}]} if v >= 8 else body


# key -> (request from topics, broker response for topics, response topic array, name,
#         partition index)
CASES: dict[int, tuple[Callable[[Topics, int], Msg], Callable[[Topics, int], Msg], str,
                       str, str]] = {
    1: (_fetch, _fetch_resp, "responses", "topic", "partition_index"),
    2: (lambda t, v: {"replica_id": -1, "topics": [
        {"name": n, "partitions": [{"partition_index": p, "timestamp": -1} for p in ps]}
        for n, ps in t]}, lambda t, v: _named(t, v, extra={"offset": 7}), "topics", "name",
        "partition_index"),
    23: (lambda t, v: {"topics": [
        {"topic": n, "partitions": [{"partition": p, "leader_epoch": 1} for p in ps]}
        for n, ps in t]}, lambda t, v: {"topics": [
            {"topic": n, "partitions": [{"partition": p, "error_code": 0, "end_offset": 7}
                                        for p in ps]} for n, ps in t]},
        "topics", "topic", "partition"),
    8: (lambda t, v: {"group_id": "app-1", "topics": _commit_topics(t)}, _named, "topics",
        "name", "partition_index"),
    28: (lambda t, v: {**TXN, "topics": _commit_topics(t)}, _named, "topics", "name",
         "partition_index"),
    9: (_offset_fetch, _offset_fetch_resp, "topics", "name", "partition_index"),
}
VERSIONS = [(key, v) for key in CASES for v in range(APIS[key].versions.lo,
                                                     APIS[key].versions.hi + 1)]


def _entries(key: int, version: int, body: Msg) -> list[tuple[str, int, int]]:
    """(topic, partition, error) of every partition in a response."""
    _, _, out, name, index = CASES[key]
    containers = body["groups"] if key == 9 and version >= 8 else [body]
    return [(t[name], p[index], p["error_code"]) for c in containers for t in c[out]
            for p in t["partitions"]]


def _sent(key: int, version: int, body: bytes) -> Msg:
    return decode_from(APIS[key].request, version, _after_header(body))


def _sent_topics(key: int, version: int, sent: Msg) -> Topics:
    name = CASES[key][3]
    containers = sent["groups"] if key == 9 and version >= 8 else [sent]
    out = []
    for c in containers:
        for t in c["topics"]:
            parts = t.get("partition_indexes") or t.get("partitions") or []
            out.append((t[name], [p if isinstance(p, int) else
                                  p.get("partition", p.get("partition_index")) for p in parts]))
    return out


TOPICS = st.lists(st.tuples(st.sampled_from(ALLOWED + DENIED),
                            st.lists(st.integers(0, 7), min_size=1, max_size=3, unique=True)),
                  min_size=1, max_size=4, unique_by=lambda t: t[0])


@pytest.mark.parametrize(("key", "version"), VERSIONS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topics=TOPICS)
def test_denied_topics_answered_here_and_the_rest_forwarded(key: int, version: int,
                                                            topics: Topics) -> None:
    flt, conn, denials = _setup()
    request, broker, *_ = CASES[key]
    frame = _frame(key, version, request(topics, version)) + TAIL
    allowed = [t for t in topics if t[0] in ALLOWED]
    expected = sorted((n, p, 0 if n in ALLOWED else 29) for n, ps in topics for p in ps)
    decision = _call(flt, conn, frame)
    if len(allowed) == len(topics):
        assert decision is None
        return
    assert {d["name"] for d in denials} == {n for n, _ in topics if n in DENIED}
    if not allowed:
        assert isinstance(decision, Answer)
        merged = _resp(key, version, decision.body)
    else:
        assert isinstance(decision, Forward) and decision.then is not None
        assert decision.body.endswith(TAIL)
        assert _sent_topics(key, version, _sent(key, version, decision.body)) == allowed
        reply = _encoded(key, version, broker(allowed, version))
        merged = _resp(key, version, decision.then(memoryview(reply), version))
    got = _entries(key, version, merged)
    assert sorted(got) == expected and len(got) == len(expected)


@pytest.mark.parametrize("version", range(4, 13))
def test_fetch_denied_entry_shape_and_a_local_answer(version: int) -> None:
    flt, conn, _ = _setup()
    decision = _call(flt, conn, _frame(1, version, _fetch([("zz", [0, 1])], version)))
    assert isinstance(decision, Answer)
    body = _resp(1, version, decision.body)
    assert (body.get("error_code", 0), body.get("session_id", 0)) == (0, 0)
    for p in body["responses"][0]["partitions"]:
        assert (p["error_code"], p["high_watermark"], p["records"]) == (29, -1, b"")
        assert p.get("last_stable_offset", -1) == p.get("log_start_offset", -1) == -1
        assert p.get("preferred_read_replica", -1) == -1


@pytest.mark.parametrize("version", [7, 10, 12])
def test_incremental_fetch_strips_denied_and_forgotten_and_still_forwards(
        version: int) -> None:
    flt, conn, _ = _setup()
    req = {**_fetch([("payments", [0])], version), "session_id": 77, "session_epoch": 3,
           "forgotten_topics_data": [{"topic": "zz", "partitions": [1]},
                                     {"topic": "orders", "partitions": [2]}]}
    decision = _call(flt, conn, _frame(1, version, req))
    assert isinstance(decision, Forward) and decision.then is not None  # keeps the epoch
    sent = _sent(1, version, decision.body)
    assert (sent["session_id"], sent["session_epoch"], sent["topics"]) == (77, 3, [])
    assert [t["topic"] for t in sent["forgotten_topics_data"]] == ["orders"]
    # The broker's session answers for a partition the request did not name.
    reply = _encoded(1, version, {**_fetch_resp([("orders", [0])], version), "session_id": 77})
    merged = _resp(1, version, decision.then(memoryview(reply), version))
    assert merged["session_id"] == 77
    assert sorted(_entries(1, version, merged)) == [("orders", 0, 0), ("payments", 0, 29)]
    # A session error is the broker's whole answer: nothing is added to it.
    reply = _encoded(1, version, {"error_code": 71, "session_id": 0, "responses": []})
    assert _entries(1, version, _resp(1, version, decision.then(memoryview(reply),
                                                                 version))) == []


def test_fetch_forgetting_only_denied_topics_is_unchanged_when_nothing_else_is() -> None:
    flt, conn, _ = _setup()
    req = {**_fetch([("orders", [0])], 12), "session_id": 5, "session_epoch": 1,
           "forgotten_topics_data": [{"topic": "zz", "partitions": [0]}]}
    decision = _call(flt, conn, _frame(1, 12, req))
    assert isinstance(decision, Forward)
    sent = _sent(1, 12, decision.body)
    assert sent["forgotten_topics_data"] == [] and len(sent["topics"]) == 1


def test_follower_fetch_is_whole_cluster_action_answered_with_29() -> None:
    flt, conn, _ = _setup()
    decision = _call(flt, conn, _frame(1, 11, {**_fetch([("orders", [0])], 11),
                                               "replica_id": 1}))
    assert isinstance(decision, Answer)
    assert _entries(1, 11, _resp(1, 11, decision.body)) == [("orders", 0, 29)]


@pytest.mark.parametrize(("key", "version", "body", "error"), [
    (8, 9, {"group_id": "nope", "topics": _commit_topics([("orders", [0]), ("zz", [1])])},
     30),
    (28, 3, {**TXN, "transactional_id": "nope",
             "topics": _commit_topics([("orders", [0]), ("zz", [1])])}, 53),
    (28, 0, {**TXN, "group_id": "nope",
             "topics": _commit_topics([("orders", [0]), ("zz", [1])])}, 30),
])
def test_commits_refused_whole_for_group_or_transactional_id(key: int, version: int,
                                                             body: Msg, error: int) -> None:
    flt, conn, _ = _setup()
    decision = _call(flt, conn, _frame(key, version, body))
    assert isinstance(decision, Answer)
    assert _entries(key, version, _resp(key, version, decision.body)) == [
        ("orders", 0, error), ("zz", 1, error)]


@pytest.mark.parametrize("version", [2, 7, 8, 9])
def test_offset_fetch_all_topics_hides_undescribable_ones(version: int) -> None:
    flt, conn, _ = _setup()
    req = {"groups": [{"group_id": "app-1", "topics": None}]} if version >= 8 else {
        "group_id": "app-1", "topics": None}
    frame = _frame(9, version, req)
    decision = _call(flt, conn, frame)
    assert isinstance(decision, Forward) and decision.then is not None
    assert decision.body == frame
    reply = _encoded(9, version, _offset_fetch_resp([("orders", [0]), ("zz", [0, 1])],
                                                    version))
    merged = _resp(9, version, decision.then(memoryview(reply), version))
    assert _entries(9, version, merged) == [("orders", 0, 0)]


@pytest.mark.parametrize("version", [8, 9])
def test_batched_offset_fetch_per_group(version: int) -> None:
    flt, conn, _ = _setup()
    req = {"groups": [{"group_id": "x", "topics": None},
                      {"group_id": "app-1", "topics": [
                          {"name": "orders", "partition_indexes": [0]},
                          {"name": "zz", "partition_indexes": [3]}]},
                      {"group_id": "app-2", "topics": [
                          {"name": "zz", "partition_indexes": [1]}]}]}
    decision = _call(flt, conn, _frame(9, version, req))
    assert isinstance(decision, Forward) and decision.then is not None
    sent = _sent(9, version, decision.body)
    assert [(g["group_id"], [t["name"] for t in g["topics"]]) for g in sent["groups"]] == [
        ("app-1", ["orders"]), ("app-2", [])]
    reply = _encoded(9, version, {"groups": [
        {"group_id": "app-1", "topics": [{"name": "orders", "partitions": [
            {"partition_index": 0, "committed_offset": 5}]}]},
        {"group_id": "app-2", "topics": []}]})
    merged = _resp(9, version, decision.then(memoryview(reply), version))
    assert sorted((g["group_id"], g["error_code"], [
        (t["name"], [(p["partition_index"], p["error_code"], p["committed_offset"])
                     for p in t["partitions"]]) for t in g["topics"]])
        for g in merged["groups"]) == [
        ("app-1", 0, [("orders", [(0, 0, 5)]), ("zz", [(3, 29, -1)])]),
        ("app-2", 0, [("zz", [(1, 29, -1)])]),
        ("x", 30, [])]
    only_denied = {"groups": [{"group_id": "x", "topics": None}]}
    decision = _call(flt, conn, _frame(9, version, only_denied))
    assert isinstance(decision, Answer)
    assert [(g["group_id"], g["error_code"]) for g in _resp(9, version,
                                                            decision.body)["groups"]] == [
        ("x", 30)]


def test_offset_fetch_group_error_from_the_broker_is_left_alone() -> None:
    flt, conn, _ = _setup()
    decision = _call(flt, conn, _frame(9, 7, _offset_fetch([("orders", [0]), ("zz", [0])], 7)))
    assert isinstance(decision, Forward) and decision.then is not None
    reply = _encoded(9, 7, {"error_code": 16, "topics": []})  # NOT_COORDINATOR
    merged = _resp(9, 7, decision.then(memoryview(reply), 7))
    assert (merged["error_code"], merged["topics"]) == (16, [])
