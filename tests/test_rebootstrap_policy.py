"""Epoch logic and the Metadata v12 -> v13 bridge, as pure functions, byte-exact."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from kproxy.codecs import api_keys
from kproxy.codecs.messages import decode_request, decode_response, encode_response_parts
from kproxy.policies.api_versions import bridge_metadata_version
from kproxy.policies.metadata_bridge import (
    advertised_metadata_max,
    downgrade_request,
    needs_bridge,
)
from kproxy.policies.rebootstrap import REBOOTSTRAP_REQUIRED, Action, RebootstrapPolicy

VECTORS = Path(__file__).parent / "vectors" / "confluent-kafka.jsonl"


def _vector(api: str, direction: str) -> bytes:
    for line in VECTORS.read_text().splitlines():
        row = json.loads(line)
        if row["api_name"] == api and row["direction"] == direction:
            return bytes.fromhex(row["hex"])
    raise AssertionError(f"no {api} {direction} vector")


def test_a_client_is_told_once_then_answered_normally() -> None:
    p = RebootstrapPolicy()
    key = ("10.0.0.1", "app")
    assert p.metadata_response(key, p.epoch_for_new_connection(key), 13) == (Action.NONE, 0)
    p.bump(3)
    assert p.metadata_response(key, 0, 13) == (Action.INJECT, 3)
    assert p.metadata_response(key, 3, 13) == (Action.NONE, 3)


def test_a_reconnecting_client_inherits_its_stale_epoch_a_new_one_does_not() -> None:
    p = RebootstrapPolicy()
    old = ("10.0.0.1", "app")
    p.remember(old, 0)
    p.bump(1)
    assert p.epoch_for_new_connection(old) == 0  # same client, new connection: still stale
    assert p.epoch_for_new_connection(("10.0.0.2", "new")) == 1  # never saw the old view


def test_legacy_clients_close_or_ignore() -> None:
    for policy, action in (("close", Action.CLOSE), ("ignore", Action.IGNORE)):
        p = RebootstrapPolicy(legacy_clients=policy)
        p.bump(1)
        assert p.metadata_response(("h", "c"), 0, 12)[0] is action


def test_client_memory_is_bounded() -> None:
    p = RebootstrapPolicy(max_clients=10)
    for i in range(100):
        p.remember((f"10.0.0.{i}", "c"), 0)
    assert len(p._seen) == 10


def test_v13_offered_only_over_a_v12_backend() -> None:
    assert advertised_metadata_max(12) == 13
    assert advertised_metadata_max(13) == 13 and advertised_metadata_max(14) == 14
    assert advertised_metadata_max(9) == 9  # v10/v11 bodies differ: no bridge
    assert needs_bridge(13, 12) and not needs_bridge(13, 13) and not needs_bridge(12, 12)
    body = {"error_code": 0, "api_keys": [{"api_key": 3, "min_version": 0, "max_version": 12}]}
    assert bridge_metadata_version(body) == 12
    assert body["api_keys"][0]["max_version"] == 13


def test_request_downgrade_is_byte_exact() -> None:
    v12 = _vector("Metadata", "request")  # librdkafka's real v12 request to tansu
    assert struct.unpack_from(">h", v12, 2)[0] == 12
    as_v13 = v12[:2] + struct.pack(">h", 13) + v12[4:]
    assert decode_request(as_v13).body == decode_request(v12).body  # same body at v13
    assert downgrade_request(as_v13) == v12


def test_response_bridge_adds_only_the_top_level_error_code() -> None:
    v12 = _vector("Metadata", "response")
    resp = decode_response(v12, api_keys.METADATA, 12)
    for code in (0, REBOOTSTRAP_REQUIRED):
        v13 = encode_response_parts(api_keys.METADATA, 13, resp.header.correlation_id,
                                    {**resp.body, "error_code": code})
        # v13 = the v12 bytes with an int16 before the final (empty) tagged-field section.
        assert v13 == v12[:-1] + struct.pack(">h", code) + v12[-1:]
        assert decode_response(v13, api_keys.METADATA, 13).body["error_code"] == code
