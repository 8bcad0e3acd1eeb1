"""The filter chain and the record-validation filter, without sockets: frames in,
decisions and rewritten frames out."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from kproxy.codecs import api_keys
from kproxy.codecs.compression import DecompressionLimitExceeded, compress
from kproxy.codecs.errors import CodecError
from kproxy.codecs.messages import decode_response, encode_response_parts
from kproxy.codecs.peek import RequestPeek, peek_request
from kproxy.codecs.produce_request import walk
from kproxy.codecs.record_batch import encode_batch, encode_records, iter_records
from kproxy.config import settings
from kproxy.policies.addressing import PortMap
from kproxy.policies.api_versions import default_caps
from kproxy.policies.connection import Answer, Close, ConnectionState, Forward
from kproxy.policies.filters.api import Filter, Versions
from kproxy.policies.filters.chain import DecisionCounts, FilterChain
from kproxy.policies.filters.record_validation import RecordValidation, json_check
from kproxy.policies.handlers import builtin_filters
from kproxy.policies.proxy_state import ProxyState

from ..produce_frames import Topics, produce_body

GOOD, BAD = b'{"id": 1}', b"{not json"


def _conn(chain: FilterChain) -> ConnectionState:
    state = ProxyState(PortMap("proxy.local", 30000, 30000, 0, 1023))
    return ConnectionState(state, chain.handlers, "bootstrap", None, ("10.0.0.9", 1))


def _validation(**kw: Any) -> RecordValidation:
    flt = RecordValidation(topics=["json-*"], value_check=json_check(None), **kw)
    flt.name = "json"
    return flt


def _chain(*filters: Filter) -> tuple[FilterChain, ConnectionState]:
    chain = FilterChain(builtin_filters(), filters, DecisionCounts())
    return chain, _conn(chain)


def _request(conn: ConnectionState, frame: bytes) -> Any:
    view = memoryview(frame)
    return conn.request(peek_request(view), view)


# ----------------------------------------------------------------------------- codecs


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_records_read_from_every_codec(codec: int) -> None:
    batch = encode_batch([(None, GOOD), (b"k", BAD), (None, None)], codec)
    got = [(r.index, r.key and bytes(r.key), r.value and bytes(r.value))
           for r in iter_records(memoryview(batch), 1 << 20)]
    assert got == [(0, None, GOOD), (1, b"k", BAD), (2, None, None)]


def test_a_bomb_is_refused_at_the_bound() -> None:
    zeros = encode_records([(None, b"0" * 4_000_000)])  # the records of a huge batch
    bomb = encode_batch([(None, GOOD)], 4, compressed=compress(4, zeros))
    assert len(bomb) < 10_000
    with pytest.raises(DecompressionLimitExceeded):
        list(iter_records(memoryview(bomb), 1 << 20))


def test_a_malformed_batch_is_a_codec_error() -> None:
    batch = bytearray(encode_batch([(None, GOOD)]))
    batch[-12] = 0x7F  # a record length past the end
    with pytest.raises(CodecError):
        list(iter_records(memoryview(bytes(batch)), 1 << 20))
    with pytest.raises(CodecError, match="magic 1"):
        list(iter_records(memoryview(bytes(batch[:16]) + b"\x01" + bytes(batch[17:])), 99))


@pytest.mark.parametrize("version", [3, 8, 9, 12])
def test_walk_and_rewrite_without_partitions(version: int) -> None:
    topics: Topics = [("a", [(0, encode_batch([(None, GOOD)])), (1, None)]),
                      ("b", [(2, encode_batch([(None, BAD)]))])]
    frame = produce_body(version, 7, topics)
    req = walk(memoryview(frame))
    assert [(t.topic, [p.index for p in t.partitions]) for t in req.topics] == [
        ("a", [0, 1]), ("b", [2])]
    from kproxy.codecs.produce_request import without
    rest = walk(memoryview(without(memoryview(frame), req, {(0, 1), (1, 0)})))
    assert [(t.topic, [p.index for p in t.partitions]) for t in rest.topics] == [("a", [0])]
    assert rest.topics[0].partitions[0].records == topics[0][1][0][1]
    assert without(memoryview(frame), req, set()) == frame


# ----------------------------------------------------------------------------- the filter


def _records(resp: Any) -> list[tuple[str, int, int, list[int]]]:
    return [(t["name"], p["index"], p["error_code"],
             [e["batch_index"] for e in p.get("record_errors", [])])
            for t in resp.body["responses"] for p in t["partition_responses"]]


def test_valid_records_pass_untouched_and_topics_not_matched_are_not_read() -> None:
    chain, conn = _chain(_validation())
    frame = produce_body(9, 1, [("json-a", [(0, encode_batch([(None, GOOD)]))]),
                                ("other", [(0, encode_batch([(None, BAD)]))])])
    assert _request(conn, frame) is None
    assert chain.counts.counts == {("json", "forward"): 1}


def test_all_partitions_invalid_are_answered_here_with_record_errors() -> None:
    chain, conn = _chain(_validation())
    frame = produce_body(9, 5, [("json-a", [(0, encode_batch([(None, GOOD), (None, BAD),
                                                              (None, b"[1,")]))])])
    decision = _request(conn, frame)
    assert isinstance(decision, Answer)
    resp = decode_response(decision.body, api_keys.PRODUCE, 9)
    assert resp.header.correlation_id == 5
    assert _records(resp) == [("json-a", 0, 87, [1, 2])]
    entry = resp.body["responses"][0]["partition_responses"][0]
    assert entry["error_message"].startswith("record 1: value not valid JSON")
    assert chain.counts.counts == {("json", "answer"): 1}


@pytest.mark.parametrize("version", [7, 12])
def test_a_mixed_request_forwards_the_valid_and_merges_the_answer_in_order(
        version: int) -> None:
    _, conn = _chain(_validation())
    good, bad = encode_batch([(None, GOOD)]), encode_batch([(None, BAD)])
    frame = produce_body(version, 9, [("json-a", [(0, bad), (1, good)]),
                                      ("other", [(0, bad)]), ("json-b", [(3, bad)])])
    decision = _request(conn, frame)
    assert isinstance(decision, Forward) and decision.then is not None
    sent = walk(memoryview(decision.body))
    assert [(t.topic, [p.index for p in t.partitions]) for t in sent.topics] == [
        ("json-a", [1]), ("other", [0])]
    # The broker answers the forwarded partitions, in an order of its own.
    broker = encode_response_parts(api_keys.PRODUCE, version, 9, {"responses": [
        {"name": "other", "partition_responses": [{"index": 0, "error_code": 0,
                                                   "base_offset": 40}]},
        {"name": "json-a", "partition_responses": [{"index": 1, "error_code": 0,
                                                    "base_offset": 7}]}],
        "throttle_time_ms": 3})
    assert conn.wants_response(api_keys.PRODUCE, version)
    handled = conn.response(api_keys.PRODUCE, version, version, memoryview(broker))
    assert handled.body is not None
    resp = decode_response(handled.body, api_keys.PRODUCE, version)
    errors = [0] if version >= 8 else []
    assert _records(resp) == [("json-a", 0, 87, errors), ("json-a", 1, 0, []),
                              ("other", 0, 0, []), ("json-b", 3, 87, errors)]
    assert resp.body["throttle_time_ms"] == 3
    assert not conn.follow_ups  # answered: nothing of it is kept


def test_acks_zero_with_an_invalid_record_closes_as_a_broker_does() -> None:
    _, conn = _chain(_validation())
    frame = produce_body(9, 1, [("json-a", [(0, encode_batch([(None, BAD)]))])], acks=0)
    assert isinstance(_request(conn, frame), Close)


def test_schema_violations_keys_and_bombs(tmp_path: Path) -> None:
    (tmp_path / "order.json").write_text(json.dumps({
        "type": "object", "required": ["id"],
        "properties": {"id": {"type": "integer"}}}))
    flt = RecordValidation.from_config({"topics": ["orders"], "value_schema": "order.json",
                                        "key_format": "json",
                                        "max_decompressed_bytes": 100_000}, tmp_path)
    assert flt.check(memoryview(encode_batch([(b'"k"', GOOD)]))) == []
    errors = flt.check(memoryview(encode_batch([(b'"k"', b'{"id": "x"}'), (b"k", GOOD)])))
    assert errors == [(0, "value $.id: 'x' is not of type 'integer'"),
                      (1, "key not valid JSON: Expecting value: line 1 column 1 (char 0)")]
    zeros = encode_records([(None, b"0" * 1_000_000)])
    bomb = encode_batch([(None, GOOD)], 1, compressed=compress(1, zeros))
    [(_, why)] = flt.check(memoryview(bomb))
    assert "expands past the limit of 100000 bytes" in why


def test_produce_v13_is_capped_and_a_v13_request_closes() -> None:
    chain, conn = _chain(_validation())
    assert chain.caps(default_caps())[api_keys.PRODUCE] == 12
    frame = bytearray(produce_body(12, 1, []))
    frame[2:4] = struct.pack(">h", 13)  # the header of a v13 request
    decision = _request(conn, bytes(frame))
    assert isinstance(decision, Close) and decision.event == "filter_version"


# ----------------------------------------------------------------------------- the chain


class Boom(Filter):
    requests = {api_keys.METADATA: Versions(0, 13)}

    def on_request(self, conn: ConnectionState, peek: RequestPeek,
                   body: memoryview) -> None:
        raise RuntimeError("bug")


def test_a_failing_filter_fails_closed_and_is_counted() -> None:
    boom = Boom()
    boom.name = "boom"
    chain, conn = _chain(boom)
    frame = bytes(struct.pack(">hhih", 3, 12, 1, -1) + b"\x01\x00\x00")
    decision = _request(conn, frame)
    assert isinstance(decision, Close) and decision.event == "filter_error"
    assert chain.counts.counts == {("boom", "error"): 1}


def test_apis_no_filter_declares_keep_the_builtin_handlers() -> None:
    plain = FilterChain(builtin_filters(), [])
    chained = FilterChain(builtin_filters(), [_validation()])
    for key, handler in plain.handlers.responses.items():
        assert type(chained.handlers.responses[key]) is type(handler)
    assert api_keys.PRODUCE not in plain.handlers.requests
    assert api_keys.PRODUCE in chained.handlers.requests
    names = [row["name"] for row in chained.describe()]
    assert names == ["json", "kafka-protocol"]


# ----------------------------------------------------------------------------- config


def _load(tmp_path: Path, text: str) -> settings.Config:
    path = tmp_path / "kproxy.toml"
    path.write_text(text)
    return settings.load(env={}, path=str(path))


def test_config_builds_filters_and_user_ones_by_import_path(tmp_path: Path) -> None:
    cfg = _load(tmp_path, """
