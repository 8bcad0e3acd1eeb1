"""ApiVersions answers remembered: a backend's repeated answer is rewritten once.

The answer a connection gets must be byte for byte what a full decode, cap and encode
makes of the backend's answer, with the connection's own correlation id, whatever was
answered before it; a reload's new caps must show at once; and what is remembered is
bounded however many different answers a backend gives.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from kproxy.codecs import api_keys
from kproxy.codecs.messages import decode_response, encode_response_parts
from kproxy.policies import api_versions
from kproxy.policies.addressing import PortMap
from kproxy.policies.api_versions import MAX_ANSWERS, default_caps
from kproxy.policies.connection import ConnectionState
from kproxy.policies.handlers import standard_handlers
from kproxy.policies.proxy_state import ProxyState

VECTORS = Path(__file__).parents[1] / "vectors" / "confluent-kafka.jsonl"


def backend_answer() -> tuple[int, bytes]:
    """(version, bytes) of a real broker's ApiVersions answer, captured."""
    for line in VECTORS.read_text().splitlines():
        v = json.loads(line)
        if v["api_key"] == api_keys.API_VERSIONS and v["direction"] == "response":
            return v["api_version"], bytes.fromhex(v["hex"])
    raise AssertionError("no ApiVersions answer among the vectors")


def with_correlation_id(answer: bytes, correlation_id: int) -> bytes:
    return struct.pack(">i", correlation_id) + answer[4:]


def answer_through(state: ProxyState, version: int, answer: bytes) -> bytes:
    """What a new connection's client gets for ``answer`` (the body after the size)."""
    conn = ConnectionState(state, standard_handlers(), "bootstrap", None, ("10.0.0.9", 1))
    handled = standard_handlers().responses[api_keys.API_VERSIONS].response(
        conn, version, version, memoryview(answer))
    assert handled.body is not None
    assert conn.backend_metadata_max is not None  # learnt on every connection, hit or miss
    return bytes(handled.body)


def fresh_state() -> ProxyState:
    return ProxyState(PortMap("p", 30000, 30000, 0, 10), served_apis={72: (0, 0), 71: (0, 0)})


def test_a_remembered_answer_is_what_a_full_rewrite_makes() -> None:
    version, answer = backend_answer()
    state = fresh_state()
    for cid in (1, 7, 2**31 - 1, -5):
        mine = with_correlation_id(answer, cid)
        got = answer_through(state, version, mine)
        assert got == answer_through(fresh_state(), version, mine)  # nothing remembered
        assert decode_response(memoryview(got), api_keys.API_VERSIONS,
                               version).header.correlation_id == cid
    assert len(state.api_versions_answers) == 1


def test_new_caps_after_a_reload_show_at_once() -> None:
    version, answer = backend_answer()
    state = fresh_state()
    before = decode_response(memoryview(answer_through(state, version, answer)),
                             api_keys.API_VERSIONS, version).body
    produce_max = {e["api_key"]: e["max_version"] for e in before["api_keys"]}[0]
    state.api_caps = {**default_caps(), api_keys.PRODUCE: produce_max - 1}  # a reload
    after = decode_response(memoryview(answer_through(state, version, answer)),
                            api_keys.API_VERSIONS, version).body
    assert {e["api_key"]: e["max_version"] for e in after["api_keys"]}[0] == produce_max - 1


def test_what_is_remembered_is_bounded() -> None:
    version, answer = backend_answer()
    state = fresh_state()
    body = decode_response(memoryview(answer), api_keys.API_VERSIONS, version).body
    for throttle in range(3 * MAX_ANSWERS):  # a backend answering differently each time
        body["throttle_time_ms"] = throttle
        answer_through(state, version, encode_response_parts(api_keys.API_VERSIONS, version,
                                                             1, body))
        assert len(state.api_versions_answers) <= MAX_ANSWERS
    huge = {**body, "api_keys": body["api_keys"] * (api_versions.MAX_ANSWER_BYTES // 40)}
    kept = len(state.api_versions_answers)
    answer_through(state, version, encode_response_parts(api_keys.API_VERSIONS, version, 1,
                                                         huge))
    assert len(state.api_versions_answers) == kept
