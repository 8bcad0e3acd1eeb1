"""Epoch logic and the Metadata v12 -> v13 bridge, driven through the sans-IO
connection state with real captured frames: no sockets."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from kproxy.codecs import api_keys
from kproxy.codecs.messages import decode_request, decode_response, encode_response_parts
from kproxy.codecs.peek import peek_request
from kproxy.policies.addressing import BrokerAddress, PortMap
from kproxy.policies.api_versions import bridge_metadata_version
from kproxy.policies.connection import ConnectionState, Forward
from kproxy.policies.handlers import standard_handlers
from kproxy.policies.metadata_bridge import (
    advertised_metadata_max,
    downgrade_request,
    needs_bridge,
)
from kproxy.policies.proxy_state import ProxyState
from kproxy.policies.rebootstrap import REBOOTSTRAP_REQUIRED, Action, metadata_action

VECTORS = Path(__file__).parent.parent / "vectors" / "confluent-kafka.jsonl"


def _vector(api: str, direction: str) -> bytes:
    for line in VECTORS.read_text().splitlines():
        row = json.loads(line)
        if row["api_name"] == api and row["direction"] == direction:
            return bytes.fromhex(row["hex"])
    raise AssertionError(f"no {api} {direction} vector")


def test_metadata_action_tells_a_stale_connection_by_its_version() -> None:
    assert metadata_action(3, 3, 13, "close") is Action.NONE
    assert metadata_action(2, 3, 13, "close") is Action.INJECT
    assert metadata_action(2, 3, 12, "close") is Action.CLOSE
    assert metadata_action(2, 3, 12, "ignore") is Action.IGNORE


def _state() -> ProxyState:
    return ProxyState(PortMap("proxy.local", 30000, 30000, 0, 1023), "close", False,
                      [("10.0.0.1", 9092)])


def _conn(state: ProxyState, node_id: int | None = None) -> ConnectionState:
    return ConnectionState(state, standard_handlers(), "bootstrap", node_id, ("10.0.0.9", 1))


def _metadata(conn: ConnectionState, version: int = 13) -> int:
    """One Metadata exchange through the connection state; the error code the client got."""
    request = _vector("Metadata", "request")
    request = request[:2] + struct.pack(">h", version) + request[4:]
    decision = conn.request(peek_request(request), memoryview(request))
    assert isinstance(decision, Forward | None)
    upstream_version = version if decision is None else decision.upstream_version
    handled = conn.response(api_keys.METADATA, version, upstream_version,
                            memoryview(_vector("Metadata", "response")))
    assert handled.body is not None
    return int(decode_response(handled.body, api_keys.METADATA, version).body.get(
        "error_code", 0))


def test_a_connection_is_told_once_then_answered_normally() -> None:
    state = _state()
    conn = _conn(state)
    assert _metadata(conn) == 0
    state.view.force("operator")
    assert _metadata(conn) == REBOOTSTRAP_REQUIRED  # once...
    assert _metadata(conn) == 0  # ...then normal responses


def test_one_rebootstrap_per_change() -> None:
    """A connection opened after a change, or whose first Metadata comes after it, was
    bootstrapped after the change: telling it again would make it bootstrap twice."""
    state = _state()
    before = _conn(state)  # open, no Metadata yet
    state.view.force("operator")
    after = _conn(state)
    assert _metadata(after) == 0
    assert _metadata(before) == 0


def test_a_change_closes_connections_to_a_backend_that_is_gone() -> None:
    state = _state()
    bootstrap, broker, legacy = _conn(state), _conn(state, node_id=1), _conn(state)
    bootstrap.connected(("10.0.0.1", 9092))
    broker.connected(("10.0.0.7", 9092))
    legacy.connected(("10.0.0.1", 9092))
    assert _metadata(legacy, 12) == 0
    state.view.observe({1: BrokerAddress("10.0.0.7", 9092)}, "c1", True)
    moved = state.view.observe({1: BrokerAddress("10.0.0.8", 9092)}, "c1", True)
    assert moved is not None
    assert broker.on_change(moved) == "upstream_gone"
    assert bootstrap.on_change(moved) is None  # told in its next Metadata response
    assert legacy.on_change(moved) == "legacy_closed"  # below v13: cannot be told
    assert _conn(state, node_id=1).on_change(moved) is None  # opened after it
    state.upstream_servers = [("10.0.0.2", 9092)]
    relisted = state.view.force("upstream_reconfigured")
    assert bootstrap.on_change(relisted) == "upstream_gone"


def test_a_legacy_connection_still_connecting_at_a_change_is_not_closed() -> None:
    """A legacy client that reconnected just before a reload landed (at 2 workers the
    other worker may not have reloaded yet) and whose Metadata request waits on the
    connect: it will reach a current server, so it is neither closed nor told."""
    state = _state()
    state.upstream_servers = [("10.0.0.1", 9092)]
    state.view.observe({1: BrokerAddress("10.0.0.7", 9092)}, "c1", True)
    connecting = _conn(state)
    request = _vector("Metadata", "request")
    request = request[:2] + struct.pack(">h", 12) + request[4:]
    connecting.request(peek_request(request), memoryview(request))
    assert connecting.metadata_version == 12  # a legacy client, its request held
    state.upstream_servers = [("10.0.0.2", 9092)]  # the reload, its discovery's change:
    swapped = state.view.observe({1: BrokerAddress("10.0.0.9", 9092)}, "other", True)
    assert swapped is not None and swapped.cluster_id is not None
    assert connecting.on_change(swapped) is None
    assert connecting.connected(("10.0.0.2", 9092)) is True  # reached the new list
    late = _conn(state)
    # A connect begun before the reload that completes to the dropped server is refused.
    assert late.connected(("10.0.0.1", 9092)) is False
    assert _conn(state, node_id=1).connected(("10.0.0.9", 9092)) is True


def test_a_connection_that_reached_the_new_list_before_its_change_is_current() -> None:
    """The window of a reload: the new list is set, discovery through it is still in
    flight. A legacy client reconnecting then reaches the new list's backend and reads
    its first Metadata answer from it; when discovery's change lands, that connection
    is neither closed nor told (it would bootstrap twice for one swap), and its later
    answers are current."""
    state = _state()
    state.view.observe({1: BrokerAddress("10.0.0.7", 9092)}, "c1", True)
    state.reconfigure("close", False, [("10.0.0.2", 9092)])  # set_config, before discovery
    window = _conn(state)
    assert window.connected(("10.0.0.2", 9092)) is True
    assert _metadata(window, 12) == 0 and window.metadata_version == 12
    before = _conn(state)  # opened before the reload, on the old list's server
    before.upstream = ("10.0.0.1", 9092)
    swapped = state.view.observe({1: BrokerAddress("10.0.0.9", 9092)}, "other", True)
    assert swapped is not None and swapped.cluster_id is not None
    assert window.on_change(swapped) is None
    assert before.on_change(swapped) == "upstream_gone"
    request = _vector("Metadata", "request")
    request = request[:2] + struct.pack(">h", 12) + request[4:]
    window.request(peek_request(request), memoryview(request))
    handled = window.response(api_keys.METADATA, 12, 12,
                              memoryview(_vector("Metadata", "response")))
    assert handled.rebootstrap is Action.NONE and not handled.close_after
    # A later change is news to it, as to everyone.
    later = state.view.force("operator")
    assert window.on_change(later) == "legacy_closed"


def test_a_connection_ended_by_a_change_is_not_also_told_by_its_answer_in_flight() -> None:
    """A legacy connection to the old cluster with a Metadata request in flight when the
    swap lands: it is ended as ``upstream_gone``; the answer it awaited is relayed, but
    not counted (and closed) a second time as ``legacy_closed``, nor told at v13."""
    for version in (12, 13):
        state = _state()
        state.view.observe({1: BrokerAddress("10.0.0.7", 9092)}, "c1", True)
        conn = _conn(state)
        assert conn.connected(("10.0.0.1", 9092)) is True
        assert _metadata(conn, version) == 0
        request = _vector("Metadata", "request")
        request = request[:2] + struct.pack(">h", version) + request[4:]
        conn.request(peek_request(request), memoryview(request))  # in flight ...
        state.reconfigure("close", False, [("10.0.0.2", 9092)])
        swapped = state.view.observe({1: BrokerAddress("10.0.0.9", 9092)}, "other", True)
        assert swapped is not None
        assert conn.on_change(swapped) == "upstream_gone"
        handled = conn.response(api_keys.METADATA, version, min(version, 12),  # ... answered
                                memoryview(_vector("Metadata", "response")))
        assert handled.rebootstrap is Action.NONE and not handled.close_after


def test_legacy_clients_are_closed_after_their_response_or_ignored() -> None:
    for policy, close_after in (("close", True), ("ignore", False)):
        state = _state()
        state.legacy_clients = policy
        conn = _conn(state)
        assert _metadata(conn, 12) == 0
        state.view.force("operator")
        request = _vector("Metadata", "request")
        conn.request(peek_request(request), memoryview(request))
        handled = conn.response(api_keys.METADATA, 12, 12,
                                memoryview(_vector("Metadata", "response")))
        assert handled.close_after is close_after
        assert handled.rebootstrap is (Action.CLOSE if close_after else Action.IGNORE)


def test_v13_offered_only_over_a_v12_backend() -> None:
    assert advertised_metadata_max(12) == 13
    assert advertised_metadata_max(13) == 13 and advertised_metadata_max(14) == 14
    assert advertised_metadata_max(9) == 9  # v10/v11 bodies differ: no bridge
    assert needs_bridge(13, 12) and not needs_bridge(13, 13) and not needs_bridge(12, 12)
    body: dict[str, Any] = {"error_code": 0,
                            "api_keys": [{"api_key": 3, "min_version": 0, "max_version": 12}]}
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