default_filters = ["json", "gate"]
[[filters]]
name = "json"
type = "record-validation"
topics = ["json-*"]
value_format = "json"
[[filters]]
name = "gate"
type = "tests.user_filters:ClientIdGate"
refuse = "blocked"
""")
    chain = cfg.filters.main_chain()
    assert [(f.name, f.kind) for f in chain] == [
        ("json", "record-validation"), ("gate", "tests.user_filters:ClientIdGate")]


@pytest.mark.parametrize(("text", "key"), [
    ('[[filters]]\nname = "x"\ntype = "nope"\n', "filters.x.type: unknown type"),
    ('[[filters]]\nname = "x"\ntype = "no.such.module:F"\n', "filters.x.type: cannot import"),
    ('[[filters]]\nname = "x"\ntype = "record-validation"\nvalue_format = "json"\n',
     "filters.x.topics:"),
    ('[[filters]]\nname = "x"\ntype = "record-validation"\ntopics = ["t"]\n'
     'value_schema = "missing.json"\n', "filters.x.value_schema: cannot read"),
    ('[[filters]]\nname = "x"\ntype = "record-validation"\ntopics = ["t"]\n'
     'value_format = "avro"\n', "filters.x.value_format:"),
    ('[[filters]]\nname = "x"\ntype = "record-validation"\ntopics = ["t"]\n'
     'value_format = "json"\ncolour = 1\n', "filters.x.colour: unknown key"),
    ('default_filters = ["y"]\n', "default_filters: no filter named 'y'"),
    ('[[filters]]\ntype = "record-validation"\n', "filters[0].name"),
    ('[[virtual_clusters]]\nname = "a"\n', "virtual_clusters.a.prefix:"),
])
def test_a_bad_filter_config_names_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(settings.ConfigError, match=key.replace("[", r"\[").replace(
            "]", r"\]").replace(".", r"\.")):
        _load(tmp_path, text)


def test_a_schema_that_is_no_schema_is_refused(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text('{"type": 12}')
    with pytest.raises(settings.ConfigError, match="not a valid JSON Schema"):
        _load(tmp_path, '[[filters]]\nname = "x"\ntype = "record-validation"\n'
              'topics = ["t"]\nvalue_schema = "s.json"\n')
